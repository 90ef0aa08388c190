//! Slurm accounting: the output of
//! `sacct --parsable2 --allocations -o JobIDRaw,JobID,JobName,State,Submit,Start,End,Elapsed,Timelimit,ReqTRES,AllocTRES`
//! (pipe-separated, one header line, columns in any order).
//!
//! Required: `Submit`; `Elapsed`, or `Start` and `End`; `ReqTRES` or
//! `AllocTRES`. Optional: `Timelimit`, `JobName`, `JobID`, `JobIDRaw`, `State`.
//!
//! Mapping:
//! - job steps (`JobID` containing `.`: `123.batch`, `123.0`) are dropped
//!   (`job step`): their resources belong to the allocation row;
//! - `State` `PENDING`, or `Start` `Unknown`/`None`, is dropped (`never
//!   started`); `RUNNING`, `REQUEUED`, `SUSPENDED`, `RESIZING`, or `End`
//!   `Unknown` without `Elapsed`, is dropped (`not finished`: the run time
//!   is censored);
//! - GPUs from `AllocTRES` (what the job got) or, when that is empty,
//!   `ReqTRES`: `gres/shard=K` gives K slices (rounded up to a profile size,
//!   as smartmig's Slurm integration does); K above the GPU's slices spans
//!   `ceil(K / slices)` GPUs; without shards, `gres/gpu=N` is N whole GPUs,
//!   none is dropped (`no gpu`). A job of more than one GPU is a gang job
//!   of that many whole GPUs ([`Job::gpus`]: the GPUs a multi-GPU job spans
//!   cannot be shared or split). Typed entries (`gres/gpu:a100=2`) are
//!   summed when the untyped total is absent;
//! - arrival = `Submit`; run time = `Elapsed` (or `End - Start`); work = run
//!   time x speed(k) (the job ran on k slices, or on a GPU share of k);
//! - memory need = the memory of the smallest profile with k compute slices
//!   (what `--gres=shard:K` without `--mig-mem` gets; `mem=` is host memory);
//! - deadline = `Submit + Timelimit` when a limit is given (Slurm's time
//!   limit is the user's own statement of how long the job may take);
//!   when it is `UNLIMITED`, `Partition_Limit`, empty or absent, sampled as
//!   `Submit + U(deadline_factor) x` the recorded run time (the run time on
//!   the k slices the job got, so its own run meets the deadline);
//! - class: `JobName` containing `train` is training, `infer`/`serv` is
//!   inference; otherwise whole-GPU jobs are training and sliced jobs
//!   inference (a heuristic: sacct records no class);
//! - times are Slurm's local time without a zone; only differences are used,
//!   so a DST change inside the trace shifts arrivals by an hour at most.

use std::io::Read;

use super::{
    read_all, row_rng, sample_curve, sample_deadline, Collector, Columns, FieldProblem, RowError,
    Trace, TraceError, TraceOptions,
};
use crate::workload::{default_memory_gb, round_up_to_profile, Job, JobClass};

/// Reads `sacct --parsable2` output (mapping in the module docs).
pub fn read_sacct(r: impl Read, opts: &TraceOptions) -> Result<Trace, TraceError> {
    let mut out = Collector::new(opts)?;
    let text = read_all(r)?;
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim_end_matches('\r')));
    let header = loop {
        match lines.next() {
            None => return Err(TraceError::Empty),
            Some((_, l)) if l.trim().is_empty() => continue,
            Some((_, l)) => break l,
        }
    };
    let cols = Columns::new(header.split('|'));
    let c = SacctCols {
        submit: cols.get("Submit"),
        start: cols.get("Start"),
        end: cols.get("End"),
        elapsed: cols.get("Elapsed"),
        alloc: cols.get("AllocTRES"),
        req: cols.get("ReqTRES"),
        limit: cols.get("Timelimit"),
        name: cols.get("JobName"),
        id: cols.get("JobID"),
        id_raw: cols.get("JobIDRaw"),
        state: cols.get("State"),
    };
    let mut missing = Vec::new();
    if c.submit.is_none() {
        missing.push("Submit".to_string());
    }
    if c.elapsed.is_none() && (c.start.is_none() || c.end.is_none()) {
        missing.push("Elapsed (or Start and End)".to_string());
    }
    if c.alloc.is_none() && c.req.is_none() {
        missing.push("ReqTRES (or AllocTRES)".to_string());
    }
    if !missing.is_empty() {
        return Err(cols.missing_error("sacct", &missing));
    }

    for (line, l) in lines {
        if l.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = l.split('|').map(str::trim).collect();
        if f.len() != cols.len() {
            out.bad_row(
                line,
                RowError::FieldCount {
                    expected: cols.len(),
                    found: f.len(),
                },
            )?;
            continue;
        }
        match parse_row(&f, &c, line, opts) {
            Ok(Row::Job(id, job)) => out.push(line, id, job),
            Ok(Row::Dropped(reason)) => out.drop_row(reason),
            Err(e) => out.bad_row(line, e)?,
        }
    }
    Ok(out.finish())
}

struct SacctCols {
    submit: Option<usize>,
    start: Option<usize>,
    end: Option<usize>,
    elapsed: Option<usize>,
    alloc: Option<usize>,
    req: Option<usize>,
    limit: Option<usize>,
    name: Option<usize>,
    id: Option<usize>,
    id_raw: Option<usize>,
    state: Option<usize>,
}

enum Row {
    Job(String, Job),
    Dropped(&'static str),
}

fn parse_row(f: &[&str], c: &SacctCols, line: usize, opts: &TraceOptions) -> Result<Row, RowError> {
    let get = |i: Option<usize>| i.map_or("", |i| f[i]);
    let job_id = get(c.id);
    if job_id.contains('.') {
        return Ok(Row::Dropped("job step"));
    }
    if let Some(reason) = unfinished(&get(c.state).to_ascii_uppercase()) {
        return Ok(Row::Dropped(reason));
    }
    let (submit, run) = match times(f, c)? {
        Ok(t) => t,
        Err(reason) => return Ok(Row::Dropped(reason)),
    };
    let Some((gpus, k)) = gpus_and_slices(f, c, opts)? else {
        return Ok(Row::Dropped("no gpu"));
    };
    if run <= 0.0 {
        return Ok(Row::Dropped("zero run time"));
    }
    let spec = opts.model.spec();
    let total = spec.compute_slices;
    let name = get(c.name).to_ascii_lowercase();
    let class = class_of(&name, k, total);
    let mut rng = row_rng(opts.seed, line);
    let speedup = sample_curve(&mut rng, class);
    let limit = match c.limit {
        Some(i) => parse_duration(f[i]).map_err(in_column("Timelimit"))?,
        None => None,
    };
    let mut job = Job {
        id: 0,
        arrival: submit,
        work: run * speedup.speed(k, total),
        speedup,
        memory_gb: f64::from(default_memory_gb(opts.model, k).unwrap_or(spec.memory_gb)),
        deadline: submit,
        class,
        requested_slices: Some(k),
        declared_memory_gb: None,
        template: None,
        memory_growth: None,
        gpus,
    };
    job.deadline = match limit {
        Some(l) => submit + l,
        None => sample_deadline(&mut rng, opts, &job),
    };
    let id = [get(c.id_raw), job_id]
        .into_iter()
        .find(|s| !s.is_empty())
        .map_or_else(|| format!("line{line}"), str::to_string);
    Ok(Row::Job(id, job))
}

/// Why a job in `state` (upper case) is not replayed: never started or
/// not finished.
fn unfinished(state: &str) -> Option<&'static str> {
    let state_word = state.split_whitespace().next().unwrap_or("");
    if state_word == "PENDING" {
        return Some("never started");
    }
    if matches!(
        state_word,
        "RUNNING" | "REQUEUED" | "SUSPENDED" | "RESIZING"
    ) {
        return Some("not finished");
    }
    None
}

/// The row's problem `p`, blamed on `column`.
fn in_column(column: &'static str) -> impl Fn(FieldProblem) -> RowError {
    move |p| RowError::field(column, p)
}

/// The row's submit time and run time, s (`Err`: why the row is dropped):
/// the run time is `Elapsed`, else from its start (or submit) to its end.
fn times(f: &[&str], c: &SacctCols) -> Result<Result<(f64, f64), &'static str>, RowError> {
    let get = |i: Option<usize>| i.map_or("", |i| f[i]);
    let submit = parse_time(get(c.submit))
        .map_err(in_column("Submit"))?
        .ok_or_else(|| {
            RowError::field("Submit", FieldProblem::NoTime(get(c.submit).to_string()))
        })?;
    let start = match c.start {
        Some(i) => match parse_time(f[i]).map_err(in_column("Start"))? {
            None => return Ok(Err("never started")),
            Some(t) => Some(t),
        },
        None => None,
    };
    let run = match c.elapsed {
        Some(i) => parse_duration(f[i])
            .map_err(in_column("Elapsed"))?
            .ok_or_else(|| {
                RowError::field("Elapsed", FieldProblem::NoDuration(f[i].to_string()))
            })?,
        None => {
            let end = c.end.map(|i| f[i]).unwrap_or("");
            let Some(end) = parse_time(end).map_err(in_column("End"))? else {
                return Ok(Err("not finished"));
            };
            let start = start.unwrap_or(submit);
            if end < start {
                return Err(RowError::field(
                    "End",
                    FieldProblem::Before {
                        value: end.to_string(),
                        earlier: "Start",
                        earlier_value: None,
                    },
                ));
            }
            end - start
        }
    };
    Ok(Ok((submit, run)))
}

/// The row's GPUs and compute slices per GPU (`None`: no GPU), from its
/// TRES: what was allocated, else what was asked.
fn gpus_and_slices(
    f: &[&str],
    c: &SacctCols,
    opts: &TraceOptions,
) -> Result<Option<(u32, u8)>, RowError> {
    let (tres_col, tres) = match (c.alloc.map(|i| f[i]), c.req.map(|i| f[i])) {
        (Some(a), _) if !a.is_empty() => ("AllocTRES", a),
        (_, Some(r)) => ("ReqTRES", r),
        (Some(a), None) => ("AllocTRES", a),
        (None, None) => ("ReqTRES", ""),
    };
    let g = parse_tres(tres).map_err(in_column(tres_col))?;
    let spec = opts.model.spec();
    let total = spec.compute_slices;
    let gpus = if g.shards > 0 {
        g.shards.div_ceil(u64::from(total))
    } else {
        g.gpus
    };
    if gpus == 0 {
        return Ok(None);
    }
    let gpus = u32::try_from(gpus)
        .map_err(|_| RowError::field(tres_col, FieldProblem::NotAGpuCount(gpus.to_string())))?;
    let k = if gpus == 1 && g.shards > 0 {
        // shards <= total <= 255 here, so the cast is exact.
        round_up_to_profile(opts.model, g.shards as u8).unwrap_or(total)
    } else {
        total
    };
    Ok(Some((gpus, k)))
}

/// A job's class from its name, else from its size (a whole GPU: training).
fn class_of(name: &str, k: u8, total: u8) -> JobClass {
    if name.contains("train") {
        JobClass::Training
    } else if name.contains("infer") || name.contains("serv") {
        JobClass::Inference
    } else if k == total {
        JobClass::Training
    } else {
        JobClass::Inference
    }
}

/// GPU counts of a TRES string.
#[derive(Debug, Default, PartialEq, Eq)]
struct Gres {
    gpus: u64,
    shards: u64,
}

/// `billing=1,cpu=4,gres/shard=3,mem=16G,node=1` -> shards 3. Untyped totals
/// win over typed entries (`gres/gpu=2,gres/gpu:a100=2` is 2 GPUs, not 4).
fn parse_tres(s: &str) -> Result<Gres, FieldProblem> {
    let (mut gpu, mut gpu_typed, mut shard, mut shard_typed) = (None, 0u64, None, 0u64);
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| FieldProblem::NotKeyValue(item.to_string()))?;
        let key = key.trim().to_ascii_lowercase();
        let count = || {
            value
                .trim()
                .parse::<u64>()
                .map_err(|_| FieldProblem::NotACount {
                    key: key.clone(),
                    value: value.to_string(),
                })
        };
        if key == "gres/gpu" {
            gpu = Some(count()?);
        } else if key.starts_with("gres/gpu:") {
            gpu_typed += count()?;
        } else if key == "gres/shard" {
            shard = Some(count()?);
        } else if key.starts_with("gres/shard:") {
            shard_typed += count()?;
        }
    }
    Ok(Gres {
        gpus: gpu.unwrap_or(gpu_typed),
        shards: shard.unwrap_or(shard_typed),
    })
}

/// Slurm time `YYYY-MM-DDTHH:MM:SS` as seconds since 1970 (no zone).
/// `Unknown`, `None` and empty mean "no time" (`Ok(None)`).
fn parse_time(s: &str) -> Result<Option<f64>, FieldProblem> {
    let s = s.trim();
    if s.is_empty() || s.eq_ignore_ascii_case("Unknown") || s.eq_ignore_ascii_case("None") {
        return Ok(None);
    }
    let bad = || FieldProblem::NotATime(s.to_string());
    let (date, time) = s.split_once('T').ok_or_else(bad)?;
    let d: Vec<&str> = date.split('-').collect();
    let t: Vec<&str> = time.split(':').collect();
    if d.len() != 3 || t.len() != 3 {
        return Err(bad());
    }
    let num = |x: &str| x.parse::<i64>().map_err(|_| bad());
    let (y, mo, da) = (num(d[0])?, num(d[1])?, num(d[2])?);
    let (h, mi, se) = (num(t[0])?, num(t[1])?, num(t[2])?);
    // Four-digit years only (Slurm prints nothing else): also keeps the
    // day arithmetic below far from overflow.
    if !(1..=9999).contains(&y)
        || !(1..=12).contains(&mo)
        || !(1..=31).contains(&da)
        || !(0..24).contains(&h)
        || !(0..60).contains(&mi)
        || !(0..=60).contains(&se)
    {
        return Err(bad());
    }
    let days = days_from_civil(y, mo, da);
    Ok(Some((days * 86_400 + h * 3600 + mi * 60 + se) as f64))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Slurm durations: `[DD-]HH:MM:SS`, `[DD-]HH:MM`, `DD-HH`, `MM:SS`, `MM`,
/// with optional fractional seconds. `UNLIMITED`, `Partition_Limit`,
/// `INVALID`, empty: no limit (`Ok(None)`).
fn parse_duration(s: &str) -> Result<Option<f64>, FieldProblem> {
    let s = s.trim();
    if s.is_empty()
        || ["UNLIMITED", "Partition_Limit", "INVALID", "NONE"]
            .iter()
            .any(|w| s.eq_ignore_ascii_case(w))
    {
        return Ok(None);
    }
    let bad = || FieldProblem::NotADuration(s.to_string());
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (Some(d.parse::<u64>().map_err(|_| bad())?), r),
        None => (None, s),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let int = |x: &str| x.parse::<u64>().map_err(|_| bad()).map(|v| v as f64);
    let sec = |x: &str| match x.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(bad()),
    };
    let hms = match (days.is_some(), parts.as_slice()) {
        (_, [h, m, s]) => int(h)? * 3600.0 + int(m)? * 60.0 + sec(s)?,
        (true, [h, m]) => int(h)? * 3600.0 + int(m)? * 60.0,
        (true, [h]) => int(h)? * 3600.0,
        (false, [m, s]) => int(m)? * 60.0 + sec(s)?,
        (false, [m]) => int(m)? * 60.0,
        _ => return Err(bad()),
    };
    Ok(Some(days.unwrap_or(0) as f64 * 86_400.0 + hms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::GpuModel;

    const FIXTURE: &str = include_str!("../../../../tests/data/sacct_parsable2_synthetic.txt");

    fn opts() -> TraceOptions {
        TraceOptions::new(GpuModel::A100_40gb)
    }

    #[test]
    fn times_and_durations() {
        assert_eq!(parse_time("1970-01-02T00:00:01"), Ok(Some(86_401.0)));
        assert_eq!(parse_time("2024-03-01T10:00:00"), Ok(Some(1_709_287_200.0)));
        assert_eq!(parse_time("Unknown"), Ok(None));
        assert!(parse_time("2024-13-01T10:00:00").is_err());
        assert!(parse_time("yesterday").is_err());
        assert!(parse_time("99999999999999999-01-01T00:00:00").is_err());
        assert_eq!(parse_duration("1-02:03:04"), Ok(Some(93_784.0)));
        assert_eq!(parse_duration("02:03:04"), Ok(Some(7_384.0)));
        assert_eq!(parse_duration("03:04"), Ok(Some(184.0)));
        assert_eq!(parse_duration("30"), Ok(Some(1_800.0)));
        assert_eq!(parse_duration("2-12"), Ok(Some(216_000.0)));
        assert_eq!(parse_duration("UNLIMITED"), Ok(None));
        assert_eq!(parse_duration("Partition_Limit"), Ok(None));
        assert!(parse_duration("1:2:3:4").is_err());
        assert!(parse_duration("ab:cd").is_err());
    }

    #[test]
    fn tres_strings() {
        assert_eq!(
            parse_tres("billing=1,cpu=4,gres/shard=3,mem=16G,node=1"),
            Ok(Gres { gpus: 0, shards: 3 })
        );
        assert_eq!(
            parse_tres("cpu=8,gres/gpu=1,mem=32G"),
            Ok(Gres { gpus: 1, shards: 0 })
        );
        assert_eq!(
            parse_tres("gres/gpu=2,gres/gpu:a100=2"),
            Ok(Gres { gpus: 2, shards: 0 })
        );
        assert_eq!(
            parse_tres("gres/gpu:a100=1"),
            Ok(Gres { gpus: 1, shards: 0 })
        );
        assert_eq!(parse_tres(""), Ok(Gres::default()));
        let e = parse_tres("gres/shard=x").unwrap_err();
        assert_eq!(
            e,
            FieldProblem::NotACount {
                key: "gres/shard".into(),
                value: "x".into()
            }
        );
        assert!(e.to_string().contains("\"x\" is not an integer"), "{e}");
        assert_eq!(
            parse_tres("cpu"),
            Err(FieldProblem::NotKeyValue("cpu".into()))
        );
    }

    #[test]
    fn hand_checked_fixture() {
        let t = read_sacct(FIXTURE.as_bytes(), &opts()).unwrap();
        assert_eq!(t.dropped["job step"], 7);
        assert_eq!(t.dropped["never started"], 2);
        assert_eq!(t.dropped["not finished"], 1);
        assert_eq!(t.dropped["no gpu"], 1);
        assert_eq!(t.dropped_total(), 11);
        assert_eq!(
            t.source_ids,
            ["1001", "1002", "1003", "1007", "1008", "1010", "1011", "1012"]
        );
        let j = &t.jobs;
        // 1001: shard:3 for 01:00:00, limit 02:00:00, submitted first:
        // deadline = Submit + Timelimit exactly, not sampled.
        assert_eq!((j[0].arrival, j[0].requested_slices), (0.0, Some(3)));
        assert_eq!(j[0].class, JobClass::Inference);
        assert!((j[0].runtime_on(3, 7) - 3600.0).abs() < 1e-6);
        assert_eq!(j[0].deadline, 7200.0);
        assert_eq!(j[0].memory_gb, 20.0);
        // 1002: shard:5 -> 7 slices (whole GPU): work = elapsed 1-02:03:04;
        // Timelimit UNLIMITED -> sampled deadline.
        assert_eq!(j[1].requested_slices, Some(7));
        assert_eq!(j[1].work, 93_784.0);
        assert_eq!(j[1].class, JobClass::Training);
        assert!(
            j[1].deadline >= j[1].arrival + j[1].work
                && j[1].deadline <= j[1].arrival + 1.5 * j[1].work
        );
        // 1003: gres/gpu=1 from ReqTRES (AllocTRES empty), named "bert-train".
        assert_eq!((j[2].requested_slices, j[2].memory_gb), (Some(7), 40.0));
        // 1007: gres/gpu=2 (the untyped total, not 2 + 2 typed): a gang
        // job of two whole GPUs for 04:00:00, 40 GB on each.
        assert_eq!((j[3].gpus, j[3].requested_slices), (2, Some(7)));
        assert_eq!((j[3].work, j[3].memory_gb), (14_400.0, 40.0));
        // 1008: shard:14 spans two A100s of 7 slices: two whole GPUs.
        assert_eq!((j[4].gpus, j[4].work), (2, 3600.0));
        // 1010 is an array task "1009_1" with JobIDRaw 1010, shard:1, "serve-resnet".
        assert_eq!(
            (j[5].requested_slices, j[5].memory_gb, j[5].class, j[5].gpus),
            (Some(1), 5.0, JobClass::Inference, 1)
        );
        // 1011: CANCELLED by 1000 after it ran 00:10:00 -> kept.
        assert!((j[6].runtime_on(2, 7) - 600.0).abs() < 1e-6);
        // 1012: typed gres/gpu:a100=1 only.
        assert_eq!(j[7].requested_slices, Some(7));
        assert!(j.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        for job in j {
            job.validate(GpuModel::A100_40gb).unwrap();
        }
    }

    #[test]
    fn deadline_is_the_time_limit_or_sampled_on_the_slices_used() {
        // Job 1: shard:1 for 10 min with a 30 min limit; job 2: the same
        // without a limit; job 3: a whole GPU without a limit.
        let text = "JobID|Submit|Elapsed|Timelimit|AllocTRES\n\
                    1|2024-03-01T10:00:00|00:10:00|00:30:00|gres/shard=1\n\
                    2|2024-03-01T10:00:00|00:10:00|UNLIMITED|gres/shard=1\n\
                    3|2024-03-01T10:00:00|00:10:00||gres/gpu=1\n";
        for factor in [(1.0, 1.0), (1.0, 1.5), (2.0, 2.5)] {
            let o = TraceOptions {
                deadline_factor: factor,
                ..opts()
            };
            let t = read_sacct(text.as_bytes(), &o).unwrap();
            let [limited, sliced, whole] = &t.jobs[..] else {
                panic!("{:?}", t.jobs)
            };
            assert_eq!(limited.deadline, 1800.0, "the limit wins over the factor");
            // 1g of 7: the run took 600 s there; the 7g work is shorter.
            assert!(sliced.work < 600.0);
            let slack = sliced.deadline - sliced.arrival;
            assert!(
                slack >= factor.0 * 600.0 - 1e-6 && slack <= factor.1 * 600.0 + 1e-6,
                "{factor:?}: {slack}"
            );
            assert_eq!(whole.work, 600.0);
            let slack = whole.deadline - whole.arrival;
            assert!(slack >= factor.0 * 600.0 && slack <= factor.1 * 600.0);
        }
    }

    #[test]
    fn columns_in_any_order_and_start_end() {
        let text = "End|AllocTRES|Start|Submit|JobID\n\
                    2024-03-01T11:30:00|gres/shard=2|2024-03-01T10:30:00|2024-03-01T10:00:00|7\n\
                    Unknown|gres/shard=2|2024-03-01T10:30:00|2024-03-01T10:00:00|8\n";
        let t = read_sacct(text.as_bytes(), &opts()).unwrap();
        assert_eq!(t.jobs.len(), 1);
        assert!((t.jobs[0].runtime_on(2, 7) - 3600.0).abs() < 1e-6);
        assert_eq!(t.dropped["not finished"], 1);
    }

    #[test]
    fn errors_and_lenient() {
        let text = "JobID|Submit|Elapsed|AllocTRES\n\
                    1|2024-03-01T10:00:00|00:10:00|gres/shard=1\n\
                    2|2024-03-01T10:00:00|ten minutes|gres/shard=1\n\
                    3|2024-03-01T10:00:00|00:10:00\n\
                    4|2024-03-01T10:00:00|00:10:00|gres/shard=many\n";
        let e = read_sacct(text.as_bytes(), &opts())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("line 3: column Elapsed: \"ten minutes\""),
            "{e}"
        );
        let e = read_sacct(text.as_bytes(), &opts()).unwrap_err();
        assert!(
            matches!(
                &e,
                TraceError::Row {
                    line: 3,
                    error: RowError::Field {
                        column,
                        problem: FieldProblem::NotADuration(v),
                    },
                } if column == "Elapsed" && v == "ten minutes"
            ),
            "{e:?}"
        );
        let t = read_sacct(
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
        assert!(t.skipped[1].reason.contains("expected 4 fields"));
        assert!(t.skipped[2]
            .reason
            .contains("column AllocTRES: gres/shard value \"many\""));
    }

    #[test]
    fn missing_columns_are_named() {
        let e = read_sacct("JobID|State\n".as_bytes(), &opts())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("Submit, Elapsed (or Start and End), ReqTRES (or AllocTRES)"),
            "{e}"
        );
        assert!(matches!(
            read_sacct("\n\n".as_bytes(), &opts()),
            Err(TraceError::Empty)
        ));
    }
}
