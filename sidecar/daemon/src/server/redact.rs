//! What `status` shows to whom. Root, the Slurm user and the configured
//! `operators` see everything; any other user sees their own jobs in full
//! and everyone else's only as counts per profile, so the daemon does not
//! undo Slurm's `PrivateData=jobs` (job ids, uids, user and job names, and
//! the uuids a job would need to aim at another job's instance).

use super::auth::Roles;
use crate::protocol::{PlanStatus, StatusReply};

/// Redacts `reply` for the caller `uid`: nothing for those who see every
/// job ([`Roles::sees_everything`]: root, `slurm_user`, `operators`),
/// [`redact`] for anyone else (`user` names the caller; asked only then).
pub(super) fn for_viewer(
    reply: &mut StatusReply,
    uid: u32,
    roles: &Roles,
    user: impl FnOnce() -> String,
) {
    if !roles.sees_everything(uid) {
        redact(reply, uid, &user());
    }
}

/// Removes from `reply` what `uid` (user name `user`) may not see; others'
/// instances are added to each GPU's `others_busy` (so redacting twice
/// changes nothing).
pub fn redact(reply: &mut StatusReply, uid: u32, user: &str) {
    for gpu in &mut reply.gpus {
        let others = &mut gpu.others_busy;
        gpu.instances.retain(|i| match i.uid {
            Some(owner) if owner != uid => {
                let n = others.entry(i.profile.clone()).or_default();
                *n = n.saturating_add(1);
                false
            }
            _ => true,
        });
    }
    if let Some(m) = &mut reply.memory {
        m.estimates.retain(|e| e.user == user);
        m.oom_events.retain(|e| e.user.as_deref() == Some(user));
        // The ledger knows job ids, not owners.
        m.oom_jobs.clear();
    }
    reply.waiting.retain(|w| w.uid == Some(uid));
    redact_plans(&mut reply.pending_plans);
}

/// Plans name the jobs on the busy instances they keep (`3g.20gb@4 (job
/// 17)`): for users who may not see every job, the instances only.
pub fn redact_plans(plans: &mut [PlanStatus]) {
    for p in plans {
        for k in &mut p.keeps_busy {
            if let Some(i) = k.find(" (job ") {
                k.truncate(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use crate::mig::GpuModel;
    use crate::protocol::{
        EstimateStatus, GpuStatus, InstanceStatus, MemoryStatus, OomCause, OomDecision, OomEvent,
        OomJob, WaitingJob,
    };

    fn inst(uuid: &str, profile: &str, owner: Option<u32>) -> InstanceStatus {
        InstanceStatus {
            uuid: uuid.into(),
            profile: profile.into(),
            start: 0,
            compute: 3,
            job_id: owner.map(|u| u64::from(u) * 10),
            slurm_id: None,
            uid: owner,
            busy_since: owner.map(|_| 1),
            idle_s: owner.is_none().then_some(5),
            access_files: vec![format!("/dev/nvidia-caps/{uuid}")],
            unhealthy_xid: None,
        }
    }

    /// A status reply of one A100-40GB holding `instances`, with `memory`
    /// and nothing waiting or planned.
    fn reply(instances: Vec<InstanceStatus>, memory: MemoryStatus) -> StatusReply {
        StatusReply {
            node: "n".into(),
            version: "v".into(),
            backend: "sim".into(),
            policy: "greedy".into(),
            placement: None,
            uptime_s: 1,
            epochs: 0,
            gpus: vec![GpuStatus {
                index: 0,
                model: GpuModel::A100_40gb,
                picture: String::new(),
                layout: String::new(),
                instances,
                idle_s: 0,
                energy_j: None,
                others_busy: BTreeMap::new(),
                health: None,
            }],
            memory: Some(memory),
            epilog_missing: false,
            pending_plans: vec![],
            advise: None,
            cluster: None,
            shadow: None,
            gpu_order: None,
            holds: None,
            waiting: vec![],
        }
    }

    #[test]
    fn others_jobs_become_counts_per_profile() {
        let mut r = StatusReply {
            waiting: vec![
                WaitingJob {
                    job_id: 7,
                    gpu: 0,
                    slices: 1,
                    waiting_s: 2,
                    uid: Some(1001),
                    deadline: None,
                },
                WaitingJob {
                    job_id: 8,
                    gpu: 0,
                    slices: 1,
                    waiting_s: 2,
                    uid: Some(1002),
                    deadline: None,
                },
            ],
            ..reply(
                vec![
                    inst("MIG-a", "3g.20gb", Some(1001)),
                    inst("MIG-b", "3g.20gb", Some(1002)),
                    inst("MIG-c", "1g.5gb", Some(1002)),
                    inst("MIG-idle", "1g.5gb", None),
                ],
                MemoryStatus::default(),
            )
        };
        redact(&mut r, 1001, "alice");
        let uuids: Vec<&str> = r.gpus[0]
            .instances
            .iter()
            .map(|i| i.uuid.as_str())
            .collect();
        assert_eq!(uuids, ["MIG-a", "MIG-idle"]);
        let counts: Vec<(&str, u32)> = r.gpus[0]
            .others_busy
            .iter()
            .map(|(p, &n)| (p.as_str(), n))
            .collect();
        assert_eq!(counts, [("1g.5gb", 1), ("3g.20gb", 1)]);
        assert_eq!(r.waiting.len(), 1);
        let text = serde_json::to_string(&r).unwrap();
        for secret in ["1002", "MIG-b", "MIG-c", "\"job_id\":8"] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
    }

    fn estimate(user: &str, job_name: &str) -> EstimateStatus {
        EstimateStatus {
            user: user.into(),
            job_name: job_name.into(),
            estimate_gb: 6.0,
            runs: 2,
            ooms: 1,
            max_peak_gb: Some(5.5),
        }
    }

    fn oom_event(job_id: u64, user: &str, job_name: &str) -> OomEvent {
        OomEvent {
            at: 1_767_220_000,
            job_id,
            user: Some(user.into()),
            job_name: Some(job_name.into()),
            gpu: 0,
            profile: "1g.5gb".into(),
            memory_gb: 5,
            failures: 1,
            decision: OomDecision::Requeued,
            next_memory_gb: Some(10),
            message: format!("scontrol requeue {job_id} succeeded (attempt 1)"),
            cause: OomCause::default(),
            used_gb: None,
            predicted_gb: None,
        }
    }

    fn plan(id: u64, keeps_busy: &[&str]) -> PlanStatus {
        PlanStatus {
            id,
            gpu: 0,
            from: "3333|....".into(),
            to: "3333|1111".into(),
            destroy: vec![],
            create: vec!["1g.5gb@4".into()],
            keeps_busy: keeps_busy.iter().map(ToString::to_string).collect(),
            created_at: 1_767_220_000,
            expires_at: Some(1_767_220_600),
            applied_at: None,
            effect: None,
        }
    }

    /// A status with every section that names jobs or users filled in:
    /// alice (uid 1001) runs job 10010 and had an out-of-memory restart
    /// (job 41); bob (uid 1002) runs job 10020 and had one too (job 42);
    /// a pending plan keeps bob's instance.
    fn full_status() -> StatusReply {
        let memory = MemoryStatus {
            estimate: true,
            oom_requeue: true,
            max_retries: 2,
            oom_events: vec![
                oom_event(41, "alice", "train-alice.sh"),
                oom_event(42, "bob", "train-bob.sh"),
            ],
            oom_jobs: vec![OomJob {
                job_id: 42,
                restarts: 1,
                failures: 1,
                last_profile: "1g.5gb".into(),
                last_memory_gb: 5,
                early_restarts: 0,
            }],
            estimates: vec![
                estimate("alice", "train-alice.sh"),
                estimate("bob", "train-bob.sh"),
            ],
            plugin_oom_requeue: Some(true),
            early_restart: None,
        };
        let instances = vec![
            inst("MIG-alice", "3g.20gb", Some(1001)),
            inst("MIG-bob", "3g.20gb", Some(1002)),
        ];
        StatusReply {
            pending_plans: vec![plan(3, &["3g.20gb@0 (job 10020)"])],
            ..reply(instances, memory)
        }
    }

    /// Who sees what, for an ordinary user, an operator, the Slurm user
    /// and root, with plans, memory estimates and out-of-memory events
    /// filled in: the ordinary user loses every trace of bob (his
    /// instance, job ids, user and job names, the ledger) and the job ids
    /// in plans; the others get the reply untouched.
    #[test]
    fn status_redaction_by_role_covers_plans_estimates_and_oom_events() {
        let roles = Roles {
            slurm_uid: Some(64030),
            operators: vec![1500],
        };
        let full = full_status();
        let seen_by = |uid: u32, name: &str| {
            let mut r = full_status();
            for_viewer(&mut r, uid, &roles, || name.to_string());
            r
        };
        for (uid, name) in [(0, "root"), (1500, "op"), (64030, "slurm")] {
            assert_eq!(seen_by(uid, name), full, "uid {uid} sees everything");
        }
        let alice = seen_by(1001, "alice");
        let text = serde_json::to_string(&alice).unwrap();
        for secret in ["bob", "10020", "MIG-bob", "\"job_id\":42", "(job "] {
            assert!(!text.contains(secret), "{secret} shown to alice: {text}");
        }
        assert_eq!(alice.pending_plans[0].keeps_busy, ["3g.20gb@0"]);
        let m = alice.memory.as_ref().unwrap();
        assert_eq!(m.estimates, [estimate("alice", "train-alice.sh")]);
        assert_eq!(m.oom_events, [oom_event(41, "alice", "train-alice.sh")]);
        assert!(m.oom_jobs.is_empty());
        assert_eq!(alice.gpus[0].instances[0].uuid, "MIG-alice");
        assert_eq!(alice.gpus[0].others_busy.get("3g.20gb"), Some(&1));
        // `plan` redacts the same way: job ids gone, instances kept.
        let mut plans = vec![plan(3, &["3g.20gb@0 (job 10020)", "1g.5gb@6"])];
        redact_plans(&mut plans);
        assert_eq!(plans[0].keeps_busy, ["3g.20gb@0", "1g.5gb@6"]);
    }
}
