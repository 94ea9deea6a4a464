//! Fuzz the net/rpc request stream as the plugin reads it: a header, then a body chosen by the
//! method, repeated; corrupt input must end in an error, never a panic.
#![no_main]

use bytes::BytesMut;
use dispatch_metric_provider::rollouts::{GarbageCollectArgs, RunArgs, TerminateAndResumeArgs};
use dispatch_plugin::gob::{self, Decoder};
use dispatch_plugin::rpc::Request;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut dec = Decoder::new().with_max_message(1 << 20);
    let mut buf = BytesMut::from(data);
    for _ in 0..32 {
        let req = match dec.decode::<Request>(&mut buf) {
            Ok(r) => r,
            Err(_) => return,
        };
        let body: Result<(), gob::Error> = match req.service_method.as_str() {
            "Plugin.Run" => dec
                .decode_interface::<RunArgs>(&mut buf, "RunArgs")
                .map(drop),
            "Plugin.Resume" | "Plugin.Terminate" => dec
                .decode_interface::<TerminateAndResumeArgs>(&mut buf, "TerminateAndResumeArgs")
                .map(drop),
            "Plugin.GarbageCollect" => dec
                .decode_interface::<GarbageCollectArgs>(&mut buf, "GarbageCollectArgs")
                .map(drop),
            "Dispenser.Dispense" => dec.decode::<String>(&mut buf).map(drop),
            "Control.Ping" | "Control.Quit" => dec.decode::<bool>(&mut buf).map(drop),
            _ => dec.skip(&mut buf),
        };
        if matches!(body, Err(gob::Error::Incomplete)) {
            return;
        }
    }
});
