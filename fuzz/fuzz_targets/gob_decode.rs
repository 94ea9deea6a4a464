//! Fuzz the gob decoder: any bytes, decoded as the interface-typed Argo arguments and skipped
//! generically, must give a value or an error — never a panic, hang or unbounded allocation.
#![no_main]

use bytes::BytesMut;
use dispatch_metric_provider::rollouts::{RunArgs, TerminateAndResumeArgs};
use dispatch_plugin::gob::Decoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut dec = Decoder::new().with_max_message(1 << 20);
    let mut buf = BytesMut::from(data);
    for _ in 0..16 {
        let before = buf.len();
        let _ = dec.decode_interface::<RunArgs>(&mut buf, "RunArgs");
        if buf.len() == before {
            break;
        }
    }
    let mut buf = BytesMut::from(data);
    let mut dec = Decoder::new().with_max_message(1 << 20);
    let _ = dec.decode_interface::<TerminateAndResumeArgs>(&mut buf, "TerminateAndResumeArgs");
    let mut buf = BytesMut::from(data);
    let _ = Decoder::new().with_max_message(1 << 20).skip(&mut buf);
});
