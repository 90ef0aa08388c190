//! Room for an interactive job (issue 42): an `srun` or `salloc` job cannot
//! be requeued, so when Slurm placed it on a GPU where MIG cannot build its
//! instance, it must not fail for it. That happens when one scheduling pass
//! places several jobs on a GPU before smartmigd's hold on the stranded
//! shards exists (three jobs of 3, 3 and 1 shards on an empty A100). The
//! batch jobs that started there moments ago can be requeued and have done
//! almost nothing; [`victims`] names the fewest of them whose requeue makes
//! room. The interactive job waits for that room (a requeued job's instance
//! is freed by its epilog), and the requeued batch job starts again later.
//!
//! Pure code: the caller says which busy instances belong to young batch
//! jobs (started within its race window, not `--no-requeue`).

use crate::mig::{Geometry, Layout, Shape, SpotId};

/// A busy instance whose batch job may be requeued to make room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Young {
    pub job_id: u64,
    pub placement: SpotId,
    /// Unix seconds the job got the instance.
    pub since: u64,
}

/// The fewest `young` jobs whose instances, once free, let a `shape`
/// instance be built next to the remaining busy instances (idle ones can
/// be re-shaped); among equal counts the ones that started last (they lose
/// the least). `None` when even requeueing all of them makes no room.
pub fn victims(
    geometry: &Geometry,
    busy: Layout,
    young: &[Young],
    shape: Shape,
) -> Option<Vec<u64>> {
    let n = young.len().min(16);
    let mut best: Option<(u32, u64, u32)> = None; // (count, -age sum, mask)
    for mask in 0u32..(1 << n) {
        let freed = (0..n)
            .filter(|i| mask & (1 << i) != 0)
            .fold(Layout::EMPTY, |l, i| l.with(young[i].placement));
        let rest = busy.minus(freed);
        if geometry.candidates(rest, shape).next().is_none() {
            continue;
        }
        let count = mask.count_ones();
        let recency: u64 = (0..n)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| young[i].since)
            .sum();
        let key = (count, u64::MAX - recency, mask);
        if best.is_none_or(|b| key < b) {
            best = Some(key);
        }
    }
    best.map(|(_, _, mask)| {
        (0..n)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| young[i].job_id)
            .collect()
    })
}

/// What slurmctld's record of a job (`scontrol show job -d`) says about
/// making room: whether it is a batch job, Slurm may requeue it and it is
/// running, and the id `scontrol requeue` needs (`ARRAY_TASK` for an
/// array's task: the array's own id would requeue every task).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordFacts {
    pub batch: bool,
    pub requeue: bool,
    pub running: bool,
    pub slurm_id: String,
}

impl RecordFacts {
    /// Whether the job may be requeued to make room for another.
    pub fn may_give_way(&self) -> bool {
        self.batch && self.requeue && self.running
    }
}

/// Reads [`RecordFacts`] from a job's record; `None` when a field is
/// missing. Each field is read only from the line Slurm prints it on
/// (`JobId=` first, `JobState=`, `Requeue=... BatchFlag=`): a job name or
/// comment holding `BatchFlag=0` cannot pass for the real field, and a
/// record with two such lines (a name with a line break) is not read.
pub fn record_facts(record: &str) -> Option<RecordFacts> {
    let field = |line: &str, key: &str| -> Option<String> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .map(str::to_string)
    };
    let lines: Vec<&str> = record.lines().map(str::trim).collect();
    // Exactly one line may start with the key: a name or comment holding
    // a line break and a second such line makes the record unreadable.
    let starting = |key: &str| {
        let mut found = lines.iter().copied().filter(|l| l.starts_with(key));
        match (found.next(), found.next()) {
            (Some(line), None) => Some(line),
            _ => None,
        }
    };
    // The first line: `JobId=.. [ArrayJobId=.. ArrayTaskId=..] JobName=..`,
    // read only up to the name (the user's to choose).
    let first = lines.first().copied().filter(|l| l.starts_with("JobId="))?;
    let first = first.split(" JobName=").next().unwrap_or(first);
    let job_id = field(first, "JobId=")?;
    let state = starting("JobState=").and_then(|l| field(l, "JobState="))?;
    let flags = starting("Requeue=")?;
    let array = field(first, "ArrayJobId=")
        .and_then(|a| Some(format!("{a}_{}", field(first, "ArrayTaskId=")?)));
    Some(RecordFacts {
        batch: field(flags, "BatchFlag=")? == "1",
        requeue: field(flags, "Requeue=")? == "1",
        running: state == "RUNNING",
        slurm_id: array.unwrap_or(job_id),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::GpuModel;

    fn a100() -> &'static Geometry {
        Geometry::of(GpuModel::A100_40gb)
    }

    fn at(g: &Geometry, c: u8, m: u8, s: u8) -> SpotId {
        g.spot_id(Shape::new(c, m), s).expect("placement")
    }

    #[test]
    fn one_young_3g_makes_room_for_a_1g() {
        let g = a100();
        let (a, b) = (at(g, 3, 4, 0), at(g, 3, 4, 4));
        let busy = Layout::single(a).with(b);
        let young = [
            Young {
                job_id: 10,
                placement: a,
                since: 100,
            },
            Young {
                job_id: 11,
                placement: b,
                since: 101,
            },
        ];
        // Either frees room; the later start goes.
        assert_eq!(victims(g, busy, &young, Shape::new(1, 1)), Some(vec![11]));
        // Only an old job in the way: nothing to requeue.
        assert_eq!(victims(g, busy, &young[..0], Shape::new(1, 1)), None);
    }

    #[test]
    fn nothing_is_requeued_when_it_would_not_help() {
        let g = a100();
        // A 7g is busy with an old job; a young 1g elsewhere cannot exist,
        // and a young job that is not in the way is never named.
        let (a, b) = (at(g, 4, 4, 0), at(g, 3, 4, 4));
        let busy = Layout::single(a).with(b);
        let young = [Young {
            job_id: 5,
            placement: b,
            since: 1,
        }];
        // A 4g needs slot 0, held by the old 4g: requeueing the 3g is useless.
        assert_eq!(victims(g, busy, &young, Shape::new(4, 4)), None);
        // A 2g fits once the 3g is gone.
        assert_eq!(victims(g, busy, &young, Shape::new(2, 2)), Some(vec![5]));
    }

    /// `scontrol show job -d` of Slurm 22.05 (abridged): a batch job of an
    /// array, and an `srun` whose name and comment try to pass for a batch job.
    const BATCH_TASK: &str = "JobId=41 ArrayJobId=40 ArrayTaskId=1 JobName=train
   UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A
   Priority=1 Nice=0 Account=(null) QOS=normal
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   Nodes=n1 CPU_IDs=0 Mem=1 GRES=shard:3(IDX:0)
";
    const SRUN: &str = "JobId=42 JobName=x BatchFlag=1 Requeue=1
   UserId=bob(1001) GroupId=bob(1001) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=0 Reboot=0 ExitCode=0:0
   Comment=BatchFlag=1
";

    #[test]
    fn reads_batch_requeue_state_and_the_array_task_id() {
        let b = record_facts(BATCH_TASK).expect("facts");
        assert!(b.may_give_way());
        assert_eq!(b.slurm_id, "40_1");
        let s = record_facts(SRUN).expect("facts");
        assert!(!s.batch, "the name's BatchFlag=1 was believed");
        assert!(!s.may_give_way());
        assert_eq!(s.slurm_id, "42");
        let named = SRUN.replace("JobName=x", "JobName=x ArrayJobId=7 ArrayTaskId=1");
        assert_eq!(record_facts(&named).expect("facts").slurm_id, "42");
        let no_requeue = BATCH_TASK.replace("Requeue=1", "Requeue=0");
        assert!(!record_facts(&no_requeue).expect("facts").may_give_way());
        let pending = BATCH_TASK.replace("JobState=RUNNING", "JobState=PENDING");
        assert!(!record_facts(&pending).expect("facts").may_give_way());
        assert_eq!(record_facts("JobId=1 JobName=x"), None);
        let forged = SRUN.replace("JobName=x", "JobName=x\n   Requeue=1 BatchFlag=1");
        assert_eq!(record_facts(&forged), None);
    }
}
