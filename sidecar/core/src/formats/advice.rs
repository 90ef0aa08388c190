//! Advise mode's log (issue 22): what smartmigd saw on a node it does not
//! manage (`mode = "advise"`) and what its policy would have done, one
//! JSON object per line in `<state_dir>/advice.jsonl` (rotated to
//! `advice.jsonl.1`).
//!
//! smartmigd writes these records (`smartmig-daemon`, `server::advise`);
//! `smartmig advise report` reads them back (`eval::advise`, the replay).
//!
//! Version: the records carry no version number; the format evolves by
//! adding fields that are optional (`#[serde(default)]`), so old logs stay
//! readable, and by adding record kinds (`kind`), which older readers
//! refuse by line number. A change that cannot follow these rules needs a
//! new file name.

use serde::{Deserialize, Serialize};

use crate::mig::GpuModel;

/// The log's file name in smartmigd's `state_dir`.
pub const ADVICE_LOG: &str = "advice.jsonl";

/// One line of `advice.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AdviceRecord {
    /// The real layout of one GPU: written at start and whenever it
    /// changes (an admin or another tool reshaped it; smartmigd never does
    /// in advise mode).
    Layout {
        /// Unix seconds.
        t: f64,
        gpu: u32,
        model: GpuModel,
        /// The layout's bit set (`mig::Layout.0`) on `model`'s geometry.
        layout: u32,
        /// The same layout as `Geometry::picture` draws it, for people.
        picture: String,
    },
    /// A job that ran on one of the node's MIG instances through Slurm's
    /// native typed GRES (`--gres=gpu:3g.20gb:1`), written once it left
    /// the running state.
    Job {
        job_id: u64,
        /// GPU index from Slurm's `gres_detail`, when it shows one.
        #[serde(default)]
        gpu: Option<u32>,
        /// The MIG profile it ran on, e.g. `3g.20gb`.
        profile: String,
        /// Unix seconds: submitted, started, left the running state.
        submit: f64,
        start: f64,
        end: f64,
        #[serde(default)]
        time_limit_s: Option<u64>,
        /// Unix `--deadline`, when the job had one.
        #[serde(default)]
        deadline: Option<f64>,
    },
    /// What the policy would have done to one GPU at an epoch: written when
    /// its wish for that GPU changes, not every epoch.
    Advice {
        t: f64,
        gpu: u32,
        /// The policy's name (`greedy`, `onnx:...`).
        policy: String,
        /// Current and wished layout, as pictures.
        from: String,
        to: String,
        /// The wished layout's bit set on the GPU's geometry.
        to_layout: u32,
        /// Instances it would destroy and create (profile@start).
        destroy: Vec<String>,
        create: Vec<String>,
        /// Busy instances the change would keep.
        keeps_busy: Vec<String>,
    },
}

impl AdviceRecord {
    /// The record's time (a job's end), Unix seconds.
    pub fn time(&self) -> f64 {
        match self {
            AdviceRecord::Layout { t, .. } | AdviceRecord::Advice { t, .. } => *t,
            AdviceRecord::Job { end, .. } => *end,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_name_their_kind() {
        let r = AdviceRecord::Job {
            job_id: 7,
            gpu: Some(0),
            profile: "3g.20gb".into(),
            submit: 1.0,
            start: 2.0,
            end: 3.0,
            time_limit_s: Some(600),
            deadline: None,
        };
        let line = serde_json::to_string(&r).unwrap();
        assert!(line.starts_with(r#"{"kind":"job""#), "{line}");
        assert_eq!(serde_json::from_str::<AdviceRecord>(&line).unwrap(), r);
        let old = r#"{"kind":"job","job_id":7,"profile":"1g.5gb","submit":1,"start":2,"end":3}"#;
        assert!(serde_json::from_str::<AdviceRecord>(old).is_ok());
        assert!(serde_json::from_str::<AdviceRecord>(r#"{"kind":"nope"}"#).is_err());
    }
}
