//! A value derived from files, re-derived when they change: how the TLS certificate, the JWT
//! keys and the revoked token ids follow their files without a restart (issue #14 item 5).
//!
//! [`Reloading::get`] is cheap and synchronous (rustls asks for the certificate from a sync
//! callback): at most once per `every` it looks at the files' metadata (modification time,
//! length, inode), and only when one of them changed does it derive the value again. A value
//! that cannot be derived (a half-written certificate, a key file of 3 bytes, a file removed
//! while a Secret volume swaps its `..data` link) is logged once per change and the previous
//! value stays in force: a bad rotation never takes the server down. No background task, no
//! inotify: mounted Secrets are updated by an atomic symlink swap that inotify watches on the
//! file itself do not see, while a `stat` through the path does.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use tracing::{info, warn};

/// How often `serve` looks at its certificate, key and revocation files: a rotation is in force
/// within this long (plus the kubelet's own Secret sync, about a minute).
pub const CHECK_EVERY: Duration = Duration::from_secs(3);

/// The error a derivation may return: anything that says what is wrong with the files.
pub type DeriveError = Box<dyn std::error::Error + Send + Sync + 'static>;

type Derive<T> = Box<dyn Fn(&[PathBuf]) -> Result<T, DeriveError> + Send + Sync>;

/// What a file looked like when last checked; `None`: it could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp(Option<(SystemTime, u64, u64)>);

impl Stamp {
    fn of(path: &Path) -> Self {
        Self(std::fs::metadata(path).ok().map(|m| {
            #[cfg(unix)]
            let inode = std::os::unix::fs::MetadataExt::ino(&m);
            #[cfg(not(unix))]
            let inode = 0;
            (
                m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                m.len(),
                inode,
            )
        }))
    }
}

struct Check {
    at: Instant,
    stamps: Vec<Stamp>,
}

struct Inner<T> {
    what: &'static str,
    files: Vec<PathBuf>,
    every: Duration,
    derive: Option<Derive<T>>,
    current: RwLock<Arc<T>>,
    check: Mutex<Check>,
}

/// A value derived from `files`, re-derived by [`Reloading::get`] when they change. Cloning
/// shares the value.
pub struct Reloading<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Clone for Reloading<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<T> fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading")
            .field("what", &self.inner.what)
            .field("files", &self.inner.files)
            .finish_non_exhaustive()
    }
}

impl<T: Send + Sync + 'static> Reloading<T> {
    /// Derives the value from `files` now (an error here is the caller's: the process should not
    /// start), then again whenever they change, looked at most once per `every`. `what` names
    /// the value in log lines, e.g. `"tls certificate"`.
    pub fn new<E>(
        what: &'static str,
        files: Vec<PathBuf>,
        every: Duration,
        derive: impl Fn(&[PathBuf]) -> Result<T, E> + Send + Sync + 'static,
    ) -> Result<Self, E>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let stamps = files.iter().map(|f| Stamp::of(f)).collect();
        let first = derive(&files)?;
        Ok(Self {
            inner: Arc::new(Inner {
                what,
                files,
                every,
                derive: Some(Box::new(move |f| derive(f).map_err(Into::into))),
                current: RwLock::new(Arc::new(first)),
                check: Mutex::new(Check {
                    at: Instant::now(),
                    stamps,
                }),
            }),
        })
    }

    /// A value that comes from no file and never changes (flags, tests).
    pub fn fixed(what: &'static str, value: T) -> Self {
        Self {
            inner: Arc::new(Inner {
                what,
                files: Vec::new(),
                every: Duration::MAX,
                derive: None,
                current: RwLock::new(Arc::new(value)),
                check: Mutex::new(Check {
                    at: Instant::now(),
                    stamps: Vec::new(),
                }),
            }),
        }
    }

    /// The files the value is derived from.
    pub fn files(&self) -> &[PathBuf] {
        &self.inner.files
    }

    /// The current value, re-derived first if the files changed since the last look (at most
    /// one look per `every`; a caller that finds another one looking takes the current value).
    pub fn get(&self) -> Arc<T> {
        if let Some(derive) = &self.inner.derive {
            self.refresh(derive);
        }
        self.current()
    }

    fn current(&self) -> Arc<T> {
        self.inner
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn refresh(&self, derive: &Derive<T>) {
        let inner = &self.inner;
        let Ok(mut check) = inner.check.try_lock() else {
            return;
        };
        if check.at.elapsed() < inner.every {
            return;
        }
        check.at = Instant::now();
        let stamps: Vec<Stamp> = inner.files.iter().map(|f| Stamp::of(f)).collect();
        if stamps == check.stamps {
            return;
        }
        // Remember the new look whatever comes of it: a file that does not parse is reported
        // once, and tried again at its next change (the key written after the certificate).
        check.stamps = stamps;
        let files = inner
            .files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(",");
        match derive(&inner.files) {
            Ok(value) => {
                *inner.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(value);
                info!(what = inner.what, %files, "reloaded from changed files");
            }
            Err(e) => warn!(
                what = inner.what,
                %files,
                error = %e,
                "the changed files cannot be used; keeping the previous value until they change again"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Bad(String);

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rd-reload-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Parses the file as a number; counts derivations.
    fn number(file: &Path, every: Duration) -> (Reloading<u64>, Arc<AtomicUsize>) {
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let r = Reloading::new("number", vec![file.to_path_buf()], every, move |f| {
            c.fetch_add(1, Ordering::SeqCst);
            let text = std::fs::read_to_string(&f[0]).map_err(|e| Bad(e.to_string()))?;
            text.trim().parse::<u64>().map_err(|e| Bad(e.to_string()))
        })
        .unwrap();
        (r, count)
    }

    #[test]
    fn a_changed_file_is_derived_again_and_a_bad_one_keeps_the_old_value() {
        let d = dir("change");
        let file = d.join("n");
        std::fs::write(&file, "1").unwrap();
        let (r, count) = number(&file, Duration::ZERO);
        assert_eq!(*r.get(), 1);
        assert_eq!(
            count.load(Ordering::SeqCst),
            1,
            "unchanged: not derived again"
        );
        std::fs::write(&file, "22").unwrap();
        assert_eq!(*r.get(), 22);
        std::fs::write(&file, "not a number").unwrap();
        assert_eq!(*r.get(), 22, "a bad file keeps the previous value");
        let derived = count.load(Ordering::SeqCst);
        assert_eq!(*r.get(), 22);
        assert_eq!(
            count.load(Ordering::SeqCst),
            derived,
            "a bad file is tried once per change, not on every look"
        );
        std::fs::remove_file(&file).unwrap();
        assert_eq!(*r.get(), 22, "a removed file keeps the previous value");
        std::fs::write(&file, "333").unwrap();
        assert_eq!(*r.get(), 333);
        std::fs::remove_dir_all(d).ok();
    }

    #[test]
    fn files_are_looked_at_most_once_per_interval() {
        let d = dir("interval");
        let file = d.join("n");
        std::fs::write(&file, "1").unwrap();
        let (r, _) = number(&file, Duration::from_secs(3600));
        std::fs::write(&file, "2").unwrap();
        assert_eq!(*r.get(), 1, "within the interval the old value stands");
        std::fs::remove_dir_all(d).ok();
    }

    #[test]
    fn the_first_derivation_error_is_the_callers() {
        let d = dir("first");
        let file = d.join("n");
        std::fs::write(&file, "x").unwrap();
        let e = Reloading::new("number", vec![file], Duration::ZERO, |f| {
            std::fs::read_to_string(&f[0])
                .map_err(|e| Bad(e.to_string()))?
                .parse::<u64>()
                .map_err(|e| Bad(e.to_string()))
        })
        .unwrap_err();
        assert!(e.0.contains("invalid digit"), "{e}");
        assert_eq!(*Reloading::fixed("v", 7u8).get(), 7);
        std::fs::remove_dir_all(d).ok();
    }
}
