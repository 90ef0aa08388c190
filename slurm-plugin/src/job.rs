//! What a job step asked Slurm for, read from the step's environment in
//! slurmstepd (pure: the caller passes a lookup function, so it is tested
//! without Slurm).
//!
//! Trust (verified on Slurm 22.05.8, tried as ordinary users, issue 42):
//! slurmstepd's step environment is the user's submission environment plus
//! what Slurm's GRES plugins set. For a job with `shard` GRES they overwrite
//! `SLURM_SHARDS_ON_NODE`, `CUDA_VISIBLE_DEVICES` and `SLURM_JOB_GPUS`; for
//! a job without GRES they remove them. For a job with `gpu` GRES they set
//! the GPU variables but **leave a `SLURM_SHARDS_ON_NODE` the user set**
//! (`SLURM_SHARDS_ON_NODE=7 srun --gres=gpu:1`, or a `gpu` job submitted
//! from inside a shard job, which inherits it). So:
//!
//! - the *presence* of the GPU variables is Slurm's (a job without GRES has
//!   none), and their absence together with `SLURM_SHARDS_ON_NODE` cannot
//!   happen for a shard job;
//! - a `SLURM_SHARDS_ON_NODE` next to them may be the user's: the shard
//!   count and GPU read here are a *claim*, which smartmigd checks against
//!   slurmctld's record of the job before it builds anything, refusing a
//!   mismatch ([`step_gres`] is never the last word);
//! - GPU variables without `SLURM_SHARDS_ON_NODE` are a whole-GPU step
//!   ([`whole_gpus`]), which gets no MIG instance.

pub use smartmig_client::protocol::BATCH_STEP;
/// Slurm's step id of the extern step (`SLURM_EXTERN_CONT`), which runs no
/// user task that needs a GPU.
pub const EXTERN_STEP: u32 = 0xFFFF_FFFC;

/// Slurm's "no value" for a `u32` item (`NO_VAL`): an array task id of a
/// job that is not an array task.
const NO_VAL: u32 = 0xFFFF_FFFE;

/// The array task a job is, from Slurm's SPANK items `S_JOB_ARRAY_ID` and
/// `S_JOB_ARRAY_TASK_ID` (never from `SLURM_ARRAY_*` in the job's
/// environment, which the user sets: issue 53 requeued another user's job
/// through `SLURM_ARRAY_TASK_ID=0,15`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArrayTask(Option<(u32, u32)>);

impl ArrayTask {
    /// From the two items as read (`None`: Slurm did not answer). Slurm
    /// reports array id 0 for a job that is not an array task.
    pub fn new(array_job_id: Option<u32>, task_id: Option<u32>) -> ArrayTask {
        match (array_job_id, task_id) {
            (Some(a), Some(t)) if a != 0 && a != NO_VAL && t != NO_VAL => ArrayTask(Some((a, t))),
            _ => ArrayTask(None),
        }
    }

    /// The id `scontrol requeue` must name for job `job_id` and no other:
    /// `A_T` for an array task (a bare array job id would requeue every
    /// task of the array), else the job id. Digits and `_` only, so it is
    /// one job whatever the items held.
    pub fn requeue_target(self, job_id: u32) -> String {
        match self.0 {
            Some((array, task)) => format!("{array}_{task}"),
            None => job_id.to_string(),
        }
    }
}

/// The shards a step holds on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepGres {
    /// GPU index on this node (the sidecar's GPU numbering).
    pub gpu: u32,
    /// Compute slices: Slurm's shard count on this node.
    pub shards: u8,
    /// Which variable gave the GPU index (for the log).
    pub gpu_source: &'static str,
}

/// Why the step's shard variables make no sense (the step has shards, but
/// no one GPU index and count can be read from them). `variable` is the
/// variable the GPU index was read from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StepGresError {
    #[error("SLURM_SHARDS_ON_NODE=`{raw}` is not a number")]
    ShardsNotANumber { raw: String },
    #[error("SLURM_SHARDS_ON_NODE={shards}: more shards than any GPU has")]
    TooManyShards { shards: u32 },
    /// `first` is the step's own GPU variable (`SLURM_JOB_GPUS` or
    /// `SLURM_STEP_GPUS`).
    #[error(
        "the step has {shards} shard(s) but neither {first} nor \
         CUDA_VISIBLE_DEVICES says which GPU they are on"
    )]
    NoGpu { shards: u8, first: &'static str },
    #[error(
        "{variable}={value}: the step's shards are on several GPUs; a shard job gets \
         its shards from one GPU (do not combine --gres=shard with --gres=gpu)"
    )]
    SeveralGpus {
        variable: &'static str,
        value: String,
    },
    #[error("{variable}=`{value}` is not a GPU index (was CUDA_VISIBLE_DEVICES already changed?)")]
    NotAGpuIndex {
        variable: &'static str,
        value: String,
    },
}

/// Reads the step's shard count and GPU index.
///
/// `Ok(None)`: the step has no shards, and the plugin must leave it alone.
/// `Err`: it has shards but the variables make no sense (several GPUs, a
/// non-number): the step cannot be given one MIG instance.
///
/// The GPU index comes from the first of these that is set: for the batch
/// step `SLURM_JOB_GPUS`, for other steps `SLURM_STEP_GPUS` (both global
/// indices set by Slurm), then `CUDA_VISIBLE_DEVICES`. The global indices go
/// first because with `ConstrainDevices=yes` Slurm renumbers
/// `CUDA_VISIBLE_DEVICES` from 0 inside the job's device cgroup.
pub fn step_gres(
    step: u32,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<StepGres>, StepGresError> {
    let Some(raw) = lookup("SLURM_SHARDS_ON_NODE") else {
        return Ok(None);
    };
    let Ok(shards) = raw.trim().parse::<u32>() else {
        return Err(StepGresError::ShardsNotANumber { raw });
    };
    if shards == 0 {
        return Ok(None);
    }
    let shards = u8::try_from(shards).map_err(|_| StepGresError::TooManyShards { shards })?;
    let first = if step == BATCH_STEP {
        "SLURM_JOB_GPUS"
    } else {
        "SLURM_STEP_GPUS"
    };
    let (source, value) = [first, "CUDA_VISIBLE_DEVICES"]
        .into_iter()
        .find_map(|name| {
            lookup(name)
                .filter(|v| !v.trim().is_empty())
                .map(|v| (name, v))
        })
        .ok_or(StepGresError::NoGpu { shards, first })?;
    let value = value.trim().to_string();
    if value.contains(',') {
        return Err(StepGresError::SeveralGpus {
            variable: source,
            value,
        });
    }
    let Ok(gpu) = value.parse::<u32>() else {
        return Err(StepGresError::NotAGpuIndex {
            variable: source,
            value,
        });
    };
    Ok(Some(StepGres {
        gpu,
        shards,
        gpu_source: source,
    }))
}

/// A step Slurm gave whole GPUs (`gpu` GRES) and no shards: the variable
/// and value naming them (`SLURM_JOB_GPUS` for the batch step, else
/// `SLURM_STEP_GPUS`, then `CUDA_VISIBLE_DEVICES`). Call it when
/// [`step_gres`] found no shards: Slurm removes these variables from jobs
/// without GRES, so a user cannot fake a whole-GPU step. `None`: the step
/// has no GPU.
pub fn whole_gpus(
    step: u32,
    lookup: impl Fn(&str) -> Option<String>,
) -> Option<(&'static str, String)> {
    let first = if step == BATCH_STEP {
        "SLURM_JOB_GPUS"
    } else {
        "SLURM_STEP_GPUS"
    };
    [first, "CUDA_VISIBLE_DEVICES"]
        .into_iter()
        .find_map(|name| {
            lookup(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty() && !v.eq_ignore_ascii_case("NoDevFiles"))
                .map(|v| (name, v))
        })
}

/// Why a whole-GPU step ([`whole_gpus`]) may not run on a smartmig node
/// (`gpu_jobs=fail`): on a GPU in MIG mode it gets no instance of its own
/// and Slurm 22.05 can run it beside the GPU's shard jobs (once one shard
/// job of a GPU ends, Slurm offers the GPU as a `gpu` again although others
/// still hold shards of it), unisolated. The text says what to ask for.
pub fn whole_gpu_refusal(job_id: u32, variable: &str, gpus: &str) -> String {
    format!(
        "job {job_id}: a whole-GPU job ({variable}={gpus}) gets no MIG instance on this \
         smartmig node, and would share the GPU with its shard jobs unisolated; ask \
         --gres=shard:K for K compute slices, or --gres=shard:7 for a whole GPU as one MIG \
         instance (4 on an A30; where the site runs smartmig's job_submit.lua, \
         --gres=gpu:1 is billed so)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn a_requeue_names_the_steps_own_job_only() {
        assert_eq!(
            ArrayTask::new(Some(0), Some(NO_VAL)).requeue_target(15),
            "15"
        );
        assert_eq!(ArrayTask::new(None, None).requeue_target(15), "15");
        assert_eq!(ArrayTask::new(Some(14), Some(1)).requeue_target(15), "14_1");
        assert_eq!(
            ArrayTask::new(Some(14), Some(NO_VAL)).requeue_target(15),
            "15"
        );
        assert_eq!(ArrayTask::new(Some(14), None).requeue_target(15), "15");
        // Whatever the items say, the target is one id: digits and `_`.
        for (a, t) in [(u32::MAX, u32::MAX), (1, 0), (NO_VAL, 3)] {
            let id = ArrayTask::new(Some(a), Some(t)).requeue_target(7);
            assert!(
                id.chars().all(|c| c.is_ascii_digit() || c == '_') && id.matches('_').count() <= 1,
                "{id}"
            );
        }
    }

    #[test]
    fn no_shards_means_untouched() {
        assert_eq!(
            step_gres(BATCH_STEP, env(&[("CUDA_VISIBLE_DEVICES", "0")])),
            Ok(None)
        );
        assert_eq!(
            step_gres(
                0,
                env(&[("SLURM_SHARDS_ON_NODE", "0"), ("CUDA_VISIBLE_DEVICES", "1")])
            ),
            Ok(None)
        );
    }

    #[test]
    fn batch_step_prefers_job_gpus() {
        let g = step_gres(
            BATCH_STEP,
            env(&[
                ("SLURM_SHARDS_ON_NODE", "3"),
                ("SLURM_JOB_GPUS", "1"),
                ("CUDA_VISIBLE_DEVICES", "0"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!((g.gpu, g.shards, g.gpu_source), (1, 3, "SLURM_JOB_GPUS"));
    }

    #[test]
    fn other_steps_use_step_gpus_then_cvd() {
        let g = step_gres(
            0,
            env(&[
                ("SLURM_SHARDS_ON_NODE", "2"),
                ("SLURM_JOB_GPUS", "0"),
                ("CUDA_VISIBLE_DEVICES", "1"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!((g.gpu, g.gpu_source), (1, "CUDA_VISIBLE_DEVICES"));
        let g = step_gres(
            0,
            env(&[("SLURM_SHARDS_ON_NODE", "2"), ("SLURM_STEP_GPUS", "1")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!((g.gpu, g.gpu_source), (1, "SLURM_STEP_GPUS"));
    }

    #[test]
    fn gpu_variables_without_shards_are_a_whole_gpu_step() {
        assert_eq!(
            whole_gpus(BATCH_STEP, env(&[("SLURM_JOB_GPUS", "0,1")])),
            Some(("SLURM_JOB_GPUS", "0,1".into()))
        );
        assert_eq!(
            whole_gpus(0, env(&[("CUDA_VISIBLE_DEVICES", "1")])),
            Some(("CUDA_VISIBLE_DEVICES", "1".into()))
        );
        assert_eq!(whole_gpus(0, env(&[("CUDA_VISIBLE_DEVICES", " ")])), None);
        assert_eq!(whole_gpus(BATCH_STEP, env(&[])), None);
    }

    #[test]
    fn nonsense_is_an_error_not_a_guess() {
        for (pairs, want) in [
            (
                vec![("SLURM_SHARDS_ON_NODE", "x")],
                StepGresError::ShardsNotANumber { raw: "x".into() },
            ),
            (
                vec![("SLURM_SHARDS_ON_NODE", "3")],
                StepGresError::NoGpu {
                    shards: 3,
                    first: "SLURM_JOB_GPUS",
                },
            ),
            (
                vec![
                    ("SLURM_SHARDS_ON_NODE", "3"),
                    ("CUDA_VISIBLE_DEVICES", "0,1"),
                ],
                StepGresError::SeveralGpus {
                    variable: "CUDA_VISIBLE_DEVICES",
                    value: "0,1".into(),
                },
            ),
            (
                vec![
                    ("SLURM_SHARDS_ON_NODE", "3"),
                    ("CUDA_VISIBLE_DEVICES", "MIG-abc"),
                ],
                StepGresError::NotAGpuIndex {
                    variable: "CUDA_VISIBLE_DEVICES",
                    value: "MIG-abc".into(),
                },
            ),
            (
                vec![
                    ("SLURM_SHARDS_ON_NODE", "300"),
                    ("CUDA_VISIBLE_DEVICES", "0"),
                ],
                StepGresError::TooManyShards { shards: 300 },
            ),
        ] {
            assert_eq!(step_gres(BATCH_STEP, env(&pairs)), Err(want), "{pairs:?}");
        }
        let e = step_gres(
            BATCH_STEP,
            env(&[("SLURM_SHARDS_ON_NODE", "2"), ("SLURM_JOB_GPUS", "x")]),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "SLURM_JOB_GPUS=`x` is not a GPU index (was CUDA_VISIBLE_DEVICES already changed?)"
        );
    }
}
