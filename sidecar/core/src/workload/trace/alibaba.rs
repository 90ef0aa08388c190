//! The Alibaba GPU cluster trace v2023 (`openb_pod_list_*.csv`, public repo
//! alibaba/clusterdata, folder cluster-trace-gpu-v2023; paper "Beware of
//! Fragmentation", USENIX ATC'23).
//!
//! Columns: `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,
//! pod_phase,creation_time,deletion_time,scheduled_time` (times in s).
//! Required: `num_gpu, gpu_milli, creation_time, deletion_time,
//! scheduled_time`; optional: `name` (source id), `qos` (class),
//! `pod_phase` (censoring).
//!
//! Mapping (the reasons are in `docs/workload.md`):
//! - `num_gpu == 0` is dropped (`cpu-only`); `num_gpu > 1` is a gang job
//!   of that many whole GPUs ([`Job::gpus`]: `gpu_milli` is then the share
//!   of each, but a GPU a multi-GPU job spans cannot be shared or split, so
//!   `k` is the whole GPU and the memory need is `gpu_milli/1000 x` the
//!   GPU's memory per GPU);
//! - empty `scheduled_time` is dropped (`never scheduled`: the pod was
//!   deleted while pending and never used a GPU);
//! - arrival = `creation_time`; run time = `deletion_time - scheduled_time`
//!   (not `- creation_time`: the difference is the wait in Alibaba's own
//!   queue, which our simulator models itself); zero run time is dropped;
//! - a `Running` pod whose `deletion_time` equals the trace's last
//!   `deletion_time` was still running when the trace ended: its run time is
//!   only a lower bound, so it is dropped (`running at trace end`). Other
//!   `Running` pods have real, earlier deletion times (the phase is the last
//!   one observed before deletion) and are kept, as are `Failed` pods (they
//!   held their GPU share until they failed);
//! - size: `k` = the smallest profile compute size `>= gpu_milli/1000 x C`;
//!   `requested_slices = Some(k)` (the pod asked for that share);
//! - memory need = `gpu_milli/1000 x` GPU memory (`memory_mib` is host
//!   memory); class: `qos == LS` (latency-sensitive) is inference, every
//!   other QoS (BE, Burstable, Guaranteed) is training;
//! - work = run time x speed(k): the pod ran on a k-slice-equivalent share,
//!   so replaying it on a k-slice instance reproduces its recorded run time;
//! - curve and deadline are sampled: the curve from the class distribution,
//!   deadline = arrival + U(deadline_factor) x the recorded run time (= the
//!   run time on k slices), so the pod's own history meets its deadline.

use std::io::Read;

use super::csv::read_table;
use super::{
    parse_i64, row_rng, sample_curve, sample_deadline, Collector, Columns, FieldProblem, RowError,
    Trace, TraceError, TraceOptions,
};
use crate::workload::{round_up_to_profile, Job, JobClass};

struct Cand {
    line: usize,
    id: String,
    arrival: i64,
    start: i64,
    end: i64,
    milli: i64,
    /// `num_gpu` (>= 1).
    gpus: u32,
    class: JobClass,
    running: bool,
}

/// Reads an Alibaba GPU v2023 pod list (mapping in the module docs).
pub fn read_alibaba(r: impl Read, opts: &TraceOptions) -> Result<Trace, TraceError> {
    let mut out = Collector::new(opts)?;
    let table = read_table(r)?;
    let cols = AlibabaCols::find(&table.columns)?;
    let mut cands = Vec::new();
    // The trace's end: the last deletion time of any well-formed row.
    let mut trace_end = i64::MIN;
    for (line, fields) in table.rows {
        let parsed = fields.and_then(|f| cols.parse(&f, line, &mut trace_end, &mut out));
        match parsed {
            Ok(Some(c)) => cands.push(c),
            Ok(None) => {}
            Err(e) => out.bad_row(line, e)?,
        }
    }
    for c in cands {
        if c.running && c.end == trace_end {
            out.drop_row("running at trace end");
            continue;
        }
        match cand_job(&c, opts) {
            Some(job) => out.push(c.line, c.id, job),
            None => out.drop_row("zero run time"),
        }
    }
    Ok(out.finish())
}

/// Where the columns of the pod list are.
struct AlibabaCols {
    num: usize,
    milli: usize,
    create: usize,
    delete: usize,
    sched: usize,
    name: Option<usize>,
    qos: Option<usize>,
    phase: Option<usize>,
}

impl AlibabaCols {
    fn find(cols: &Columns) -> Result<Self, TraceError> {
        let [num, milli, create, delete, sched] = cols.require(
            "alibaba",
            [
                "num_gpu",
                "gpu_milli",
                "creation_time",
                "deletion_time",
                "scheduled_time",
            ],
        )?;
        Ok(AlibabaCols {
            num,
            milli,
            create,
            delete,
            sched,
            name: cols.get("name"),
            qos: cols.get("qos"),
            phase: cols.get("pod_phase"),
        })
    }

    /// One row as a candidate job (`None`: dropped, the reason told to
    /// `out`); every well-formed row moves `trace_end` to its deletion.
    fn parse(
        &self,
        f: &[String],
        line: usize,
        trace_end: &mut i64,
        out: &mut Collector<'_>,
    ) -> Result<Option<Cand>, RowError> {
        let num = parse_i64("num_gpu", &f[self.num])?;
        let milli = parse_i64("gpu_milli", &f[self.milli])?;
        let arrival = parse_i64("creation_time", &f[self.create])?;
        let end = parse_i64("deletion_time", &f[self.delete])?;
        *trace_end = (*trace_end).max(end);
        if num < 0 {
            return Err(RowError::field("num_gpu", FieldProblem::Negative(num)));
        }
        if num == 0 {
            out.drop_row("cpu-only (num_gpu = 0)");
            return Ok(None);
        }
        if !(1..=1000).contains(&milli) {
            return Err(RowError::field(
                "gpu_milli",
                FieldProblem::MilliOutOfRange(milli),
            ));
        }
        if f[self.sched].is_empty() {
            out.drop_row("never scheduled");
            return Ok(None);
        }
        let start = parse_i64("scheduled_time", &f[self.sched])?;
        if end < start {
            return Err(RowError::field(
                "deletion_time",
                FieldProblem::Before {
                    value: end.to_string(),
                    earlier: "scheduled_time",
                    earlier_value: Some(start.to_string()),
                },
            ));
        }
        if start < arrival {
            return Err(RowError::field(
                "scheduled_time",
                FieldProblem::Before {
                    value: start.to_string(),
                    earlier: "creation_time",
                    earlier_value: Some(arrival.to_string()),
                },
            ));
        }
        let qos = self.qos.map_or("", |i| f[i].as_str());
        let class = if qos.eq_ignore_ascii_case("LS") {
            JobClass::Inference
        } else {
            JobClass::Training
        };
        let running = self
            .phase
            .is_some_and(|i| f[i].eq_ignore_ascii_case("Running"));
        let id = self
            .name
            .map(|i| f[i].clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| format!("line{line}"));
        let gpus = u32::try_from(num)
            .map_err(|_| RowError::field("num_gpu", FieldProblem::NotAGpuCount(num.to_string())))?;
        Ok(Some(Cand {
            line,
            id,
            arrival,
            start,
            end,
            milli,
            gpus,
            class,
            running,
        }))
    }
}

/// A candidate's job (`None`: it has no run time): its slices rounded up
/// to a profile (a whole GPU for a gang job), a sampled speed-up curve and
/// deadline.
fn cand_job(c: &Cand, opts: &TraceOptions) -> Option<Job> {
    let spec = opts.model.spec();
    let total = spec.compute_slices;
    let duration = (c.end - c.start) as f64;
    if duration <= 0.0 {
        return None;
    }
    // ceil(milli x C / 1000) in integers: no float rounding at exact shares.
    let slices = ((c.milli * i64::from(total) + 999) / 1000) as u8;
    let k = if c.gpus > 1 {
        total
    } else {
        round_up_to_profile(opts.model, slices).unwrap_or(total)
    };
    let mut rng = row_rng(opts.seed, c.line);
    let speedup = sample_curve(&mut rng, c.class);
    let arrival = c.arrival as f64;
    let mut job = Job {
        id: 0,
        arrival,
        work: duration * speedup.speed(k, total),
        speedup,
        memory_gb: c.milli as f64 / 1000.0 * f64::from(spec.memory_gb),
        deadline: arrival,
        class: c.class,
        requested_slices: Some(k),
        declared_memory_gb: None,
        template: None,
        memory_growth: None,
        gpus: c.gpus,
    };
    job.deadline = sample_deadline(&mut rng, opts, &job);
    Some(job)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::GpuModel;

    const EXCERPT: &str = include_str!("../../../../tests/data/alibaba_openb_pod_list_excerpt.csv");

    fn opts() -> TraceOptions {
        TraceOptions::new(GpuModel::A100_40gb)
    }

    #[test]
    fn hand_checked_excerpt() {
        let t = read_alibaba(EXCERPT.as_bytes(), &opts()).unwrap();
        assert_eq!(t.dropped["cpu-only (num_gpu = 0)"], 3);
        assert_eq!(t.dropped["never scheduled"], 2);
        assert_eq!(t.dropped["running at trace end"], 2);
        assert_eq!(t.dropped_total(), 7);
        assert_eq!(t.jobs.len(), 18);
        assert!(t.skipped.is_empty());
        assert_eq!(t.source_ids[0], "openb-pod-0000");
        assert_eq!(t.time_offset_s, 0.0);

        let by_name = |n: &str| &t.jobs[t.source_ids.iter().position(|s| s == n).unwrap()];
        // pod-0032: gpu_milli 460 -> 3.22 slices -> 4g; LS -> inference;
        // run 9978153 - 9963454 = 14699 s; memory 0.46 x 40 GB.
        let j = by_name("openb-pod-0032");
        assert_eq!(j.requested_slices, Some(4));
        assert_eq!(j.class, JobClass::Inference);
        assert!((j.memory_gb - 18.4).abs() < 1e-9);
        assert!((j.runtime_on(4, 7) - 14699.0).abs() < 1e-6);
        assert_eq!(j.arrival, 9963454.0);
        // Deadline relative to the recorded run time (on 4g), not the 7g work.
        let slack = j.deadline - j.arrival;
        assert!(
            (14699.0 - 1e-6..=1.5 * 14699.0 + 1e-6).contains(&slack),
            "{slack}"
        );
        // pod-0039: 50 milli -> 1 slice; BE -> training; scheduled 1 s after creation.
        let j = by_name("openb-pod-0039");
        assert_eq!((j.requested_slices, j.class), (Some(1), JobClass::Training));
        assert!((j.runtime_on(1, 7) - (9981248.0 - 9973949.0)).abs() < 1e-6);
        // pod-0027: 320 milli -> 2.24 -> 3g; pod-0022: 220 -> 1.54 -> 2g.
        assert_eq!(by_name("openb-pod-0027").requested_slices, Some(3));
        assert_eq!(by_name("openb-pod-0022").requested_slices, Some(2));
        // pod-0017: 8 GPUs of 1000 milli each, a gang job of 8 whole GPUs:
        // run 10769854 - 9437497 s at speed 1, 40 GB on each.
        let j = by_name("openb-pod-0017");
        assert_eq!((j.gpus, j.requested_slices), (8, Some(7)));
        assert_eq!(j.work, 10_769_854.0 - 9_437_497.0);
        assert!((j.memory_gb - 40.0).abs() < 1e-9);
        j.validate(GpuModel::A100_40gb).unwrap();
        assert_eq!(by_name("openb-pod-0128").gpus, 8);
        // Whole-GPU pods run at speed 1: work = run time.
        let j = by_name("openb-pod-0054");
        assert_eq!((j.requested_slices, j.work), (Some(7), 3737.0));
        // A30: 460 milli of 4 slices = 1.84 -> 2g.
        let a30 = TraceOptions::new(GpuModel::A30_24gb);
        let t = read_alibaba(EXCERPT.as_bytes(), &a30).unwrap();
        let j = &t.jobs[t
            .source_ids
            .iter()
            .position(|s| s == "openb-pod-0032")
            .unwrap()];
        assert_eq!(j.requested_slices, Some(2));
    }

    #[test]
    fn deadlines_follow_the_recorded_run_time() {
        // Factor exactly 1: the deadline is the pod's own recorded end on its
        // share (scheduled at once), whatever the sampled curve.
        let tight = TraceOptions {
            deadline_factor: (1.0, 1.0),
            ..opts()
        };
        let t = read_alibaba(EXCERPT.as_bytes(), &tight).unwrap();
        let by_name = |n: &str| &t.jobs[t.source_ids.iter().position(|s| s == n).unwrap()];
        let j = by_name("openb-pod-0032");
        assert!((j.deadline - j.arrival - 14699.0).abs() < 1e-6, "{j:?}");
        let j = by_name("openb-pod-0039");
        assert!((j.deadline - j.arrival - 7299.0).abs() < 1e-6, "{j:?}");
        // A training curve is slower on 1g than on 7g: the old rule (x work)
        // would have set the deadline before the pod's recorded end.
        assert!(j.work < 0.5 * 7299.0, "{j:?}");
        for j in &t.jobs {
            let k = j.requested_slices.unwrap();
            assert!((j.deadline - j.arrival - j.runtime_on(k, 7)).abs() < 1e-6);
        }
        // A factor below 1 would make the trace's own runs late: refused.
        let e = read_alibaba(
            EXCERPT.as_bytes(),
            &TraceOptions {
                deadline_factor: (0.5, 1.0),
                ..opts()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("deadline_factor"), "{e}");
    }

    #[test]
    fn errors_and_lenient() {
        let text = "name,num_gpu,gpu_milli,creation_time,deletion_time,scheduled_time\n\
                    a,1,500,0,100,0\n\
                    b,1,abc,0,100,0\n\
                    c,1,500,0,100,0,extra\n\
                    d,1,500,50,40,45\n\
                    e,1,500,10,10,10\n";
        let e = read_alibaba(text.as_bytes(), &opts())
            .unwrap_err()
            .to_string();
        assert_eq!(e, "line 3: column gpu_milli: \"abc\" is not an integer");
        let t = read_alibaba(
            text.as_bytes(),
            &TraceOptions {
                lenient: true,
                ..opts()
            },
        )
        .unwrap();
        assert_eq!(t.jobs.len(), 1);
        assert_eq!(
            t.skipped.iter().map(|s| s.line).collect::<Vec<_>>(),
            [3, 4, 5]
        );
        assert!(t.skipped[2].reason.contains("before scheduled_time"));
        assert_eq!(t.dropped["zero run time"], 1);
        // Without pod_phase nothing counts as censored; without qos all is training.
        assert_eq!(t.jobs[0].class, JobClass::Training);
    }

    #[test]
    fn missing_columns_are_named() {
        let e = read_alibaba("name,num_gpu,creation_time\n".as_bytes(), &opts())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("gpu_milli, deletion_time, scheduled_time"),
            "{e}"
        );
        assert!(matches!(
            read_alibaba("".as_bytes(), &opts()),
            Err(TraceError::Empty)
        ));
    }

    #[test]
    fn deterministic_per_seed() {
        let a = read_alibaba(EXCERPT.as_bytes(), &opts()).unwrap();
        let b = read_alibaba(EXCERPT.as_bytes(), &opts()).unwrap();
        let c = read_alibaba(EXCERPT.as_bytes(), &TraceOptions { seed: 5, ..opts() }).unwrap();
        assert_eq!(a, b);
        assert_ne!(a.jobs, c.jobs);
    }
}
