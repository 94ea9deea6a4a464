//! Logging: an `EnvFilter` and plain or JSON lines on stderr.

use tracing_subscriber::EnvFilter;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// human-readable lines
    Plain,
    /// one JSON object per line
    Json,
}

/// Installs the global subscriber.
pub fn init(filter: &str, format: LogFormat) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("invalid log filter {filter:?} ({e}); using \"info\"");
        EnvFilter::new("info")
    });
    // Colour only on a terminal: escape codes make log files and collectors unreadable.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Plain => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
