//! What `status` shows to whom. Root, the Slurm user and the configured
//! `operators` see everything; any other user sees their own jobs in full
//! and everyone else's only as counts per profile, so the daemon does not
//! undo Slurm's `PrivateData=jobs` (job ids, uids, user and job names, and
//! the uuids a job would need to aim at another job's instance).

use crate::protocol::{PlanStatus, StatusReply};

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
    use crate::protocol::{GpuStatus, InstanceStatus, MemoryStatus, WaitingJob};

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
        }
    }

    #[test]
    fn others_jobs_become_counts_per_profile() {
        let mut r = StatusReply {
            node: "n".into(),
            version: "v".into(),
            backend: "sim".into(),
            policy: "none".into(),
            placement: None,
            uptime_s: 1,
            gpus: vec![GpuStatus {
                index: 0,
                model: GpuModel::A100_40gb,
                picture: String::new(),
                layout: String::new(),
                instances: vec![
                    inst("MIG-a", "3g.20gb", Some(1001)),
                    inst("MIG-b", "3g.20gb", Some(1002)),
                    inst("MIG-c", "1g.5gb", Some(1002)),
                    inst("MIG-idle", "1g.5gb", None),
                ],
                idle_s: 0,
                energy_j: None,
                others_busy: BTreeMap::new(),
            }],
            memory: Some(MemoryStatus::default()),
            epilog_missing: false,
            pending_plans: vec![],
            advise: None,
            cluster: None,
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
}
