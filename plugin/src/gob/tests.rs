//! Codec tests: Go's documented examples, multi-message interface values, skipping, errors, and
//! property tests (round trips; arbitrary bytes never panic).

use std::collections::BTreeMap;

use bytes::BytesMut;
use proptest::prelude::*;

use super::wire::{put_bytes, put_int, put_uint};
use super::*;

gob_struct! {
    struct Point as "Point" {
        x: i64 => "X",
        y: i64 => "Y",
    }
}

gob_struct! {
    struct OnlyY as "OnlyY" {
        y: i64 => "Y",
    }
}

gob_struct! {
    struct Unrelated as "Unrelated" {
        name: String => "Name",
    }
}

gob_struct! {
    struct Outer as "Outer" {
        label: String => "Label",
        at: Option<GoTime> => "At",
        inner: Point => "Inner",
        points: Vec<Point> => "Points",
        tags: BTreeMap<String, String> => "Tags",
        raw: GoBytes => "Raw",
        ok: bool => "OK",
        ratio: f64 => "Ratio",
        count: u32 => "Count",
    }
}

/// `Point{22, 33}` as the first value of an encoder, from the `encoding/gob` package docs.
const POINT_STREAM: &[u8] = &[
    0x1f, 0xff, 0x81, 0x03, 0x01, 0x01, 0x05, b'P', b'o', b'i', b'n', b't', 0x01, 0xff, 0x82, 0x00,
    0x01, 0x02, 0x01, 0x01, b'X', 0x01, 0x04, 0x00, 0x01, 0x01, b'Y', 0x01, 0x04, 0x00, 0x00, 0x00,
    0x07, 0xff, 0x82, 0x01, 0x2c, 0x01, 0x42, 0x00,
];

#[test]
fn go_doc_example_decodes_and_encodes_identically() {
    let mut buf = BytesMut::from(POINT_STREAM);
    let p: Point = Decoder::new().decode(&mut buf).unwrap();
    assert_eq!(p, Point { x: 22, y: 33 });
    assert!(buf.is_empty());
    let mut out = Vec::new();
    Encoder::new().encode(&p, &mut out);
    assert_eq!(out, POINT_STREAM);
}

#[test]
fn partial_input_is_incomplete_and_consumes_nothing() {
    let mut dec = Decoder::new();
    let mut buf = BytesMut::new();
    for &b in &POINT_STREAM[..POINT_STREAM.len() - 1] {
        buf.extend_from_slice(&[b]);
        assert!(matches!(
            dec.decode::<Point>(&mut buf),
            Err(Error::Incomplete)
        ));
        assert!(
            dec.types().is_empty(),
            "type definitions of an incomplete value are rolled back"
        );
    }
    buf.extend_from_slice(&POINT_STREAM[POINT_STREAM.len() - 1..]);
    assert_eq!(
        dec.decode::<Point>(&mut buf).unwrap(),
        Point { x: 22, y: 33 }
    );
}

#[test]
fn types_are_sent_once_per_stream_and_reused() {
    let mut enc = Encoder::new();
    let mut out = Vec::new();
    enc.encode(&Point { x: 1, y: 2 }, &mut out);
    let first = out.len();
    enc.encode(&Point { x: 3, y: 4 }, &mut out);
    assert_eq!(
        &out[first..],
        &[0x07, 0xff, 0x82, 0x01, 0x06, 0x01, 0x08, 0x00]
    );
    let mut buf = BytesMut::from(&out[..]);
    let mut dec = Decoder::new();
    assert_eq!(dec.decode::<Point>(&mut buf).unwrap(), Point { x: 1, y: 2 });
    assert_eq!(dec.decode::<Point>(&mut buf).unwrap(), Point { x: 3, y: 4 });
}

fn sample_outer() -> Outer {
    Outer {
        label: "run".into(),
        at: Some(GoTime::from_unix(1_700_000_000, 123_456_789)),
        inner: Point { x: -5, y: 0 },
        points: vec![Point { x: 1, y: 1 }, Point::default()],
        tags: [
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), String::new()),
        ]
        .into(),
        raw: GoBytes(br#"{"k":"v"}"#.to_vec()),
        ok: true,
        ratio: 0.25,
        count: 7,
    }
}

#[test]
fn nested_values_round_trip() {
    let v = sample_outer();
    let mut out = Vec::new();
    Encoder::new().encode(&v, &mut out);
    let got: Outer = Decoder::new()
        .decode(&mut BytesMut::from(&out[..]))
        .unwrap();
    assert_eq!(got, v);
}

#[test]
fn unknown_fields_are_skipped_by_name() {
    let mut out = Vec::new();
    Encoder::new().encode(&Point { x: 9, y: 10 }, &mut out);
    let got: OnlyY = Decoder::new()
        .decode(&mut BytesMut::from(&out[..]))
        .unwrap();
    assert_eq!(got.y, 10);
    // Decoding an Outer as a Point-shaped type skips every other field, whatever its kind.
    let mut out = Vec::new();
    Encoder::new().encode(&sample_outer(), &mut out);
    let err = Decoder::new()
        .decode::<OnlyY>(&mut BytesMut::from(&out[..]))
        .unwrap_err();
    assert!(err.to_string().contains("no fields matched"), "{err}");
}

#[test]
fn kind_mismatches_are_errors_not_panics() {
    let mut out = Vec::new();
    Encoder::new().encode(&"text".to_string(), &mut out);
    let err = Decoder::new()
        .decode::<i64>(&mut BytesMut::from(&out[..]))
        .unwrap_err();
    assert!(matches!(err, Error::Mismatch { .. }), "{err}");
    let mut out = Vec::new();
    Encoder::new().encode(&Point { x: 1, y: 2 }, &mut out);
    let err = Decoder::new()
        .decode::<Unrelated>(&mut BytesMut::from(&out[..]))
        .unwrap_err();
    assert!(err.to_string().contains("no fields matched"), "{err}");
}

#[test]
fn oversized_messages_are_refused_before_buffering() {
    let mut buf = BytesMut::from(&[0xFC, 0x10, 0x00, 0x00, 0x00][..]); // 256 MiB announced
    let err = Decoder::new()
        .with_max_message(1 << 20)
        .decode::<Point>(&mut buf)
        .unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
}

/// Builds what Go writes for `enc.Encode(&v)` where `v any = Outer{…}` is new on the stream:
/// the definitions of Outer, Point, the time, the slice and the map each flush a message.
fn go_interface_stream(name: &str, value: &Outer) -> Vec<u8> {
    let mut enc = Encoder::new();
    let mut scratch = Vec::new();
    enc.encode(value, &mut scratch);
    // Re-split our encoding into definitions and value, then lay them out Go's way.
    let mut defs = Vec::new();
    let mut buf = BytesMut::from(&scratch[..]);
    let mut pos = 0;
    let bytes = buf.split().freeze();
    while pos < bytes.len() {
        let (len, prefix) = wire::peek_uint(&bytes, pos).unwrap().unwrap();
        defs.push(bytes[pos + prefix..pos + prefix + len as usize].to_vec());
        pos += prefix + len as usize;
    }
    let value_msg = defs.pop().unwrap();
    let mut out = Vec::new();
    // msg 1: interface header + first definition
    let mut first = Vec::new();
    put_int(&mut first, ids::INTERFACE);
    put_uint(&mut first, 0);
    put_bytes(&mut first, name.as_bytes());
    first.extend_from_slice(&defs[0]);
    put_bytes(&mut out, &first);
    // msgs 2..: one definition each
    for d in &defs[1..] {
        put_bytes(&mut out, d);
    }
    // last: concrete id, byte count, value
    let mut r = wire::Reader::new(&value_msg, 0, value_msg.len());
    let id = r.read_int().unwrap();
    let body = &value_msg[r.pos()..];
    let mut last = Vec::new();
    put_int(&mut last, id);
    put_bytes(&mut last, body);
    put_bytes(&mut out, &last);
    out
}

#[test]
fn interface_values_spanning_messages_decode() {
    let v = sample_outer();
    let stream = go_interface_stream("Outer", &v);
    let mut dec = Decoder::new();
    // Byte by byte: every prefix is incomplete and leaves no trace.
    let mut buf = BytesMut::new();
    for &b in &stream[..stream.len() - 1] {
        buf.extend_from_slice(&[b]);
        assert!(matches!(
            dec.decode_interface::<Outer>(&mut buf, "Outer"),
            Err(Error::Incomplete)
        ));
    }
    buf.extend_from_slice(&stream[stream.len() - 1..]);
    assert_eq!(
        dec.decode_interface::<Outer>(&mut buf, "Outer").unwrap(),
        Ok(v)
    );
    assert!(buf.is_empty());
}

#[test]
fn an_interface_of_another_type_is_reported_and_skipped() {
    let mut stream = go_interface_stream("Other", &sample_outer());
    // A nil interface follows: `int(8) 00 00`.
    put_bytes(&mut stream, &[0x10, 0x00, 0x00]);
    let mut buf = BytesMut::from(&stream[..]);
    let mut dec = Decoder::new();
    assert_eq!(
        dec.decode_interface::<Outer>(&mut buf, "Outer").unwrap(),
        Err("Other".to_string())
    );
    assert_eq!(
        dec.decode_interface::<Outer>(&mut buf, "Outer").unwrap(),
        Err("nil".to_string())
    );
    assert!(buf.is_empty());
}

#[test]
fn skip_consumes_any_value() {
    let stream = go_interface_stream("Outer", &sample_outer());
    let mut buf = BytesMut::from(&stream[..]);
    Decoder::new().skip(&mut buf).unwrap();
    assert!(buf.is_empty());
}

fn arb_point() -> impl Strategy<Value = Point> {
    (any::<i64>(), any::<i64>()).prop_map(|(x, y)| Point { x, y })
}

fn arb_outer() -> impl Strategy<Value = Outer> {
    (
        ".*",
        proptest::option::of((any::<i64>().prop_map(|s| s / 4), 0u32..1_000_000_000)),
        arb_point(),
        proptest::collection::vec(arb_point(), 0..4),
        proptest::collection::btree_map(".*", ".*", 0..4),
        proptest::collection::vec(any::<u8>(), 0..32),
        (
            any::<bool>(),
            any::<f64>().prop_filter("NaN is not equal to itself", |f| !f.is_nan()),
            any::<u32>(),
        ),
    )
        .prop_map(
            |(label, at, inner, points, tags, raw, (ok, ratio, count))| Outer {
                label,
                at: at.map(|(s, n)| GoTime::from_unix(s, n)),
                inner,
                points,
                tags,
                raw: GoBytes(raw),
                ok,
                ratio,
                count,
            },
        )
}

proptest! {
    #[test]
    fn any_value_round_trips(values in proptest::collection::vec(arb_outer(), 1..4)) {
        let mut enc = Encoder::new();
        let mut out = Vec::new();
        for v in &values {
            enc.encode(v, &mut out);
        }
        let mut dec = Decoder::new();
        let mut buf = BytesMut::from(&out[..]);
        for v in &values {
            prop_assert_eq!(&dec.decode::<Outer>(&mut buf).unwrap(), v);
        }
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn interface_streams_decode_whatever_the_chunking(v in arb_outer(), cut in 0usize..4096) {
        let stream = go_interface_stream("Outer", &v);
        let cut = cut % stream.len();
        let mut dec = Decoder::new();
        let mut buf = BytesMut::from(&stream[..cut]);
        if cut < stream.len() {
            prop_assert!(matches!(dec.decode_interface::<Outer>(&mut buf, "Outer"), Err(Error::Incomplete)));
        }
        buf.extend_from_slice(&stream[cut..]);
        prop_assert_eq!(dec.decode_interface::<Outer>(&mut buf, "Outer").unwrap(), Ok(v));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut dec = Decoder::new().with_max_message(1 << 16);
        let mut buf = BytesMut::from(&bytes[..]);
        for _ in 0..8 {
            let before = buf.len();
            let r = dec.decode_interface::<Outer>(&mut buf, "Outer");
            if matches!(r, Err(Error::Incomplete)) || buf.len() == before {
                break;
            }
        }
        let mut buf = BytesMut::from(&bytes[..]);
        let _ = Decoder::new().skip(&mut buf);
        let mut buf = BytesMut::from(&bytes[..]);
        let _ = Decoder::new().decode::<Outer>(&mut buf);
    }

    #[test]
    fn mutated_valid_streams_never_panic(v in arb_outer(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6)) {
        let mut stream = go_interface_stream("Outer", &v);
        for (i, b) in flips {
            let n = stream.len();
            stream[i % n] = b;
        }
        let mut buf = BytesMut::from(&stream[..]);
        let _ = Decoder::new().decode_interface::<Outer>(&mut buf, "Outer");
    }
}
