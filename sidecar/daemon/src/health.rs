//! GPU and MIG-instance health from NVML XID events: pure, no IO.
//!
//! The NVML backend hands XID events over (`Backend::xid_watch`, a
//! watcher the XID thread owns); this module says what each one means
//! ([`classify`]), keeps one GPU's marks ([`GpuHealth`], inside
//! [`crate::allocate::GpuBook`] so placement sees it under the GPU's
//! lock), and decides what the node needs from Slurm ([`node_action`]).
//! The server runs the results.
//!
//! The classes follow NVIDIA's XID catalogue ("XID Errors",
//! docs.nvidia.com/deploy/xid-errors, the per-XID "Possible causes" and
//! "Recommended action" columns):
//! - **GPU-fatal** ([`GPU_FATAL`]): the catalogue asks for a GPU reset or a
//!   node reboot, or says every process on the GPU is affected: 48 double
//!   bit ECC error, 61/62 internal micro-controller breakpoint/halt, 74
//!   NVLink error, 79 GPU has fallen off the bus, 95 uncontained ECC error
//!   (all applications on the GPU affected, reset required), 119/120 GSP
//!   RPC timeout / GSP error, 140 unrecovered ECC error. Placement stops on
//!   the GPU and the node is drained (`smartmig: gpu N xid X`) until an
//!   admin resets the GPU and resumes the node.
//! - **Application errors** ([`APPLICATION`]): 13 graphics engine
//!   exception, 31 GPU memory page fault, 43 GPU stopped processing, 45
//!   preemptive cleanup. The catalogue names user application errors as
//!   their usual cause and the action is to debug or restart the
//!   application: the hardware is fine, and MIG isolates the other
//!   instances. They are counted (metric, status, log) and the instance
//!   stays in service: rebuilding an instance after every crashing kernel
//!   would punish the next job for the last one's bug.
//! - **Everything else attributed to one GPU instance** (94 contained ECC
//!   error: "the application that encountered the error must be
//!   restarted", other processes unaffected; and any XID this table does
//!   not know) marks that instance unhealthy: no job is placed on it, and
//!   it is destroyed and rebuilt as soon as it is idle. A rebuild costs a
//!   few seconds, so the unknown case errs on the safe side.
//! - An XID not attributed to an instance and not GPU-fatal is counted
//!   only: draining a node for an XID the catalogue does not call fatal
//!   would be an outage for nothing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// XIDs after which the whole GPU is out of service (module doc).
pub const GPU_FATAL: &[u64] = &[48, 61, 62, 74, 79, 95, 119, 120, 140];

/// XIDs that usually mean the application's own error (module doc).
pub const APPLICATION: &[u64] = &[13, 31, 43, 45];

/// What NVML puts in `gpuInstanceId` when an event is not attributable to
/// one GPU instance (nvml.h, `nvmlEventData_t`).
pub const NOT_ATTRIBUTED: u32 = u32::MAX;

/// One XID event as the backend reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct XidEvent {
    /// The GPU's index.
    pub gpu: u32,
    /// The XID (`nvmlEventData_t.eventData`).
    pub xid: u64,
    /// The GPU instance it happened on; `None`: the whole GPU.
    pub gpu_instance: Option<u32>,
}

/// What an XID means for the GPU it happened on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// The GPU is out of service until reset and cleared.
    GpuFatal,
    /// The instance it happened on must be rebuilt.
    Instance,
    /// Counted and logged only.
    Counted,
}

/// The class of `xid`, given whether NVML attributed it to an instance.
pub fn classify(xid: u64, on_instance: bool) -> Severity {
    if GPU_FATAL.contains(&xid) {
        Severity::GpuFatal
    } else if APPLICATION.contains(&xid) || !on_instance {
        Severity::Counted
    } else {
        Severity::Instance
    }
}

/// An XID that put something out of service, and when (Unix seconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    pub xid: u64,
    pub at: u64,
}

/// What one recorded event changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The GPU is now out of service (or already was).
    GpuFatal,
    /// Instance `uuid` is now unhealthy.
    Instance { uuid: String },
    /// Counted only (an application error, or no instance to blame).
    Counted,
}

/// One GPU's health: the fatal mark, the unhealthy instances and the XIDs
/// seen, by number.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuHealth {
    pub fatal: Option<Mark>,
    /// Unhealthy instances by `MIG-...` uuid.
    pub instances: BTreeMap<String, Mark>,
    /// XIDs seen since start, by number.
    pub counts: BTreeMap<u64, u64>,
}

impl GpuHealth {
    /// Records `xid`, which NVML attributed to the instance `uuid` (when it
    /// named a GPU instance the daemon knows), at `now`.
    pub fn record(&mut self, xid: u64, instance: Option<&str>, now: u64) -> Verdict {
        *self.counts.entry(xid).or_default() += 1;
        match (classify(xid, instance.is_some()), instance) {
            (Severity::GpuFatal, _) => {
                self.fatal.get_or_insert(Mark { xid, at: now });
                Verdict::GpuFatal
            }
            (Severity::Instance, Some(uuid)) => {
                self.instances
                    .entry(uuid.to_string())
                    .or_insert(Mark { xid, at: now });
                Verdict::Instance {
                    uuid: uuid.to_string(),
                }
            }
            _ => Verdict::Counted,
        }
    }

    /// Whether jobs may be placed on this GPU.
    pub fn usable(&self) -> bool {
        self.fatal.is_none()
    }

    /// Whether instance `uuid` may receive a job.
    pub fn instance_ok(&self, uuid: &str) -> bool {
        !self.instances.contains_key(uuid)
    }

    /// Instance `uuid` was destroyed: its mark goes with it.
    pub fn forget(&mut self, uuid: &str) {
        self.instances.remove(uuid);
    }

    /// The GPU was reset and an admin resumed the node: the fatal mark goes
    /// (instance marks stay until their rebuild). Returns the XID cleared.
    pub fn clear(&mut self) -> Option<u64> {
        self.fatal.take().map(|m| m.xid)
    }

    /// Total XIDs seen.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }
}

/// The drain reason for a GPU out of service: what `scontrol update
/// state=drain reason=...` gets and what `smartmig doctor` looks for.
pub fn drain_reason(gpu: u32, xid: u64) -> String {
    format!("smartmig: gpu {gpu} xid {xid}")
}

/// The (GPU, XID) of a drain reason this module set, if it is one.
pub fn parse_reason(reason: &str) -> Option<(u32, u64)> {
    let rest = reason.strip_prefix("smartmig: gpu ")?;
    let (gpu, xid) = rest.split_once(" xid ")?;
    Some((gpu.trim().parse().ok()?, xid.trim().parse().ok()?))
}

/// What the node needs from Slurm, given its GPUs' fatal marks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeAction {
    Nothing,
    /// `scontrol update nodename=N state=drain reason=R`.
    Drain {
        reason: String,
    },
    /// An admin resumed the node we drained: the GPUs' fatal marks go.
    ClearMarks,
    /// The node is drained for GPU `gpu`'s XID `xid` (by an earlier run of
    /// the daemon: marks live in memory, the drain reason in Slurm): the
    /// mark is taken back, so the GPU stays out of service.
    Adopt {
        gpu: u32,
        xid: u64,
    },
}

/// The node's Slurm state against its GPUs' health.
///
/// `fatal`: (GPU, XID) of each GPU out of service, in index order;
/// `drained`/`reason`: what Slurm says of the node; `we_drained`: this
/// daemon drained it for health and has not seen it resumed since. A node
/// somebody else drained keeps its reason (a second drain would replace
/// it); a node that was drained by us and is no longer drained was resumed
/// by an admin, who is trusted to have dealt with the GPU (reset it): that
/// resume is how the daemon learns that the GPU recovered. NVML cannot
/// say it for us: after XID 79 the GPU answers nothing until a reset, and
/// after 48/95 it answers while its memory is not to be trusted.
pub fn node_action(
    fatal: &[(u32, u64)],
    drained: bool,
    reason: &str,
    we_drained: bool,
) -> NodeAction {
    if drained {
        return match parse_reason(reason) {
            Some((gpu, xid)) if !we_drained && !fatal.iter().any(|&(g, _)| g == gpu) => {
                NodeAction::Adopt { gpu, xid }
            }
            _ => NodeAction::Nothing,
        };
    }
    match fatal.first() {
        None => NodeAction::Nothing,
        Some(_) if we_drained => NodeAction::ClearMarks,
        Some(&(gpu, xid)) => NodeAction::Drain {
            reason: drain_reason(gpu, xid),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn catalogue_classes() {
        for xid in [48, 79, 95, 119, 120] {
            assert_eq!(classify(xid, true), Severity::GpuFatal, "{xid}");
            assert_eq!(classify(xid, false), Severity::GpuFatal, "{xid}");
        }
        assert_eq!(classify(94, true), Severity::Instance);
        assert_eq!(classify(94, false), Severity::Counted);
        for xid in [13, 31, 43] {
            assert_eq!(classify(xid, true), Severity::Counted, "{xid}");
        }
        assert_eq!(classify(999, true), Severity::Instance);
        assert_eq!(classify(999, false), Severity::Counted);
    }

    #[test]
    fn instance_marks_until_forgotten() {
        let mut h = GpuHealth::default();
        assert_eq!(
            h.record(94, Some("MIG-a"), 5),
            Verdict::Instance {
                uuid: "MIG-a".into()
            }
        );
        assert!(!h.instance_ok("MIG-a") && h.instance_ok("MIG-b") && h.usable());
        assert_eq!(h.record(31, Some("MIG-b"), 6), Verdict::Counted);
        assert!(h.instance_ok("MIG-b"));
        h.forget("MIG-a");
        assert!(h.instance_ok("MIG-a"));
        assert_eq!(h.total(), 2);
    }

    #[test]
    fn fatal_keeps_the_first_xid_until_cleared() {
        let mut h = GpuHealth::default();
        assert_eq!(h.record(79, None, 1), Verdict::GpuFatal);
        assert_eq!(h.record(48, Some("MIG-a"), 2), Verdict::GpuFatal);
        assert_eq!(h.fatal, Some(Mark { xid: 79, at: 1 }));
        assert!(!h.usable());
        assert_eq!(h.clear(), Some(79));
        assert!(h.usable());
        assert_eq!(h.clear(), None);
        assert_eq!(h.counts.get(&79), Some(&1));
    }

    #[test]
    fn node_actions() {
        assert_eq!(node_action(&[], false, "", false), NodeAction::Nothing);
        assert_eq!(
            node_action(&[(1, 79), (2, 48)], false, "", false),
            NodeAction::Drain {
                reason: "smartmig: gpu 1 xid 79".into()
            }
        );
        // Drained already (by us or by an admin for another reason): leave it.
        assert_eq!(
            node_action(&[(1, 79)], true, "smartmig: gpu 1 xid 79", true),
            NodeAction::Nothing
        );
        assert_eq!(
            node_action(&[(1, 79)], true, "bad fan", false),
            NodeAction::Nothing
        );
        // We drained it and it is resumed: the admin's word stands.
        assert_eq!(
            node_action(&[(1, 79)], false, "", true),
            NodeAction::ClearMarks
        );
        // A restarted daemon takes the mark back from the drain reason.
        assert_eq!(
            node_action(&[], true, "smartmig: gpu 3 xid 95", false),
            NodeAction::Adopt { gpu: 3, xid: 95 }
        );
        assert_eq!(parse_reason(&drain_reason(3, 95)), Some((3, 95)));
        assert_eq!(parse_reason("smartmig: sidecar unreachable"), None);
    }

    proptest! {
        /// Whatever the events, a GPU is usable exactly when no GPU-fatal
        /// XID was seen, only attributed non-application XIDs mark
        /// instances, and every event is counted.
        #[test]
        fn marks_follow_the_classes(events in proptest::collection::vec(
            (prop_oneof![Just(13u64), Just(31), Just(43), Just(48), Just(79), Just(94), Just(95), Just(119), 0u64..200],
             proptest::option::of(0u8..3)), 0..40)) {
            let mut h = GpuHealth::default();
            for (i, (xid, inst)) in events.iter().enumerate() {
                let uuid = inst.map(|k| format!("MIG-{k}"));
                h.record(*xid, uuid.as_deref(), i as u64);
            }
            let fatal = events.iter().any(|(x, _)| GPU_FATAL.contains(x));
            prop_assert_eq!(h.usable(), !fatal);
            for k in 0u8..3 {
                let marked = events.iter().any(|(x, i)| *i == Some(k)
                    && classify(*x, true) == Severity::Instance);
                prop_assert_eq!(h.instance_ok(&format!("MIG-{k}")), !marked);
            }
            prop_assert_eq!(h.total(), events.len() as u64);
            if let Some(m) = h.fatal {
                let first = events.iter().position(|(x, _)| GPU_FATAL.contains(x)).unwrap();
                prop_assert_eq!(m.xid, events[first].0);
            }
        }
    }
}
