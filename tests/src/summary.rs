//! The one line a benchmark or smoke test ends with: printed, and written to `$SUMMARY_FILE`,
//! which the make targets show as their last line (`summary_test` in tests/tests.mk).

use anyhow::{Context, Result};

/// The environment variable naming the file that receives the summary line.
pub const SUMMARY_FILE_ENV: &str = "SUMMARY_FILE";

/// Prints `line` and writes it to `$SUMMARY_FILE` if set. Call it last, after every check passed:
/// a target whose test wrote no summary fails.
pub fn report(line: &str) -> Result<()> {
    println!("{line}");
    if let Some(path) = std::env::var_os(SUMMARY_FILE_ENV) {
        std::fs::write(&path, format!("{line}\n"))
            .with_context(|| format!("writing the summary to {}", path.to_string_lossy()))?;
    }
    Ok(())
}
