//! The one way tests wait for something that happens elsewhere: [`eventually`].
//!
//! Real clusters, controllers and servers converge in their own time; a test polls until a check
//! holds and, when it does not within the timeout, fails naming what it waited for and the last
//! state it saw (so a timeout reads as a finding, not as "timed out").

use std::future::Future;
use std::time::Duration;

use anyhow::{bail, Result};
use tokio::time::Instant;

/// How often [`eventually`] checks.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// What one check found: done (with a value), or not yet (with what it saw instead).
#[derive(Debug)]
pub enum Progress<T> {
    /// The condition holds; [`eventually`] returns this value.
    Done(T),
    /// Not yet; the text describes the state seen, quoted if the wait times out.
    Waiting(String),
}

/// What a check may return: `bool`, `Option<T>` or [`Progress<T>`].
pub trait IntoProgress {
    /// The value [`eventually`] returns once the check holds.
    type Output;
    /// The check's result as [`Progress`].
    fn into_progress(self) -> Progress<Self::Output>;
}

impl IntoProgress for bool {
    type Output = ();
    fn into_progress(self) -> Progress<()> {
        if self {
            Progress::Done(())
        } else {
            Progress::Waiting(String::new())
        }
    }
}

impl<T> IntoProgress for Option<T> {
    type Output = T;
    fn into_progress(self) -> Progress<T> {
        self.map_or_else(|| Progress::Waiting(String::new()), Progress::Done)
    }
}

impl<T> IntoProgress for Progress<T> {
    type Output = T;
    fn into_progress(self) -> Progress<T> {
        self
    }
}

/// Runs `check` every [`POLL_INTERVAL`] until it holds, for up to `timeout`; returns its value.
///
/// An `Err` from `check` ends the wait at once (a check that may fail transiently turns the
/// error into [`Progress::Waiting`] itself). On timeout the error names `what` and the last
/// [`Progress::Waiting`] text.
///
/// `check` is a plain closure returning a future (`|| async { … }`), not an async closure: the
/// futures of borrowing async closures are not `Send` for every lifetime, so a wait inside a
/// spawned task (a cluster start) could not use them.
pub async fn eventually<P, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<P::Output>
where
    P: IntoProgress,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<P>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let seen = match check().await?.into_progress() {
            Progress::Done(value) => return Ok(value),
            Progress::Waiting(seen) => seen,
        };
        if Instant::now() > deadline {
            if seen.is_empty() {
                bail!("{what}: still not the case after {timeout:?}");
            }
            bail!("{what}: still not the case after {timeout:?}; last seen: {seen}");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn returns_the_value_once_the_check_holds() {
        let calls = std::cell::Cell::new(0);
        let value = eventually("the third call", Duration::from_secs(5), || async {
            calls.set(calls.get() + 1);
            Ok((calls.get() == 3).then_some(calls.get()))
        })
        .await
        .unwrap();
        assert_eq!(value, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_names_what_was_awaited_and_the_last_state() {
        let err = eventually("the job to finish", Duration::from_secs(1), || async {
            Ok(Progress::<()>::Waiting("phase Running".into()))
        })
        .await
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("the job to finish: still not the case after 1s"),
            "{err}"
        );
        assert!(err.ends_with("last seen: phase Running"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_ends_the_wait_at_once() {
        let started = tokio::time::Instant::now();
        let err = eventually("anything", Duration::from_secs(60), || async {
            anyhow::Result::<bool>::Err(anyhow::anyhow!("the API refused"))
        })
        .await
        .unwrap_err();
        assert_eq!(err.to_string(), "the API refused");
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
