//! Fuzz the plugin-block parser: arbitrary JSON-ish bytes give a config or an error message.
#![no_main]

use dispatch_api::JobConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(message) = JobConfig::parse(data) {
        assert!(!message.0.is_empty());
    }
});
