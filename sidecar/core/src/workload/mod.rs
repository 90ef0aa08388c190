//! Workloads: the job model, speed-up curves, the power model, the diurnal
//! generator, the scenario families and the trace readers.
//!
//! Everything here is pure and deterministic (seeded `ChaCha8Rng`), except
//! that the trace readers consume an `impl std::io::Read`: the CLI opens the
//! files, so the readers are tested on in-memory fixtures.
//!
//! - [`job`]: [`Job`], [`JobClass`].
//! - [`speedup`]: [`SpeedupCurve`] (calibrated on MIGProfiler data) and the
//!   per-class curve distributions [`CurveDist`].
//! - [`power`]: [`PowerModel`] and the one definition of GPU `load`.
//! - [`diurnal`]: [`DiurnalConfig`], [`generate_diurnal`], and the
//!   arrival/job-drawing core the scenarios share.
//! - The yardstick's scenario families, built on the diurnal generator's
//!   [`diurnal::JobDrawer`] and [`diurnal::generate_overlaid`], are the
//!   lab's (`smartmig_lab::scenario`).
//! - [`load`]: [`offered_load`], [`demand_load`] and the cluster size for a
//!   target load.
//! - [`trace`]: our CSV format, the Alibaba GPU v2023 trace and Slurm `sacct`.
//! - [`declare`]: under-declared memory and job templates (out-of-memory studies).
//! - [`memory_estimate`]: learned memory estimates per (user, job name).
//! - [`memory_growth`]: how a job's memory use rises to its peak, and the
//!   early-restart rule that reads the rise (shared with the daemon).
//!
//! `docs/workload.md` documents the numbers and their sources.

pub mod declare;
pub mod diurnal;
pub mod job;
pub mod load;
pub mod memory_estimate;
pub mod memory_growth;
pub mod power;
pub mod speedup;
pub mod trace;

pub use diurnal::{generate_diurnal, DiurnalConfig, JobKind, WorkDist};
pub use job::{default_memory_gb, round_up_to_profile, Job, JobClass};
pub use load::{demand_load, gpus_for_load, offered_load, peak_demand_load};
pub use memory_estimate::{EstimatorConfig, MemoryEstimator, MemoryKey};
pub use memory_growth::{EarlyRestartRule, GrowthShape, MemoryGrowth, MemorySample};
pub use power::{gpu_load, PowerModel};
pub use speedup::{CurveDist, SpeedupCurve};
pub use trace::{
    read_alibaba, read_csv, read_sacct, read_trace, window, write_csv, FieldProblem, RowError,
    SkippedRow, Trace, TraceError, TraceFormat, TraceOptions,
};

/// An invalid parameter of a workload, curve or power model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkloadError {
    /// `field` names the offending parameter as it is spelled in the config.
    #[error("invalid {field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// A scenarios file (TOML) that does not parse as a whole.
    #[error("scenarios file: {0}")]
    ScenarioFile(String),
    /// One scenario of a scenarios file is wrong; `scenario` is its name
    /// (or `#N`, its position, when it has none) and the message names the
    /// field.
    #[error("scenario {scenario:?}: {message}")]
    Scenario { scenario: String, message: String },
    #[error("no scenario `{asked}` (known: {known})")]
    NoSuchScenario { asked: String, known: String },
}

impl WorkloadError {
    pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        WorkloadError::Invalid {
            field,
            message: message.into(),
        }
    }
}
