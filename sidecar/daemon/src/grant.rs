//! What Slurm granted a job on this node (issue 42): the only source
//! smartmigd trusts for a job's shard count and GPU.
//!
//! The SPANK plugin reads the shards and the GPU from the step's
//! environment, which for `gpu` jobs may hold a `SLURM_SHARDS_ON_NODE` the
//! user set (docs/slurm-integration.md §9). Before it builds a job's first
//! instance, smartmigd reads slurmctld's record of the job (`scontrol show
//! job -d ID`, one single-job RPC) and [`check`]s the plugin's claim
//! against it: a job Slurm gave no shards here, shards on another GPU, or
//! fewer shards than claimed is refused, and the instance has the job's
//! granted size.
//!
//! Pure code: [`parse_grant`] reads the detail lines. Slurm 22.05 lists
//! the GPU indices (`Nodes=n1 CPU_IDs=0 Mem=0 GRES=shard:3(IDX:0)`, typed
//! GPUs `GRES=shard:mig0:3(IDX:0),shard:mig1:0(IDX:)`, whole GPUs
//! `GRES=gpu:1(IDX:1)`); 24.11 and 26.05 list a shared GRES as the job's
//! share of every GPU of the node, in index order (`GRES=shard:3(3/7,0/7)`:
//! 3 of GPU 0's 7 shards, none of GPU 1's), checked on both series' real
//! `scontrol show job -d` (docs/slurm-integration.md, "Slurm series").

/// GRES Slurm allocated to a job on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    /// `(GPU index, shards)` for each GPU the job has shards on.
    pub shards: Vec<(u32, u32)>,
    /// GPU indices the job has as whole `gpu` GRES.
    pub gpus: Vec<u32>,
}

impl Grant {
    /// The grant as a short text for messages (`shard:3 on GPU 0`,
    /// `gpu on GPU 1`, `no GPU`).
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .shards
            .iter()
            .map(|(g, n)| format!("shard:{n} on GPU {g}"))
            .collect();
        parts.extend(self.gpus.iter().map(|g| format!("gpu on GPU {g}")));
        if parts.is_empty() {
            "no GPU".into()
        } else {
            parts.join(", ")
        }
    }
}

/// Why a claim is refused. The texts name both sides: they end up in the
/// job's output and in smartmigd's log.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error(
        "Slurm granted this job no shards on this node ({granted}); the step's \
         SLURM_SHARDS_ON_NODE={claimed} is not Slurm's (set by the user, or inherited from \
         another job)"
    )]
    NoShards { claimed: u8, granted: String },
    #[error(
        "the step claims {claimed} shard(s) on GPU {gpu}, but Slurm granted this job {granted}"
    )]
    Mismatch {
        claimed: u8,
        gpu: u32,
        granted: String,
    },
    #[error("Slurm granted this job shards on several GPUs of this node ({granted}); a job gets one MIG instance per node")]
    SeveralGpus { granted: String },
    #[error("slurmctld's record of the job has no GRES line for node {node} (the job is not running here)")]
    NotHere { node: String },
}

/// The job's GRES on `node` from `scontrol show job -d` output; `None`
/// when no detail line lists the node.
pub fn parse_grant(text: &str, node: &str) -> Option<Grant> {
    let mut found = None;
    for line in text.lines().map(str::trim) {
        let Some(rest) = line.strip_prefix("Nodes=") else {
            continue;
        };
        let hosts = rest.split_whitespace().next().unwrap_or("");
        if !crate::hostlist::names_node(hosts, node) {
            continue;
        }
        let gres = rest
            .split_whitespace()
            .find_map(|w| w.strip_prefix("GRES="))
            .unwrap_or("");
        found = Some(parse_gres(gres));
    }
    found
}

/// A job's GRES on one node as Slurm prints it (`scontrol show job -d`'s
/// `GRES=` and `squeue --json`'s `gres_detail` entries): `shard:3(IDX:0)`,
/// `gpu:1(IDX:1),shard:2(IDX:1)`, `shard:a100:2(0/4,2/4)`. Entries that do
/// not parse count for nothing (a claim then finds no grant).
pub fn parse_gres(gres: &str) -> Grant {
    let mut g = Grant::default();
    for entry in split_outside(gres, '(', ')') {
        let Some((name, count, on)) = parse_entry(entry) else {
            continue;
        };
        match name {
            // Shards on several GPUs: refused by `check` (one instance
            // per job and node), whatever the split.
            "shard" if count > 0 => g
                .shards
                .extend(on.iter().map(|(i, n)| (*i, n.unwrap_or(count)))),
            "gpu" => g.gpus.extend(on.iter().map(|(i, _)| *i)),
            _ => {}
        }
    }
    g
}

/// Checks the plugin's claim (`slices` on `gpu`) against `grant` and
/// returns the shards to build: the job's grant on that GPU (a step may
/// claim fewer shards than its job, never more, never another GPU).
pub fn check(grant: &Grant, gpu: u32, slices: u8) -> Result<u8, GrantError> {
    let granted = grant.describe();
    match grant.shards.as_slice() {
        [] => Err(GrantError::NoShards {
            claimed: slices,
            granted,
        }),
        [(g, n)] if *g == gpu && u32::from(slices) <= *n => {
            u8::try_from(*n).map_err(|_| GrantError::Mismatch {
                claimed: slices,
                gpu,
                granted,
            })
        }
        [_] => Err(GrantError::Mismatch {
            claimed: slices,
            gpu,
            granted,
        }),
        _ => Err(GrantError::SeveralGpus { granted }),
    }
}

/// Splits `s` at commas outside `open`..`close` pairs (`a(IDX:0,2),b`).
fn split_outside(s: &str, open: char, close: char) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0usize);
    for (i, c) in s.char_indices() {
        if c == open {
            depth += 1;
        } else if c == close {
            depth -= 1;
        } else if c == ',' && depth == 0 {
            out.push(&s[start..i]);
            start = i + 1;
        }
    }
    out.push(&s[start..]);
    out.into_iter().filter(|e| !e.is_empty()).collect()
}

/// A GPU index, with the job's count there when Slurm prints it.
type GpuShare = (u32, Option<u32>);

/// One GRES entry: its name, its count and the GPUs it is on, each with
/// the job's own count there when Slurm says it (24.11+ shared GRES).
/// `shard:mig0:3(IDX:0)` -> ("shard", 3, [(0, None)]); `gpu:2(IDX:0-1)` ->
/// ("gpu", 2, [(0, None), (1, None)]); `shard:3(0/7,3/7)` -> ("shard", 3,
/// [(1, Some(3))]).
fn parse_entry(entry: &str) -> Option<(&str, u32, Vec<GpuShare>)> {
    let (head, tail) = entry.split_once('(').unwrap_or((entry, ""));
    let mut parts = head.split(':');
    let name = parts.next()?;
    let count = parts.next_back()?.parse().ok()?;
    let inner = tail.trim_end_matches(')');
    let on = match inner.strip_prefix("IDX:") {
        Some(idx) => expand_ranges(idx)?.into_iter().map(|i| (i, None)).collect(),
        None => shares_per_gpu(inner)?,
    };
    Some((name, count, on))
}

/// `3/7,0/7` (24.11+: the job's share of each GPU of the node, in index
/// order) -> the GPUs it has a share of, with that share; `""` -> [].
fn shares_per_gpu(s: &str) -> Option<Vec<GpuShare>> {
    let mut out = Vec::new();
    for (i, part) in s.split(',').filter(|p| !p.is_empty()).enumerate() {
        let (used, _total) = part.split_once('/')?;
        let used: u32 = used.parse().ok()?;
        if used > 0 {
            out.push((u32::try_from(i).ok()?, Some(used)));
        }
    }
    Some(out)
}

/// `0-2,5` -> [0, 1, 2, 5]; `""` -> [].
fn expand_ranges(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 1024 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHARD_JOB: &str = "JobId=22 JobName=s3\n   JobState=RUNNING Reason=None\n   \
        JOB_GRES=shard:mig0:3,shard:mig1:0\n     \
        Nodes=vm CPU_IDs=0 Mem=0 GRES=shard:mig0:3(IDX:0),shard:mig1:0(IDX:)\n   \
        TresPerNode=gres:shard:3\n";

    /// `scontrol show job -d` of a `--gres=shard:3` job on Slurm 24.11.5
    /// and 26.05.5 (the test cluster's two GPUs of 7 shards), 2026-11-28.
    const SHARD_JOB_24_11: &str = "   JOB_GRES=shard:3\n     \
        Nodes=vm CPU_IDs=0 Mem=0 GRES=shard:3(3/7,0/7)\n   TresPerNode=gres/shard:3\n";

    #[test]
    fn reads_the_per_gpu_shares_of_slurm_24_11_and_later() {
        let g = parse_grant(SHARD_JOB_24_11, "vm").expect("grant");
        assert_eq!(g.shards, vec![(0, 3)]);
        assert_eq!(check(&g, 0, 3), Ok(3));
        assert!(check(&g, 1, 3).is_err());
        let second = "     Nodes=vm CPU_IDs=0 Mem=0 GRES=shard:2(0/7,2/7)";
        assert_eq!(
            parse_grant(second, "vm").expect("grant").shards,
            vec![(1, 2)]
        );
        let split = "     Nodes=vm CPU_IDs=0 Mem=0 GRES=shard:4(2/7,2/7)";
        let g = parse_grant(split, "vm").expect("grant");
        assert_eq!(g.shards, vec![(0, 2), (1, 2)]);
        assert!(matches!(
            check(&g, 0, 2),
            Err(GrantError::SeveralGpus { .. })
        ));
        let typed = "     Nodes=vm CPU_IDs=0 Mem=0 GRES=shard:mig0:3(3/7),shard:mig1:0(0/7)";
        assert_eq!(
            parse_grant(typed, "vm").expect("grant").shards,
            vec![(0, 3)]
        );
        assert_eq!(
            parse_grant("     Nodes=vm GRES=shard:3(x/7)", "vm").map(|g| g.shards),
            Some(vec![])
        );
    }

    #[test]
    fn reads_the_shards_and_the_gpu_of_this_node() {
        let g = parse_grant(SHARD_JOB, "vm").expect("grant");
        assert_eq!(g.shards, vec![(0, 3)]);
        assert!(g.gpus.is_empty());
        assert_eq!(parse_grant(SHARD_JOB, "other"), None);
        let untyped = "     Nodes=vm CPU_IDs=1 Mem=0 GRES=shard:4(IDX:1)";
        assert_eq!(
            parse_grant(untyped, "vm").expect("grant").shards,
            vec![(1, 4)]
        );
        let gpus = "     Nodes=n[1-2] CPU_IDs=0 Mem=0 GRES=gpu:mig0:1(IDX:0),gpu:2(IDX:0-1)";
        assert_eq!(parse_grant(gpus, "n2").expect("grant").gpus, vec![0, 0, 1]);
        let split = "     Nodes=vm CPU_IDs=1 Mem=0 GRES=shard:4(IDX:0-1)";
        let g = parse_grant(split, "vm").expect("grant");
        assert!(matches!(
            check(&g, 0, 4),
            Err(GrantError::SeveralGpus { .. })
        ));
        // Not started: no detail line.
        assert_eq!(
            parse_grant("JobId=3\n   TresPerNode=gres:shard:3\n", "vm"),
            None
        );
    }

    #[test]
    fn a_claim_must_match_the_grant() {
        let shard = Grant {
            shards: vec![(0, 3)],
            gpus: vec![],
        };
        assert_eq!(check(&shard, 0, 3), Ok(3));
        // A step may use part of its job's shards; the instance is the job's.
        assert_eq!(check(&shard, 0, 1), Ok(3));
        let e = check(&shard, 1, 3).unwrap_err().to_string();
        assert_eq!(
            e,
            "the step claims 3 shard(s) on GPU 1, but Slurm granted this job shard:3 on GPU 0"
        );
        assert!(matches!(
            check(&shard, 0, 7),
            Err(GrantError::Mismatch { .. })
        ));
        let gpu = Grant {
            shards: vec![],
            gpus: vec![0],
        };
        let e = check(&gpu, 0, 7).unwrap_err().to_string();
        assert!(
            e.starts_with("Slurm granted this job no shards on this node (gpu on GPU 0); the step's SLURM_SHARDS_ON_NODE=7 is not Slurm's"),
            "{e}"
        );
        let two = Grant {
            shards: vec![(0, 3), (1, 2)],
            gpus: vec![],
        };
        assert!(matches!(
            check(&two, 0, 3),
            Err(GrantError::SeveralGpus { .. })
        ));
    }
}
