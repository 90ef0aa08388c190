//! The one polling helper of smartmig's test crates (the end-to-end tests
//! of `smartmig-suite` in `tests/` and the CLI's tests in
//! `sidecar/tests/`): wait for an observable event (a status field, an
//! epoch counter, a Slurm job state, a file, a log line) instead of
//! sleeping for a fixed time, and on timeout fail naming what was awaited
//! and the last state seen.
//!
//! ```
//! use std::time::Duration;
//! use smartmig_test_support::{wait_until, Wait};
//!
//! let mut n = 0;
//! // A probe returns `bool`, `Option<T>` or `Result<T, S>`: `S` is the
//! // state seen so far, printed if the wait times out.
//! let got = wait_until("n reaches 3", Duration::from_secs(5), || {
//!     n += 1;
//!     if n >= 3 { Ok(n) } else { Err(n) }
//! });
//! assert_eq!(got, 3);
//! // With more to say on failure (logs), and a polling period of its own.
//! Wait::new("always", Duration::from_secs(1))
//!     .every(Duration::from_millis(10))
//!     .context(|| "the daemon's log".to_string())
//!     .until(|| true);
//! ```
//!
//! The timeout is a ceiling for a slow, shared machine, not an
//! expectation: a wait returns as soon as its probe succeeds.

#![forbid(unsafe_code)]
// The house rule: no function over 100 lines (clippy counts the lines of code).
#![warn(clippy::too_many_lines)]

use std::fmt::Debug;
use std::time::{Duration, Instant};

/// What a probe returns: done (with a value) or the state seen so far.
pub trait Outcome {
    type Done;
    type Seen: Debug;
    fn into_result(self) -> Result<Self::Done, Self::Seen>;
}

/// `true`: done.
impl Outcome for bool {
    type Done = ();
    type Seen = &'static str;
    fn into_result(self) -> Result<(), &'static str> {
        if self {
            Ok(())
        } else {
            Err("false")
        }
    }
}

/// `Some(value)`: done.
impl<T> Outcome for Option<T> {
    type Done = T;
    type Seen = &'static str;
    fn into_result(self) -> Result<T, &'static str> {
        self.ok_or("None")
    }
}

/// `Ok(value)`: done; `Err(state)`: the state seen, shown on timeout.
impl<T, S: Debug> Outcome for Result<T, S> {
    type Done = T;
    type Seen = S;
    fn into_result(self) -> Result<T, S> {
        self
    }
}

/// A wait that timed out: how long it waited and the last state seen.
#[derive(Debug)]
pub struct TimedOut<S> {
    pub waited: Duration,
    pub last: S,
}

/// A wait for `what`, at most `timeout`, probing every `every` (100 ms
/// unless told).
pub struct Wait<'a> {
    what: String,
    timeout: Duration,
    every: Duration,
    context: Option<Box<dyn Fn() -> String + 'a>>,
}

impl<'a> Wait<'a> {
    pub fn new(what: impl Into<String>, timeout: Duration) -> Self {
        Wait {
            what: what.into(),
            timeout,
            every: Duration::from_millis(100),
            context: None,
        }
    }

    /// Probe this often.
    #[must_use]
    pub fn every(mut self, period: Duration) -> Self {
        self.every = period;
        self
    }

    /// More to print on timeout (a log, a status table); computed only
    /// then.
    #[must_use]
    pub fn context(mut self, f: impl Fn() -> String + 'a) -> Self {
        self.context = Some(Box::new(f));
        self
    }

    /// Probes until it succeeds and returns its value; on timeout, panics
    /// with what was awaited, the last state seen and the context.
    ///
    /// # Panics
    /// When the probe has not succeeded within the timeout.
    pub fn until<P: Outcome>(self, probe: impl FnMut() -> P) -> P::Done {
        match self.poll(probe) {
            Ok(done) => done,
            Err(t) => panic!(
                "timed out waiting for {}: {:.1?} (limit {:?}); last seen: {:?}{}",
                self.what,
                t.waited,
                self.timeout,
                t.last,
                self.context
                    .as_ref()
                    .map(|c| format!("\n{}", c()))
                    .unwrap_or_default()
            ),
        }
    }

    /// Probes until it succeeds (`Ok`) or the timeout passes (`Err`, with
    /// the last state seen), for callers that judge a timeout themselves.
    /// The probe runs at least once, and once more at the deadline.
    ///
    /// # Errors
    /// [`TimedOut`] when the probe has not succeeded within the timeout.
    pub fn poll<P: Outcome>(
        &self,
        mut probe: impl FnMut() -> P,
    ) -> Result<P::Done, TimedOut<P::Seen>> {
        let start = Instant::now();
        loop {
            let last = match probe().into_result() {
                Ok(done) => return Ok(done),
                Err(seen) => seen,
            };
            let waited = start.elapsed();
            if waited >= self.timeout {
                return Err(TimedOut { waited, last });
            }
            std::thread::sleep(self.every.min(self.timeout - waited));
        }
    }
}

/// Probes every 100 ms until `probe` succeeds and returns its value.
///
/// # Panics
/// After `timeout`, naming `what` and the last state seen.
pub fn wait_until<P: Outcome>(
    what: impl Into<String>,
    timeout: Duration,
    probe: impl FnMut() -> P,
) -> P::Done {
    Wait::new(what, timeout).until(probe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_value_as_soon_as_the_probe_succeeds() {
        let mut calls = 0;
        let t0 = Instant::now();
        let v = Wait::new("third call", Duration::from_secs(60))
            .every(Duration::from_millis(1))
            .until(|| {
                calls += 1;
                (calls == 3).then_some(calls * 10)
            });
        assert_eq!((v, calls), (30, 3));
        assert!(t0.elapsed() < Duration::from_secs(30));
    }

    #[test]
    fn a_timeout_reports_the_last_state_seen() {
        let mut n = 0u32;
        let t = Wait::new("never", Duration::from_millis(50))
            .every(Duration::from_millis(5))
            .poll(|| {
                n += 1;
                Err::<(), u32>(n)
            })
            .unwrap_err();
        assert_eq!(t.last, n);
        assert!(n >= 2, "probed once more at the deadline: {n}");
        assert!(t.waited >= Duration::from_millis(50));
    }

    #[test]
    fn the_panic_message_has_the_state_and_the_context() {
        let err = std::panic::catch_unwind(|| {
            Wait::new("the flag", Duration::from_millis(20))
                .context(|| "CONTEXT".to_string())
                .until(|| Err::<(), _>("still down"));
        })
        .unwrap_err();
        let msg = err.downcast_ref::<String>().expect("a formatted panic");
        assert!(
            msg.contains("last seen: \"still down\"") && msg.ends_with("\nCONTEXT"),
            "{msg}"
        );
    }
}
