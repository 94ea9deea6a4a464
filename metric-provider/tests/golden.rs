//! Golden vectors shared with Go (tests/conformance/cmd/golden and golden/replies_test.go).
//!
//! * `fixtures/gob/<case>.gob` are streams Go's net/rpc client wrote with Argo's own types;
//!   `<case>.json` is Go's `encoding/json` view of the same calls. We decode the gob and compare
//!   field by field with the JSON, so the expectations come from Go, not from us.
//! * `fixtures/gob/replies/<case>.gob` are replies we encode; the Go test decodes them into Argo's
//!   types. Set `GOLDEN_REGENERATE=1` to rewrite them (`make golden`); otherwise they must match.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::BytesMut;
use dispatch_metric_provider::rollouts::{
    names, AnalysisRun, GarbageCollectArgs, GetMetadataArgs, Measurement, Metric, RpcError,
    RunArgs, TerminateAndResumeArgs,
};
use dispatch_plugin::gob::{Decoder, Empty, Encoder, GoTime, GobEncode};
use dispatch_plugin::rpc::{Request, Response};
use serde_json::{json, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gob")
}

fn time_json(t: &Option<GoTime>) -> Value {
    t.map_or(Value::Null, |t| Value::from(t.to_rfc3339()))
}

fn str_or_empty<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn map_json(m: &BTreeMap<String, String>) -> Value {
    if m.is_empty() {
        Value::Null
    } else {
        json!(m)
    }
}

fn check_measurement(got: &Measurement, want: &Value, at: &str) {
    assert_eq!(got.phase, str_or_empty(want, "phase"), "{at}.phase");
    assert_eq!(got.message, str_or_empty(want, "message"), "{at}.message");
    assert_eq!(got.value, str_or_empty(want, "value"), "{at}.value");
    for (field, t) in [
        ("startedAt", &got.started_at),
        ("finishedAt", &got.finished_at),
        ("resumeAt", &got.resume_at),
    ] {
        assert_eq!(
            time_json(t),
            want.get(field).cloned().unwrap_or(Value::Null),
            "{at}.{field}"
        );
    }
    assert_eq!(
        map_json(&got.metadata),
        want.get("metadata").cloned().unwrap_or(Value::Null),
        "{at}.metadata"
    );
}

fn check_metric(got: &Metric, want: &Value, at: &str) {
    assert_eq!(got.name, str_or_empty(want, "name"), "{at}.name");
    let want_plugins = want
        .pointer("/provider/plugin")
        .cloned()
        .unwrap_or(Value::Null);
    let got_plugins: serde_json::Map<String, Value> = got
        .provider
        .plugin
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                serde_json::from_slice(&v.0).expect("plugin block is JSON"),
            )
        })
        .collect();
    if want_plugins.is_null() {
        assert!(got_plugins.is_empty(), "{at}.provider.plugin");
    } else {
        assert_eq!(
            Value::Object(got_plugins),
            want_plugins,
            "{at}.provider.plugin"
        );
    }
}

fn check_run(got: &AnalysisRun, want: &Value) {
    let meta = &want["metadata"];
    let m = &got.object_meta;
    assert_eq!(m.name, str_or_empty(meta, "name"), "metadata.name");
    assert_eq!(
        m.namespace,
        str_or_empty(meta, "namespace"),
        "metadata.namespace"
    );
    assert_eq!(m.uid, str_or_empty(meta, "uid"), "metadata.uid");
    assert_eq!(
        map_json(&m.labels),
        meta.get("labels").cloned().unwrap_or(Value::Null),
        "metadata.labels"
    );
    assert_eq!(
        map_json(&m.annotations),
        meta.get("annotations").cloned().unwrap_or(Value::Null),
        "metadata.annotations"
    );
    assert_eq!(
        time_json(&m.creation_timestamp),
        meta.get("creationTimestamp")
            .cloned()
            .unwrap_or(Value::Null)
    );
    let owners = meta
        .get("ownerReferences")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    assert_eq!(m.owner_references.len(), owners.len(), "ownerReferences");
    for (o, w) in m.owner_references.iter().zip(&owners) {
        assert_eq!(
            (o.kind.as_str(), o.name.as_str(), o.uid.as_str()),
            (
                str_or_empty(w, "kind"),
                str_or_empty(w, "name"),
                str_or_empty(w, "uid")
            )
        );
        assert_eq!(o.api_version, str_or_empty(w, "apiVersion"));
        assert_eq!(o.controller, w.get("controller").and_then(Value::as_bool));
    }
    let args = want
        .pointer("/spec/args")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    assert_eq!(got.spec.args.len(), args.len(), "spec.args");
    for (a, w) in got.spec.args.iter().zip(&args) {
        assert_eq!(a.name, str_or_empty(w, "name"));
        assert_eq!(
            a.value.as_deref(),
            w.get("value").and_then(Value::as_str),
            "arg {}",
            a.name
        );
        let want_secret = w
            .pointer("/valueFrom/secretKeyRef/name")
            .and_then(Value::as_str);
        assert_eq!(
            a.value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref())
                .map(|s| s.name.as_str()),
            want_secret
        );
    }
    let metrics = want
        .pointer("/spec/metrics")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    assert_eq!(got.spec.metrics.len(), metrics.len(), "spec.metrics");
    for (i, (g, w)) in got.spec.metrics.iter().zip(&metrics).enumerate() {
        check_metric(g, w, &format!("spec.metrics[{i}]"));
    }
    assert_eq!(
        got.spec.terminate,
        want.pointer("/spec/terminate")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    );
    let status = &want["status"];
    assert_eq!(
        got.status.phase,
        str_or_empty(status, "phase"),
        "status.phase"
    );
    let results = status
        .get("metricResults")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        got.status.metric_results.len(),
        results.len(),
        "status.metricResults"
    );
    for (r, w) in got.status.metric_results.iter().zip(&results) {
        assert_eq!(r.name, str_or_empty(w, "name"));
        for (field, v) in [
            ("count", r.count),
            ("error", r.error),
            ("successful", r.successful),
            ("failed", r.failed),
        ] {
            assert_eq!(
                i64::from(v),
                w.get(field).and_then(Value::as_i64).unwrap_or(0),
                "metricResults {}.{field}",
                r.name
            );
        }
        let ms = w
            .get("measurements")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        assert_eq!(r.measurements.len(), ms.len(), "measurements of {}", r.name);
        for (i, (m, wm)) in r.measurements.iter().zip(&ms).enumerate() {
            check_measurement(m, wm, &format!("{}.measurements[{i}]", r.name));
        }
    }
}

fn check_body(dec: &mut Decoder, buf: &mut BytesMut, kind: &str, want: &Value, case: &str) {
    match kind {
        "nil" => {
            dec.skip(buf)
                .unwrap_or_else(|e| panic!("{case}: nil body: {e}"));
        }
        "string" => assert_eq!(
            dec.decode::<String>(buf).unwrap(),
            want.as_str().unwrap(),
            "{case}"
        ),
        "bool" => assert_eq!(
            dec.decode::<bool>(buf).unwrap(),
            want.as_bool().unwrap(),
            "{case}"
        ),
        names::RUN_ARGS => {
            let a = dec.decode_interface::<RunArgs>(buf, kind).unwrap().unwrap();
            check_run(&a.analysis_run.unwrap_or_default(), &want["AnalysisRun"]);
            check_metric(&a.metric, &want["Metric"], "Metric");
        }
        names::TERMINATE_AND_RESUME_ARGS => {
            let a = dec
                .decode_interface::<TerminateAndResumeArgs>(buf, kind)
                .unwrap()
                .unwrap();
            check_run(&a.analysis_run.unwrap_or_default(), &want["AnalysisRun"]);
            check_metric(&a.metric, &want["Metric"], "Metric");
            check_measurement(&a.measurement, &want["Measurement"], "Measurement");
        }
        names::GARBAGE_COLLECT_ARGS => {
            let a = dec
                .decode_interface::<GarbageCollectArgs>(buf, kind)
                .unwrap()
                .unwrap();
            check_run(&a.analysis_run.unwrap_or_default(), &want["AnalysisRun"]);
            assert_eq!(a.limit, want["Limit"].as_i64().unwrap());
        }
        names::GET_METADATA_ARGS => {
            let a = dec
                .decode_interface::<GetMetadataArgs>(buf, kind)
                .unwrap()
                .unwrap();
            check_metric(&a.metric, &want["Metric"], "Metric");
        }
        other => panic!("{case}: unknown argsType {other}"),
    }
}

#[test]
fn go_written_requests_decode_to_what_go_encoded() {
    let dir = fixtures();
    let mut cases = 0;
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}; run `make golden`", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gob"))
        .collect();
    entries.sort();
    for gob in entries {
        let json_path = gob.with_extension("json");
        if !json_path.exists() {
            continue;
        }
        let case = gob.file_stem().unwrap().to_string_lossy().into_owned();
        let calls: Vec<Value> =
            serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
        let mut buf = BytesMut::from(&std::fs::read(&gob).unwrap()[..]);
        let mut dec = Decoder::new();
        for call in &calls {
            let req: Request = dec
                .decode(&mut buf)
                .unwrap_or_else(|e| panic!("{case}: header: {e}"));
            assert_eq!(
                req.service_method,
                call["serviceMethod"].as_str().unwrap(),
                "{case}"
            );
            assert_eq!(req.seq, call["seq"].as_u64().unwrap(), "{case}");
            check_body(
                &mut dec,
                &mut buf,
                call["argsType"].as_str().unwrap(),
                &call["args"],
                &case,
            );
        }
        assert!(buf.is_empty(), "{case}: {} bytes left over", buf.len());
        cases += 1;
    }
    assert!(
        cases >= 9,
        "expected the Go golden vectors in {}, found {cases} cases; run `make golden`",
        dir.display()
    );
}

/// Encodes one reply body on a stream.
type EncodeFn = Box<dyn Fn(&mut Encoder, &mut Vec<u8>)>;

/// One reply as the Go test reads it.
struct GoldenReply {
    method: &'static str,
    seq: u64,
    error: &'static str,
    kind: &'static str,
    json: Value,
    encode: EncodeFn,
}

fn reply<T: GobEncode + 'static>(
    method: &'static str,
    seq: u64,
    kind: &'static str,
    json: Value,
    body: T,
) -> GoldenReply {
    GoldenReply {
        method,
        seq,
        error: "",
        kind,
        json,
        encode: Box::new(move |enc, out| enc.encode(&body, out)),
    }
}

fn measurement_json(m: &Measurement) -> Value {
    let mut v = serde_json::Map::new();
    for (k, s) in [
        ("phase", &m.phase),
        ("message", &m.message),
        ("value", &m.value),
    ] {
        if !s.is_empty() {
            v.insert(k.into(), s.clone().into());
        }
    }
    for (k, t) in [
        ("startedAt", &m.started_at),
        ("finishedAt", &m.finished_at),
        ("resumeAt", &m.resume_at),
    ] {
        if t.is_some() {
            v.insert(k.into(), time_json(t));
        }
    }
    if !m.metadata.is_empty() {
        v.insert("metadata".into(), json!(m.metadata));
    }
    Value::Object(v)
}

fn golden_replies() -> Vec<(&'static str, Vec<GoldenReply>)> {
    let t0 = GoTime::from_unix(1_767_225_600, 0); // 2026-01-01T00:00:00Z
    let t1 = GoTime::from_unix(1_767_225_660, 0);
    let error = Measurement {
        phase: "Error".into(),
        message: "no server configured (set --server / ROLLOUTS_DISPATCH_SERVER)".into(),
        started_at: Some(t0),
        finished_at: Some(t0),
        ..Default::default()
    };
    let running = Measurement {
        phase: "Running".into(),
        started_at: Some(t0),
        resume_at: Some(t1),
        metadata: [
            ("job-name".to_string(), "a.b.1".to_string()),
            ("destinations".to_string(), "a,b".to_string()),
        ]
        .into(),
        ..Default::default()
    };
    let done = Measurement {
        phase: "Successful".into(),
        message: "cluster-a: Complete\ncluster-b: Complete".into(),
        started_at: Some(t0),
        finished_at: Some(t1),
        value: "1".into(),
        ..Default::default()
    };
    let meta: BTreeMap<String, String> = [
        ("plugin-version".to_string(), "0.1.0".to_string()),
        ("destination".to_string(), "cluster-a".to_string()),
    ]
    .into();
    let unknown = GoldenReply {
        method: "Plugin.Nope",
        seq: 4,
        error: "rpc: can't find method Plugin.Nope",
        kind: "struct",
        json: json!({}),
        encode: Box::new(|enc, out| enc.encode(&Empty, out)),
    };
    vec![
        (
            "control",
            vec![
                reply("Dispenser.Dispense", 0, "uint32", json!(1), 1u32),
                reply("Control.Ping", 1, "struct", json!({}), Empty),
                reply("Control.Quit", 2, "struct", json!({}), Empty),
            ],
        ),
        (
            "measurements",
            vec![
                reply(
                    "Plugin.Run",
                    1,
                    "Measurement",
                    measurement_json(&error),
                    error.clone(),
                ),
                reply(
                    "Plugin.Resume",
                    2,
                    "Measurement",
                    measurement_json(&running),
                    running.clone(),
                ),
                reply(
                    "Plugin.Terminate",
                    3,
                    "Measurement",
                    measurement_json(&done),
                    done.clone(),
                ),
                unknown,
                reply(
                    "Plugin.Run",
                    5,
                    "Measurement",
                    measurement_json(&running),
                    running,
                ),
            ],
        ),
        (
            "rpc_error",
            vec![
                reply(
                    "Plugin.InitPlugin",
                    0,
                    "RpcError",
                    json!({}),
                    RpcError::default(),
                ),
                reply(
                    "Plugin.GarbageCollect",
                    1,
                    "RpcError",
                    json!({"ErrorString": "cannot reach cluster-a"}),
                    RpcError {
                        error_string: "cannot reach cluster-a".into(),
                    },
                ),
            ],
        ),
        (
            "type_and_metadata",
            vec![
                reply(
                    "Plugin.Type",
                    0,
                    "string",
                    json!("RPCPlugin"),
                    "RPCPlugin".to_string(),
                ),
                reply("Plugin.GetMetadata", 1, "map", json!(meta), meta.clone()),
                reply(
                    "Plugin.GetMetadata",
                    2,
                    "map",
                    json!({}),
                    BTreeMap::<String, String>::new(),
                ),
            ],
        ),
    ]
}

#[test]
fn replies_match_the_vectors_go_decodes() {
    let dir = fixtures().join("replies");
    let regenerate = std::env::var_os("GOLDEN_REGENERATE").is_some();
    for (case, replies) in golden_replies() {
        let mut enc = Encoder::new();
        let mut out = Vec::new();
        let mut calls = Vec::new();
        for r in &replies {
            enc.encode(
                &Response {
                    service_method: r.method.into(),
                    seq: r.seq,
                    error: r.error.into(),
                },
                &mut out,
            );
            (r.encode)(&mut enc, &mut out);
            calls.push(json!({"serviceMethod": r.method, "seq": r.seq, "error": r.error, "replyType": r.kind, "reply": r.json}));
        }
        let json = serde_json::to_string_pretty(&calls).unwrap() + "\n";
        let (gob_path, json_path) = (
            dir.join(format!("{case}.gob")),
            dir.join(format!("{case}.json")),
        );
        if regenerate {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&gob_path, &out).unwrap();
            std::fs::write(&json_path, &json).unwrap();
        } else {
            let committed = std::fs::read(&gob_path)
                .unwrap_or_else(|e| panic!("{}: {e}; run `make golden`", gob_path.display()));
            assert!(
                committed == out,
                "{case}: our encoding changed; run `make golden` and check the Go side"
            );
            assert_eq!(
                std::fs::read_to_string(&json_path).unwrap(),
                json,
                "{case}.json"
            );
        }
    }
}
