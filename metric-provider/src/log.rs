//! hclog-style JSON logs on stderr, the format go-plugin hosts parse to keep each line's level.
//!
//! Each line is one JSON object with `@level`, `@message`, `@timestamp` (Go layout
//! `2006-01-02T15:04:05.000000Z07:00`) and `@module`, plus the event's fields. stdout is the
//! plugin protocol and is never written to.

use std::io::Write;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;
use tracing_subscriber::EnvFilter;

/// Installs the JSON stderr logger with `filter` (an `EnvFilter` directive such as `info`).
pub fn init(filter: &str) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("[WARN] invalid log filter {filter:?} ({e}); using \"info\"");
        EnvFilter::new("info")
    });
    tracing_subscriber::registry()
        .with(HclogJson)
        .with(filter)
        .init();
}

/// The formatting layer.
struct HclogJson;

struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(key(field), Value::from(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(key(field), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(key(field), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(key(field), Value::from(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(key(field), Value::from(format!("{value:?}")));
    }
}

fn key(field: &Field) -> String {
    match field.name() {
        "message" => "@message".into(),
        name => name.into(),
    }
}

impl<S: Subscriber> Layer<S> for HclogJson {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let level = match *event.metadata().level() {
            Level::TRACE => "trace",
            Level::DEBUG => "debug",
            Level::INFO => "info",
            Level::WARN => "warn",
            Level::ERROR => "error",
        };
        let mut fields = Fields(Map::new());
        fields.0.insert("@level".into(), level.into());
        fields
            .0
            .insert("@module".into(), "rollouts-dispatch-plugin".into());
        fields.0.insert(
            "@timestamp".into(),
            humantime::format_rfc3339_micros(std::time::SystemTime::now())
                .to_string()
                .into(),
        );
        event.record(&mut fields);
        let mut line = Value::Object(fields.0).to_string();
        line.push('\n');
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}
