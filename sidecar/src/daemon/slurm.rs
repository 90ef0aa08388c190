//! What the daemon asks Slurm, behind a trait so tests run without Slurm.
//!
//! Slurm 22.05 facts (brief §3): `squeue --json` and `sinfo --json` work but
//! ignore `-j`/`-n` filters, so filtering is client side; `scontrol --json`
//! does not exist; `scontrol update nodename=X AvailableFeatures=..
//! ActiveFeatures=..` replaces the whole list, so the admin's own features
//! must be read first and kept.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Why a Slurm query failed.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error("running `{cmd}`: {source}")]
    Spawn { cmd: String, source: std::io::Error },
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Failed {
        cmd: String,
        status: String,
        stderr: String,
    },
    #[error("`{cmd}` took more than {secs} s")]
    Timeout { cmd: String, secs: u64 },
    #[error("`{cmd}` printed unexpected JSON: {message}")]
    Parse { cmd: String, message: String },
}

/// A job waiting for `shards` compute slices on one GPU of some node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingShards {
    pub job_id: u64,
    pub shards: u8,
}

/// The node's features (`AvailableFeatures`, `ActiveFeatures`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFeatures {
    pub available: Vec<String>,
    pub active: Vec<String>,
}

/// The Slurm queries the daemon makes.
pub trait SlurmClient: Send + Sync {
    /// Ids of jobs that still exist (pending, running, suspended, completing).
    fn live_jobs(&self) -> Result<HashSet<u64>, SlurmError>;
    /// Pending jobs asking for `gres:shard:K`.
    fn pending_shards(&self) -> Result<Vec<PendingShards>, SlurmError>;
    fn node_features(&self, node: &str) -> Result<NodeFeatures, SlurmError>;
    fn set_node_features(&self, node: &str, features: &NodeFeatures) -> Result<(), SlurmError>;
    /// Requeues a job (`scontrol requeue <id>`): used after an
    /// out-of-memory failure. Clients that cannot requeue say so.
    fn requeue(&self, job_id: u64) -> Result<(), SlurmError> {
        Err(SlurmError::Failed {
            cmd: format!("scontrol requeue {job_id}"),
            status: "unsupported".into(),
            stderr: "this Slurm client cannot requeue jobs".into(),
        })
    }
}

/// Job states in which a job may still hold its instance.
const LIVE_STATES: &[&str] = &[
    "PENDING",
    "RUNNING",
    "SUSPENDED",
    "CONFIGURING",
    "COMPLETING",
    "REQUEUED",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
];

/// A job's state strings: 22.05 prints a string, later versions an array.
fn job_states(job: &Value) -> Vec<String> {
    match job.get("job_state") {
        Some(Value::String(s)) => vec![s.to_ascii_uppercase()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_ascii_uppercase))
            .collect(),
        _ => Vec::new(),
    }
}

fn job_id(job: &Value) -> Option<u64> {
    job.get("job_id").and_then(Value::as_u64)
}

/// Parses `squeue --json`: ids of live jobs.
pub fn parse_live_jobs(json: &Value) -> Result<HashSet<u64>, String> {
    let jobs = json
        .get("jobs")
        .and_then(Value::as_array)
        .ok_or("no `jobs` array")?;
    Ok(jobs
        .iter()
        .filter(|j| {
            job_states(j)
                .iter()
                .any(|s| LIVE_STATES.contains(&s.as_str()))
        })
        .filter_map(job_id)
        .collect())
}

/// `K` of a TRES string such as `gres:shard:3`, `gres/shard:3` or
/// `gres:gpu:1,gres:shard:2` (0 if none).
pub fn shard_count(tres: &str) -> u8 {
    tres.split(',')
        .filter_map(|part| {
            let part = part.trim().replace('/', ":");
            let rest = part.strip_prefix("gres:shard")?;
            let n = rest.rsplit(':').next()?;
            if rest.is_empty() {
                return Some(1);
            }
            n.parse::<u8>().ok()
        })
        .max()
        .unwrap_or(0)
}

/// Parses `squeue --json`: pending jobs with a shard request.
pub fn parse_pending_shards(json: &Value) -> Result<Vec<PendingShards>, String> {
    let jobs = json
        .get("jobs")
        .and_then(Value::as_array)
        .ok_or("no `jobs` array")?;
    Ok(jobs
        .iter()
        .filter(|j| job_states(j).iter().any(|s| s == "PENDING"))
        .filter_map(|j| {
            let shards = ["tres_per_node", "tres_per_job", "tres_per_task"]
                .iter()
                .filter_map(|k| j.get(*k).and_then(Value::as_str))
                .map(shard_count)
                .max()
                .unwrap_or(0);
            (shards > 0).then_some(PendingShards {
                job_id: job_id(j)?,
                shards,
            })
        })
        .collect())
}

fn split_features(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_str().map(String::from))
            .collect(),
        _ => Vec::new(),
    }
}

/// Parses `sinfo --json` (or `scontrol`-style JSON): the features of `node`.
pub fn parse_node_features(json: &Value, node: &str) -> Result<NodeFeatures, String> {
    let nodes = json
        .get("nodes")
        .and_then(Value::as_array)
        .ok_or("no `nodes` array")?;
    let n = nodes
        .iter()
        .find(|n| n.get("name").and_then(Value::as_str) == Some(node))
        .ok_or_else(|| format!("node {node} not listed"))?;
    Ok(NodeFeatures {
        available: split_features(n.get("features")),
        active: split_features(n.get("active_features")),
    })
}

/// The node features that publish a layout: one per GPU, `smartmig_gpu<i>_<sizes>`
/// (e.g. `smartmig_gpu0_4g_2g_1g`), characters Slurm accepts in feature names.
pub fn layout_features(layouts: &[(u32, Vec<u8>)]) -> Vec<String> {
    layouts
        .iter()
        .map(|(gpu, sizes)| {
            if sizes.is_empty() {
                format!("smartmig_gpu{gpu}_empty")
            } else {
                let s: Vec<String> = sizes.iter().map(|c| format!("{c}g")).collect();
                format!("smartmig_gpu{gpu}_{}", s.join("_"))
            }
        })
        .collect()
}

/// The admin's features with ours replaced by `ours`.
pub fn merge_features(current: &NodeFeatures, ours: &[String]) -> NodeFeatures {
    let keep = |list: &[String]| -> Vec<String> {
        let mut v: Vec<String> = list
            .iter()
            .filter(|f| !f.starts_with("smartmig_"))
            .cloned()
            .collect();
        v.extend(ours.iter().cloned());
        v
    };
    NodeFeatures {
        available: keep(&current.available),
        active: keep(&current.active),
    }
}

/// The real client: runs the Slurm commands with a time limit.
pub struct CommandSlurm {
    pub squeue: String,
    pub sinfo: String,
    pub scontrol: String,
    pub timeout: Duration,
}

impl CommandSlurm {
    fn run(&self, program: &str, args: &[&str]) -> Result<String, SlurmError> {
        let cmd = format!("{program} {}", args.join(" "));
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| SlurmError::Spawn {
                cmd: cmd.clone(),
                source,
            })?;
        let start = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if start.elapsed() > self.timeout => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(SlurmError::Timeout {
                        cmd,
                        secs: self.timeout.as_secs(),
                    });
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(source) => return Err(SlurmError::Spawn { cmd, source }),
            }
        }
        let out = child
            .wait_with_output()
            .map_err(|source| SlurmError::Spawn {
                cmd: cmd.clone(),
                source,
            })?;
        if !out.status.success() {
            return Err(SlurmError::Failed {
                cmd,
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn json(&self, program: &str, args: &[&str]) -> Result<Value, SlurmError> {
        let text = self.run(program, args)?;
        serde_json::from_str(&text).map_err(|e| SlurmError::Parse {
            cmd: program.to_string(),
            message: e.to_string(),
        })
    }
}

impl SlurmClient for CommandSlurm {
    fn live_jobs(&self) -> Result<HashSet<u64>, SlurmError> {
        let v = self.json(&self.squeue, &["--json"])?;
        parse_live_jobs(&v).map_err(|message| SlurmError::Parse {
            cmd: self.squeue.clone(),
            message,
        })
    }

    fn pending_shards(&self) -> Result<Vec<PendingShards>, SlurmError> {
        let v = self.json(&self.squeue, &["--json"])?;
        parse_pending_shards(&v).map_err(|message| SlurmError::Parse {
            cmd: self.squeue.clone(),
            message,
        })
    }

    fn node_features(&self, node: &str) -> Result<NodeFeatures, SlurmError> {
        let v = self.json(&self.sinfo, &["--json"])?;
        parse_node_features(&v, node).map_err(|message| SlurmError::Parse {
            cmd: self.sinfo.clone(),
            message,
        })
    }

    fn set_node_features(&self, node: &str, f: &NodeFeatures) -> Result<(), SlurmError> {
        let node_arg = format!("nodename={node}");
        let avail = format!("AvailableFeatures={}", f.available.join(","));
        let active = format!("ActiveFeatures={}", f.active.join(","));
        self.run(&self.scontrol, &["update", &node_arg, &avail, &active])
            .map(|_| ())
    }

    fn requeue(&self, job_id: u64) -> Result<(), SlurmError> {
        self.run(&self.scontrol, &["requeue", &job_id.to_string()])
            .map(|_| ())
    }
}

/// For nodes and tests without Slurm: every journaled job counts as live,
/// nothing is pending, features are not published.
pub struct NoSlurm;

impl SlurmClient for NoSlurm {
    fn live_jobs(&self) -> Result<HashSet<u64>, SlurmError> {
        Err(SlurmError::Failed {
            cmd: "squeue".into(),
            status: "disabled".into(),
            stderr: "Slurm queries are disabled (slurm.enabled = false)".into(),
        })
    }
    fn pending_shards(&self) -> Result<Vec<PendingShards>, SlurmError> {
        Ok(Vec::new())
    }
    fn node_features(&self, _node: &str) -> Result<NodeFeatures, SlurmError> {
        Ok(NodeFeatures::default())
    }
    fn set_node_features(&self, _node: &str, _f: &NodeFeatures) -> Result<(), SlurmError> {
        Ok(())
    }
    fn requeue(&self, job_id: u64) -> Result<(), SlurmError> {
        Err(SlurmError::Failed {
            cmd: format!("scontrol requeue {job_id}"),
            status: "disabled".into(),
            stderr: "Slurm queries are disabled (slurm.enabled = false)".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shard_counts_from_tres_strings() {
        assert_eq!(shard_count("gres:shard:3"), 3);
        assert_eq!(shard_count("gres/shard:2"), 2);
        assert_eq!(shard_count("gres:gpu:1,gres:shard:7"), 7);
        assert_eq!(shard_count("gres:shard"), 1);
        assert_eq!(shard_count("gres:gpu:1"), 0);
        assert_eq!(shard_count(""), 0);
    }

    #[test]
    fn squeue_json_both_state_formats() {
        let v = json!({"jobs": [
            {"job_id": 1, "job_state": "RUNNING", "tres_per_node": "gres:shard:3"},
            {"job_id": 2, "job_state": "PENDING", "tres_per_node": "gres:shard:2"},
            {"job_id": 3, "job_state": ["PENDING"], "tres_per_job": "gres/shard:4"},
            {"job_id": 4, "job_state": "COMPLETED"},
            {"job_id": 5, "job_state": "PENDING"}
        ]});
        let live = parse_live_jobs(&v).unwrap();
        assert_eq!(live, HashSet::from([1, 2, 3, 5]));
        let pending = parse_pending_shards(&v).unwrap();
        assert_eq!(
            pending,
            vec![
                PendingShards {
                    job_id: 2,
                    shards: 2
                },
                PendingShards {
                    job_id: 3,
                    shards: 4
                }
            ]
        );
        assert!(parse_live_jobs(&json!({})).is_err());
    }

    #[test]
    fn features_keep_the_admins() {
        let v = json!({"nodes": [{"name": "n1", "features": "ib,fast,smartmig_gpu0_7g", "active_features": "ib,smartmig_gpu0_7g"}]});
        let f = parse_node_features(&v, "n1").unwrap();
        let ours = layout_features(&[(0, vec![4, 2, 1]), (1, vec![])]);
        assert_eq!(ours, vec!["smartmig_gpu0_4g_2g_1g", "smartmig_gpu1_empty"]);
        let m = merge_features(&f, &ours);
        assert_eq!(
            m.available,
            vec![
                "ib",
                "fast",
                "smartmig_gpu0_4g_2g_1g",
                "smartmig_gpu1_empty"
            ]
        );
        assert_eq!(
            m.active,
            vec!["ib", "smartmig_gpu0_4g_2g_1g", "smartmig_gpu1_empty"]
        );
        assert!(parse_node_features(&v, "n2").is_err());
    }
}
