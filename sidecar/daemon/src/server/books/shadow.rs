//! The day's shadow's state (its logic is [`super::super::shadow`]).

use std::sync::Mutex;

use super::cells::unpoisoned;
use crate::policy::shadow::ShadowState;
use crate::protocol::ShadowSwitch;
use crate::shadow::DayBook;

/// The shadow's memory: the day's jobs and the switch.
pub(in crate::server) struct ShadowRun(Mutex<Run>);

pub(in crate::server) struct Run {
    pub(in crate::server) book: DayBook,
    pub(in crate::server) state: ShadowState,
    /// The settings the state was made for (policy, fallback, rule): a
    /// SIGHUP that changes them starts the switch afresh on the policy.
    pub(in crate::server) key: String,
    pub(in crate::server) next_check: f64,
    pub(in crate::server) checks: u64,
    pub(in crate::server) failures: u64,
    pub(in crate::server) last_costs: Option<[f64; 2]>,
    pub(in crate::server) last_switch: Option<ShadowSwitch>,
    pub(in crate::server) switches: u64,
}

impl ShadowRun {
    pub(in crate::server) fn new(now: f64) -> ShadowRun {
        ShadowRun(Mutex::new(Run {
            book: DayBook::new(now),
            state: ShadowState::new(Default::default()),
            key: String::new(),
            next_check: now,
            checks: 0,
            failures: 0,
            last_costs: None,
            last_switch: None,
            switches: 0,
        }))
    }

    /// Reads or writes the shadow's state (a leaf: holds nothing else).
    pub(in crate::server) fn with<R>(&self, f: impl FnOnce(&mut Run) -> R) -> R {
        f(&mut unpoisoned(&self.0))
    }
}
