//! Learned GPU-memory estimates for jobs that declare no memory need.
//!
//! A job submitted without `--mig-mem` (or with a guess) gets a slice whose
//! memory may be too small; it then dies with an out-of-memory error and is
//! restarted on a bigger slice (the mechanism of "Managing MIG for
//! throughput and energy", arXiv 2508.18556). Users resubmit the same
//! scripts, so what a job *needed* last time is the best guess for the next
//! submission of the same (user, job name). This module keeps that history
//! and turns it into an estimate. It is pure and deterministic (no clock, no
//! IO, no randomness) so the simulator and the daemon share it; the daemon
//! keeps it in its state directory through serde.
//!
//! # Model
//!
//! Per key (the daemon's [`MemoryKey`] = user and job name; the simulator
//! uses its own key type) the estimator keeps the last
//! [`EstimatorConfig::window`] [`Observation`]s, each the instance memory
//! the job ran on (the profile) and what happened:
//!
//! - [`Outcome::Completed`] with the observed peak (GB): the job needed
//!   `peak_gb`;
//! - [`Outcome::OutOfMemory`]: the job needed *more than* `instance_gb`
//!   (a lower bound; the peak is unknown).
//!
//! [`MemoryEstimator::estimate`] returns
//!
//! ```text
//! base     = max( quantile_q(recent completed peaks), max(recent OOM instance GB) )
//! estimate = min( cap_gb, max(base * (1 + margin), base + min_margin_gb) )
//! ```
//!
//! or `None` with no history (the caller falls back to the smallest
//! profile, Slurm's behaviour without `--mig-mem`). Why these choices:
//!
//! - a *high quantile* (default the maximum, `q = 1`) because an
//!   underestimate costs a failed partial run plus a restart while an
//!   overestimate only costs a bigger slice for one run;
//! - a *relative and absolute* margin (default +10 %, at least +1 GB)
//!   because peaks vary a little between runs (data-dependent shapes,
//!   allocator fragmentation) and small jobs vary by a roughly constant
//!   amount (CUDA context, workspace buffers) rather than a fraction;
//! - an OOM is a hard lower bound: the estimate always exceeds the memory
//!   of an instance the key recently ran out of, so the next attempt lands
//!   on a bigger profile;
//! - the estimate is capped to the largest memory the caller can offer
//!   (`cap_gb`, the biggest profile of the GPU), never above.
//!
//! # Bounded memory
//!
//! At most [`EstimatorConfig::window`] observations per key (default 16,
//! the oldest dropped first) and at most [`EstimatorConfig::max_keys`] keys
//! (default 10 000; when a new key would exceed it, the key updated least
//! recently is dropped; "recently" is a counter of updates, not a clock, so
//! replays are deterministic). Serialized state is validated and trimmed to
//! these bounds on load.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

/// The daemon's key: what identifies "the same job again" in Slurm.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MemoryKey {
    /// Slurm user name (or uid as text).
    pub user: String,
    /// Slurm job name (`--job-name`, default the script name).
    pub name: String,
}

impl MemoryKey {
    pub fn new(user: impl Into<String>, name: impl Into<String>) -> Self {
        MemoryKey {
            user: user.into(),
            name: name.into(),
        }
    }
}

/// How a run ended, as far as memory is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The run finished (or failed for another reason) and `peak_gb` is the
    /// peak memory it used.
    Completed,
    /// The run ran out of memory on an instance of `instance_gb`.
    OutOfMemory,
}

/// One run of a key.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Memory of the instance (profile) the run had, GB.
    pub instance_gb: f64,
    /// Peak memory used, GB (for [`Outcome::OutOfMemory`]: `instance_gb`,
    /// i.e. what was exhausted; the need was larger).
    pub peak_gb: f64,
    pub outcome: Outcome,
}

/// Parameters of the estimator (documented defaults in [`Default`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EstimatorConfig {
    /// Observations kept per key (>= 1).
    pub window: usize,
    /// Quantile of the recent completed peaks used as the base, in (0, 1];
    /// nearest-rank (1 = the maximum).
    pub quantile: f64,
    /// Relative safety margin (>= 0): 0.1 = +10 %.
    pub margin: f64,
    /// Absolute minimum margin, GB (>= 0).
    pub min_margin_gb: f64,
    /// Keys kept (>= 1); the least recently updated is dropped beyond it.
    pub max_keys: usize,
}

impl Default for EstimatorConfig {
    fn default() -> Self {
        EstimatorConfig {
            window: 16,
            quantile: 1.0,
            margin: 0.10,
            min_margin_gb: 1.0,
            max_keys: 10_000,
        }
    }
}

/// An invalid configuration or observation.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum EstimateError {
    #[error("invalid estimator setting {field}: {message}")]
    Config {
        field: &'static str,
        message: String,
    },
    #[error("invalid observation: {0}")]
    Observation(String),
}

impl EstimatorConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), EstimateError> {
        let bad = |field, message: String| Err(EstimateError::Config { field, message });
        if self.window == 0 {
            return bad("window", "0 observations per key".into());
        }
        if !(self.quantile > 0.0 && self.quantile <= 1.0) {
            return bad("quantile", format!("{} is not in (0, 1]", self.quantile));
        }
        if !(self.margin.is_finite() && self.margin >= 0.0) {
            return bad(
                "margin",
                format!("{} is not a finite value >= 0", self.margin),
            );
        }
        if !(self.min_margin_gb.is_finite() && self.min_margin_gb >= 0.0) {
            return bad(
                "min_margin_gb",
                format!("{} is not a finite value >= 0", self.min_margin_gb),
            );
        }
        if self.max_keys == 0 {
            return bad("max_keys", "0 keys".into());
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct History {
    /// Oldest first.
    observations: VecDeque<Observation>,
    /// Value of the update counter at the last observation.
    updated: u64,
}

/// The learned state. `K` is the key type: [`MemoryKey`] in the daemon, any
/// ordered type in the simulator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(
    into = "Stored<K>",
    try_from = "Stored<K>",
    bound(
        serialize = "K: Serialize + Clone",
        deserialize = "K: Deserialize<'de> + Ord"
    )
)]
pub struct MemoryEstimator<K: Ord> {
    cfg: EstimatorConfig,
    keys: BTreeMap<K, History>,
    /// Updates so far (the "clock" of the least-recently-updated eviction).
    updates: u64,
}

/// The serialized form: a list, because JSON maps need string keys.
#[derive(Serialize, Deserialize)]
struct Stored<K> {
    config: EstimatorConfig,
    updates: u64,
    keys: Vec<StoredKey<K>>,
}

#[derive(Serialize, Deserialize)]
struct StoredKey<K> {
    key: K,
    updated: u64,
    observations: Vec<Observation>,
}

impl<K: Ord + Clone> From<MemoryEstimator<K>> for Stored<K> {
    fn from(e: MemoryEstimator<K>) -> Self {
        Stored {
            config: e.cfg,
            updates: e.updates,
            keys: e
                .keys
                .into_iter()
                .map(|(key, h)| StoredKey {
                    key,
                    updated: h.updated,
                    observations: h.observations.into(),
                })
                .collect(),
        }
    }
}

impl<K: Ord> TryFrom<Stored<K>> for MemoryEstimator<K> {
    type Error = EstimateError;
    /// Validates the config and every observation; trims to the bounds
    /// (most recent observations and keys kept).
    fn try_from(s: Stored<K>) -> Result<Self, EstimateError> {
        s.config.validate()?;
        let mut keys = BTreeMap::new();
        let mut updates = s.updates;
        for k in s.keys {
            for o in &k.observations {
                check(o)?;
            }
            let skip = k.observations.len().saturating_sub(s.config.window);
            updates = updates.max(k.updated);
            keys.insert(
                k.key,
                History {
                    observations: k.observations.into_iter().skip(skip).collect(),
                    updated: k.updated,
                },
            );
        }
        let mut e = MemoryEstimator {
            cfg: s.config,
            keys,
            updates,
        };
        while e.keys.len() > e.cfg.max_keys {
            e.evict_oldest();
        }
        Ok(e)
    }
}

fn check(o: &Observation) -> Result<(), EstimateError> {
    let ok = |v: f64| v.is_finite() && v >= 0.0;
    if !ok(o.instance_gb) || !ok(o.peak_gb) {
        return Err(EstimateError::Observation(format!(
            "instance {} GB, peak {} GB: not finite values >= 0",
            o.instance_gb, o.peak_gb
        )));
    }
    Ok(())
}

impl<K: Ord> MemoryEstimator<K> {
    /// An empty estimator.
    pub fn new(cfg: EstimatorConfig) -> Result<Self, EstimateError> {
        cfg.validate()?;
        Ok(MemoryEstimator {
            cfg,
            keys: BTreeMap::new(),
            updates: 0,
        })
    }

    pub fn config(&self) -> &EstimatorConfig {
        &self.cfg
    }

    /// Keys with a history.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Recent observations of `key`, oldest first.
    pub fn history(&self, key: &K) -> impl Iterator<Item = &Observation> {
        self.keys
            .get(key)
            .into_iter()
            .flat_map(|h| h.observations.iter())
    }

    /// Records one run. Errors (and records nothing) on non-finite or
    /// negative values, which a daemon may read from a broken sensor.
    pub fn record(&mut self, key: K, obs: Observation) -> Result<(), EstimateError> {
        check(&obs)?;
        self.updates += 1;
        if !self.keys.contains_key(&key) && self.keys.len() >= self.cfg.max_keys {
            self.evict_oldest();
        }
        let window = self.cfg.window;
        let h = self.keys.entry(key).or_insert_with(|| History {
            observations: VecDeque::with_capacity(window.min(64)),
            updated: 0,
        });
        while h.observations.len() >= window {
            h.observations.pop_front();
        }
        h.observations.push_back(obs);
        h.updated = self.updates;
        Ok(())
    }

    /// A run of `key` that completed with peak `peak_gb` on `instance_gb`.
    pub fn record_completion(
        &mut self,
        key: K,
        peak_gb: f64,
        instance_gb: f64,
    ) -> Result<(), EstimateError> {
        self.record(
            key,
            Observation {
                instance_gb,
                peak_gb,
                outcome: Outcome::Completed,
            },
        )
    }

    /// A run of `key` that ran out of memory on `instance_gb`.
    pub fn record_oom(&mut self, key: K, instance_gb: f64) -> Result<(), EstimateError> {
        self.record(
            key,
            Observation {
                instance_gb,
                peak_gb: instance_gb,
                outcome: Outcome::OutOfMemory,
            },
        )
    }

    /// The memory (GB) to give the next job of `key`, at most `cap_gb`
    /// (formula in the module docs); `None` without history.
    pub fn estimate(&self, key: &K, cap_gb: f64) -> Option<f64> {
        let h = self.keys.get(key)?;
        let mut peaks: Vec<f64> = Vec::with_capacity(h.observations.len());
        let mut oom_floor: Option<f64> = None;
        for o in &h.observations {
            match o.outcome {
                Outcome::Completed => peaks.push(o.peak_gb),
                Outcome::OutOfMemory => {
                    oom_floor = Some(oom_floor.map_or(o.instance_gb, |f| f.max(o.instance_gb)));
                }
            }
        }
        let q = quantile(&mut peaks, self.cfg.quantile);
        let base = match (q, oom_floor) {
            (Some(a), Some(b)) => a.max(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => return None,
        };
        let est = (base * (1.0 + self.cfg.margin)).max(base + self.cfg.min_margin_gb);
        Some(if cap_gb.is_nan() {
            est
        } else {
            est.min(cap_gb)
        })
    }

    fn evict_oldest(&mut self) {
        let oldest = self
            .keys
            .iter()
            .enumerate()
            .min_by_key(|(i, (_, h))| (h.updated, *i))
            .map(|(i, _)| i);
        if let Some(i) = oldest {
            // BTreeMap has no remove-by-index; find the key again.
            let mut n = 0;
            self.keys.retain(|_, _| {
                let keep = n != i;
                n += 1;
                keep
            });
        }
    }
}

/// Nearest-rank quantile (`q` in (0, 1]): the smallest value with at least
/// `q * n` values at or below it. Sorts `v`.
fn quantile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = (q * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn est() -> MemoryEstimator<MemoryKey> {
        MemoryEstimator::new(EstimatorConfig::default()).unwrap()
    }

    #[test]
    fn no_history_no_estimate() {
        let e = est();
        assert_eq!(e.estimate(&MemoryKey::new("a", "b"), 40.0), None);
        assert!(e.is_empty());
    }

    #[test]
    fn margin_relative_and_absolute() {
        let mut e = est();
        let k = MemoryKey::new("alice", "train.sh");
        e.record_completion(k.clone(), 20.0, 40.0).unwrap();
        // 20 * 1.1 = 22 > 20 + 1.
        assert!((e.estimate(&k, 40.0).unwrap() - 22.0).abs() < 1e-12);
        let k2 = MemoryKey::new("alice", "infer.sh");
        e.record_completion(k2.clone(), 3.0, 5.0).unwrap();
        // 3 * 1.1 = 3.3 < 3 + 1.
        assert_eq!(e.estimate(&k2, 40.0), Some(4.0));
        // Capped to the GPU.
        e.record_completion(k.clone(), 39.5, 40.0).unwrap();
        assert_eq!(e.estimate(&k, 40.0), Some(40.0));
    }

    #[test]
    fn oom_is_a_lower_bound() {
        let mut e = est();
        let k = MemoryKey::new("bob", "x");
        e.record_oom(k.clone(), 5.0).unwrap();
        assert_eq!(e.estimate(&k, 40.0), Some(6.0));
        e.record_completion(k.clone(), 7.0, 10.0).unwrap();
        assert!((e.estimate(&k, 40.0).unwrap() - 8.0).abs() < 1e-12);
        e.record_oom(k.clone(), 10.0).unwrap();
        assert!((e.estimate(&k, 40.0).unwrap() - 11.0).abs() < 1e-12);
    }

    #[test]
    fn window_and_keys_are_bounded() {
        let cfg = EstimatorConfig {
            window: 3,
            max_keys: 2,
            ..EstimatorConfig::default()
        };
        let mut e: MemoryEstimator<u32> = MemoryEstimator::new(cfg).unwrap();
        for p in [30.0, 1.0, 2.0, 3.0] {
            e.record_completion(7, p, 40.0).unwrap();
        }
        assert_eq!(e.history(&7).count(), 3);
        assert_eq!(e.estimate(&7, 40.0), Some(4.0)); // the 30 GB run fell out
        e.record_completion(8, 1.0, 5.0).unwrap();
        e.record_completion(7, 1.0, 5.0).unwrap(); // 7 is now the most recent
        e.record_completion(9, 1.0, 5.0).unwrap(); // evicts 8
        assert_eq!(e.len(), 2);
        assert!(e.estimate(&8, 40.0).is_none());
        assert!(e.estimate(&7, 40.0).is_some());
    }

    #[test]
    fn rejects_bad_input() {
        let mut e = est();
        let k = MemoryKey::new("a", "b");
        assert!(e.record_completion(k.clone(), f64::NAN, 5.0).is_err());
        assert!(e.record_oom(k.clone(), -1.0).is_err());
        assert!(e.is_empty());
        assert!(MemoryEstimator::<u32>::new(EstimatorConfig {
            quantile: 0.0,
            ..EstimatorConfig::default()
        })
        .is_err());
        assert!(MemoryEstimator::<u32>::new(EstimatorConfig {
            window: 0,
            ..EstimatorConfig::default()
        })
        .is_err());
    }

    #[test]
    fn serde_round_trip_and_trim_on_load() {
        let mut e = est();
        for i in 0..20 {
            e.record_completion(MemoryKey::new("u", "n"), f64::from(i), 40.0)
                .unwrap();
        }
        e.record_oom(MemoryKey::new("v", "m"), 10.0).unwrap();
        let s = serde_json::to_string(&e).unwrap();
        let back: MemoryEstimator<MemoryKey> = serde_json::from_str(&s).unwrap();
        assert_eq!(back, e);
        // A hand-edited state with a smaller window is trimmed on load.
        let mut v: serde_json::Value = serde_json::from_str(&s).unwrap();
        v["config"]["window"] = 4.into();
        let small: MemoryEstimator<MemoryKey> = serde_json::from_value(v).unwrap();
        assert_eq!(small.history(&MemoryKey::new("u", "n")).count(), 4);
        // Invalid observations are refused.
        let mut v: serde_json::Value = serde_json::from_str(&s).unwrap();
        v["keys"][0]["observations"][0]["peak_gb"] = (-3.0).into();
        assert!(serde_json::from_value::<MemoryEstimator<MemoryKey>>(v).is_err());
    }

    fn obs() -> impl Strategy<Value = (f64, bool)> {
        (0.1f64..80.0, proptest::bool::weighted(0.2))
    }

    proptest! {
        /// With a history shorter than the window and q = 1, the estimate
        /// covers every observation (up to the cap) and every OOM bound
        /// strictly; it never exceeds the cap.
        #[test]
        fn estimate_covers_recent_history(runs in proptest::collection::vec(obs(), 1..16), cap in 1.0f64..141.0) {
            let mut e: MemoryEstimator<u8> = MemoryEstimator::new(EstimatorConfig::default()).unwrap();
            for &(gb, oom) in &runs {
                if oom { e.record_oom(0, gb).unwrap() } else { e.record_completion(0, gb, 141.0).unwrap() }
            }
            let x = e.estimate(&0, cap).unwrap();
            prop_assert!(x <= cap);
            for &(gb, oom) in &runs {
                if oom { prop_assert!(x > gb || x == cap) } else { prop_assert!(x >= gb.min(cap)) }
            }
        }

        /// More margin never lowers the estimate; a lower quantile never raises it.
        #[test]
        fn monotone_in_margin_and_quantile(runs in proptest::collection::vec(obs(), 1..40),
                                            m1 in 0.0f64..0.5, dm in 0.0f64..0.5,
                                            q1 in 0.05f64..1.0, a1 in 0.0f64..2.0) {
            let build = |margin: f64, quantile: f64| {
                let mut e: MemoryEstimator<u8> = MemoryEstimator::new(EstimatorConfig {
                    margin, quantile, min_margin_gb: a1, ..EstimatorConfig::default()
                }).unwrap();
                for &(gb, oom) in &runs {
                    if oom { e.record_oom(0, gb).unwrap() } else { e.record_completion(0, gb, 141.0).unwrap() }
                }
                e.estimate(&0, 141.0).unwrap()
            };
            prop_assert!(build(m1 + dm, q1) >= build(m1, q1));
            prop_assert!(build(m1, q1) <= build(m1, 1.0));
        }

        /// Same observations, same state and estimates; the state survives JSON.
        #[test]
        fn deterministic_and_serializable(runs in proptest::collection::vec((0u8..5, 0.1f64..80.0, any::<bool>()), 0..60)) {
            let cfg = EstimatorConfig { window: 4, max_keys: 3, ..EstimatorConfig::default() };
            let play = || {
                let mut e: MemoryEstimator<u8> = MemoryEstimator::new(cfg.clone()).unwrap();
                for &(k, gb, oom) in &runs {
                    if oom { e.record_oom(k, gb).unwrap() } else { e.record_completion(k, gb, 141.0).unwrap() }
                }
                e
            };
            let (a, b) = (play(), play());
            prop_assert_eq!(&a, &b);
            prop_assert!(a.len() <= 3);
            for k in 0..5u8 { prop_assert!(a.history(&k).count() <= 4); }
            let back: MemoryEstimator<u8> = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
            // serde_json parses floats to within an ulp (no `float_roundtrip`
            // feature here), so compare what matters: histories and estimates.
            for k in 0..5u8 {
                prop_assert_eq!(back.history(&k).count(), a.history(&k).count());
                match (back.estimate(&k, 141.0), a.estimate(&k, 141.0)) {
                    (Some(x), Some(y)) => prop_assert!((x - y).abs() <= 1e-12 * y.max(1.0)),
                    (x, y) => prop_assert_eq!(x, y),
                }
            }
        }
    }
}
