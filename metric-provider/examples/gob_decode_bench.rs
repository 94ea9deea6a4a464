//! Measures decoding of realistic `Plugin.Run` calls (header + RunArgs body) once the stream's
//! types are known, for `make bench-plugin`. Usage: `gob_decode_bench FILE [ITERATIONS]` where FILE
//! is `bench_stream.gob` from the golden vectors. Prints `ns_per_op=<float>` last.

use std::time::Instant;

use bytes::BytesMut;
use dispatch_metric_provider::rollouts::{names, RunArgs};
use dispatch_plugin::gob::Decoder;
use dispatch_plugin::rpc::Request;

fn decode_call(dec: &mut Decoder, buf: &mut BytesMut) -> RunArgs {
    let req: Request = dec.decode(buf).expect("request header");
    assert_eq!(req.service_method, "Plugin.Run");
    dec.decode_interface::<RunArgs>(buf, names::RUN_ARGS)
        .expect("body")
        .expect("RunArgs")
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: gob_decode_bench FILE [ITERATIONS]");
    let iterations: usize = args
        .next()
        .map(|n| n.parse().expect("a number"))
        .unwrap_or(50);
    let stream = std::fs::read(&path).expect("read the stream file");
    let mut dec = Decoder::new();
    let mut buf = BytesMut::from(&stream[..]);
    decode_call(&mut dec, &mut buf); // the first call carries every type definition
    let rest = buf.freeze();
    let mut per_pass = 0usize;
    let mut check = BytesMut::from(&rest[..]);
    while !check.is_empty() {
        decode_call(&mut dec, &mut check);
        per_pass += 1;
    }
    let start = Instant::now();
    let mut sink = 0usize;
    for _ in 0..iterations {
        let mut b = BytesMut::from(&rest[..]);
        for _ in 0..per_pass {
            let a = decode_call(&mut dec, &mut b);
            sink += a.analysis_run.map_or(0, |r| r.status.metric_results.len());
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / (iterations * per_pass) as f64;
    println!("calls_per_pass={per_pass} iterations={iterations} checksum={sink}");
    println!("ns_per_op={ns:.1}");
}
