//! Trace readers: turn recorded job histories into [`Job`]s.
//!
//! Three formats (details and examples in `docs/workload.md`):
//! - [`TraceFormat::Csv`]: our own format, one row per job ([`read_csv`], [`write_csv`]).
//! - [`TraceFormat::Alibaba`]: the Alibaba GPU cluster trace v2023
//!   (`openb_pod_list_*.csv`, [`read_alibaba`]).
//! - [`TraceFormat::Sacct`]: Slurm `sacct --parsable2` output ([`read_sacct`]).
//!
//! Common rules, so that every reader yields the same shape as the generator:
//! - jobs are sorted by arrival (ties keep file order), the clock is shifted so
//!   that the first arrival is 0 (deadlines move with it), and ids are `0..n`
//!   in that order; the file's own identifier of `jobs[i]` is `source_ids[i]`;
//! - a malformed row is an error `line N: column C: ...` (N is the physical
//!   line in the file, the header being line 1); with
//!   [`TraceOptions::lenient`] it is skipped and listed in [`Trace::skipped`];
//! - a well-formed row that is out of scope (CPU-only, multi-GPU, never run,
//!   still running) is not an error: it is counted in [`Trace::dropped`] by reason;
//! - what a trace does not record (deadlines, speed-up curves) is sampled
//!   with a `ChaCha8Rng` seeded from `(seed, line)`, so a job's sampled
//!   values do not change when other rows are skipped or dropped;
//! - a sampled deadline is `arrival + U(deadline_factor) x` the job's run
//!   time on the slices it asked for (its recorded run time), or on the
//!   whole GPU when it asked for no size (`sample_deadline`): a deadline
//!   shorter than the job's own recorded run would contradict the trace.
//!
//! [`window`] cuts a time window out of a trace (e.g. one day of the
//! 149-day Alibaba file); `workload::load` sizes the cluster for a load.
//!
//! The readers never print; the caller reports the counts.

use std::collections::BTreeMap;
use std::io::Read;
use std::str::FromStr;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::speedup::lerp;
use super::{CurveDist, Job, JobClass, SpeedupCurve, WorkloadError};
use crate::mig::GpuModel;

pub mod alibaba;
pub mod csv;
pub mod sacct;

pub use self::alibaba::read_alibaba;
pub use self::csv::{read_csv, write_csv};
pub use self::sacct::read_sacct;

/// How to interpret a trace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceOptions {
    /// The GPU model the jobs will run on: sizes are rounded to its profiles
    /// and memory fractions are taken of its memory.
    pub model: GpuModel,
    /// Skip malformed rows (listed in [`Trace::skipped`]) instead of failing.
    pub lenient: bool,
    /// Seed for the sampled deadlines and speed-up curves.
    pub seed: u64,
    /// Sampled deadline = arrival + U(deadline_factor) x the run time on the
    /// requested slices (what the job got in the trace), or on the whole GPU
    /// without a request. `1 <= low <= high`, so the recorded run, started
    /// at once, meets its deadline.
    pub deadline_factor: (f64, f64),
}

impl TraceOptions {
    /// Strict, seed 0, deadline factor U(1, 1.5) (the generator's default).
    pub fn new(model: GpuModel) -> Self {
        TraceOptions {
            model,
            lenient: false,
            seed: 0,
            deadline_factor: (1.0, 1.5),
        }
    }

    /// Checks the deadline factor (finite, `1 <= low <= high`, as for the
    /// generator); every reader fails with it before sampling anything.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        super::diurnal::range("deadline_factor", self.deadline_factor, 1.0)
    }
}

/// A malformed row that was skipped in lenient mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedRow {
    /// Physical line number (the header is line 1).
    pub line: usize,
    /// Same text as the strict-mode error, without the line prefix.
    pub reason: String,
}

/// The jobs of a trace and what was left out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// Sorted by arrival, first arrival 0, ids `0..n`.
    pub jobs: Vec<Job>,
    /// Malformed rows skipped in lenient mode (empty in strict mode).
    pub skipped: Vec<SkippedRow>,
    /// Well-formed rows out of scope, counted by reason.
    pub dropped: BTreeMap<String, usize>,
    /// The trace's own identifier of each job (pod name, Slurm JobID, CSV id).
    pub source_ids: Vec<String>,
    /// Seconds subtracted from every time so that the first arrival is 0.
    pub time_offset_s: f64,
}

impl Trace {
    /// Total dropped rows.
    pub fn dropped_total(&self) -> usize {
        self.dropped.values().sum()
    }

    /// Cuts the trace into consecutive windows of `window_s` seconds by
    /// arrival (`[k w, (k + 1) w)`), each rebased to start at 0 (arrivals
    /// and deadlines shifted, ids renumbered `0..n`), so each window is a
    /// workload of its own, e.g. a training episode. Windows without jobs
    /// are left out; the result keeps the window's index `k`.
    pub fn windows(&self, window_s: f64) -> Vec<(usize, Vec<Job>)> {
        let mut out: Vec<(usize, Vec<Job>)> = Vec::new();
        if !(window_s.is_finite() && window_s > 0.0) {
            return out;
        }
        for job in &self.jobs {
            let k = (job.arrival / window_s).floor().max(0.0) as usize;
            if out.last().is_none_or(|(last, _)| *last != k) {
                out.push((k, Vec::new()));
            }
            if let Some((_, jobs)) = out.last_mut() {
                jobs.push(rebased(job, jobs.len(), k as f64 * window_s));
            }
        }
        out
    }
}

/// The jobs arriving in `[start_s, start_s + len_s)`, in their order,
/// rebased so that the window starts at 0 (arrivals and deadlines shifted,
/// ids renumbered `0..n`): one stretch of a long trace as a workload of its
/// own. Empty when `len_s` is not > 0 or a bound is not finite.
pub fn window(jobs: &[Job], start_s: f64, len_s: f64) -> Vec<Job> {
    if !(start_s.is_finite() && len_s.is_finite() && len_s > 0.0) {
        return Vec::new();
    }
    jobs.iter()
        .filter(|j| j.arrival >= start_s && j.arrival - start_s < len_s)
        .enumerate()
        .map(|(i, j)| rebased(j, i, start_s))
        .collect()
}

/// `job` as job `id` of a workload whose clock starts at `start_s`.
fn rebased(job: &Job, id: usize, start_s: f64) -> Job {
    Job {
        id: id as u64,
        arrival: job.arrival - start_s,
        deadline: job.deadline - start_s,
        ..job.clone()
    }
}

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// A malformed row (strict mode); `line` is the physical line, the
    /// header being line 1.
    #[error("line {line}: {error}")]
    Row {
        line: usize,
        #[source]
        error: RowError,
    },
    /// The header lacks required columns (the message names all of them).
    #[error("{0}")]
    Header(String),
    #[error("reading the trace: {0}")]
    Io(#[from] std::io::Error),
    /// No header line at all.
    #[error("the trace is empty (no header line)")]
    Empty,
    /// Invalid [`TraceOptions`].
    #[error(transparent)]
    Options(#[from] WorkloadError),
}

/// What is wrong with one row of a trace. [`TraceError::Row`] (strict
/// mode) adds the line; [`SkippedRow::reason`] (lenient mode) is this text.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RowError {
    /// The row does not have one field per header column.
    #[error("expected {expected} fields (as in the header), found {found}")]
    FieldCount { expected: usize, found: usize },
    /// The text is not UTF-8 from this line on (the sacct reader).
    #[error("the text is not valid UTF-8")]
    NotUtf8,
    /// A row the CSV parser rejects, in the parser's own words.
    #[error("{0}")]
    Csv(String),
    /// One field is malformed or contradicts another; `column` is its
    /// header name.
    #[error("column {column}: {problem}")]
    Field {
        column: String,
        problem: FieldProblem,
    },
}

impl RowError {
    pub(crate) fn field(column: &str, problem: FieldProblem) -> Self {
        RowError::Field {
            column: column.to_string(),
            problem,
        }
    }
}

/// What is wrong with one field; the text as written in the file is quoted
/// (`"soon" is not a number`), a parsed number is not (`0 is not > 0`).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum FieldProblem {
    #[error("{0:?} is not a number")]
    NotANumber(String),
    #[error("{0:?} is not an integer")]
    NotAnInteger(String),
    #[error("not valid UTF-8")]
    NotUtf8,
    /// A number that must be positive, as written.
    #[error("{0} is not > 0")]
    NotPositive(String),
    #[error("{0:?} is not `training` or `inference`")]
    NotAClass(String),
    /// `requested_slices` outside what the GPU model has.
    #[error("{value} is not in 1..={max} for {model}")]
    SlicesOutOfRange {
        value: i64,
        max: u8,
        model: GpuModel,
    },
    /// A speed-up parameter outside (0, 1].
    #[error("{0} is not in (0, 1]")]
    NotAFraction(f64),
    /// Alibaba's `gpu_milli` outside 1..=1000.
    #[error("{0} is not in 1..=1000")]
    MilliOutOfRange(i64),
    #[error("{0} is negative")]
    Negative(i64),
    /// A time (`value`, as the message shows it) before the time it must
    /// follow: the column `earlier`, with its value where the message
    /// shows it.
    #[error("{value} is before {earlier}{}", .earlier_value.as_ref().map(|v| format!(" {v}")).unwrap_or_default())]
    Before {
        value: String,
        earlier: &'static str,
        earlier_value: Option<String>,
    },
    /// A Slurm time that does not parse.
    #[error("{0:?} is not a time like 2024-03-01T10:00:00")]
    NotATime(String),
    /// A Slurm time that is required but unset (`Unknown`, empty).
    #[error("{0:?} is not a time")]
    NoTime(String),
    /// A Slurm duration that does not parse.
    #[error("{0:?} is not a duration like [DD-]HH:MM:SS")]
    NotADuration(String),
    /// A Slurm duration that is required but unset (`UNLIMITED`, empty).
    #[error("{0:?} is not a duration")]
    NoDuration(String),
    /// A TRES entry without `=`.
    #[error("{0:?} is not key=value")]
    NotKeyValue(String),
    /// A TRES GPU or shard count that is not an integer.
    #[error("{key} value {value:?} is not an integer")]
    NotACount { key: String, value: String },
    /// A GPU count below 1 or beyond what a job can span.
    #[error("{0:?} is not a GPU count (an integer from 1 to 2^32-1)")]
    NotAGpuCount(String),
    /// A multi-GPU job that asks for part of a GPU: a job spanning GPUs
    /// needs each of them whole.
    #[error("a job of {gpus} GPUs runs on whole GPUs ({whole} slices each), not on {value}")]
    GangNotWhole { gpus: u32, value: u8, whole: u8 },
}

/// The trace formats `smartmig` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TraceFormat {
    Csv,
    Alibaba,
    Sacct,
}

impl TraceFormat {
    pub const ALL: [TraceFormat; 3] = [TraceFormat::Csv, TraceFormat::Alibaba, TraceFormat::Sacct];

    pub fn as_str(self) -> &'static str {
        match self {
            TraceFormat::Csv => "csv",
            TraceFormat::Alibaba => "alibaba",
            TraceFormat::Sacct => "sacct",
        }
    }
}

impl std::fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error of [`TraceFormat::from_str`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown trace format `{0}` (known: csv, alibaba, sacct)")]
pub struct UnknownTraceFormat(pub String);

impl FromStr for TraceFormat {
    type Err = UnknownTraceFormat;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TraceFormat::ALL
            .into_iter()
            .find(|f| f.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownTraceFormat(s.to_string()))
    }
}

/// Reads a trace of the given format.
pub fn read_trace(
    format: TraceFormat,
    r: impl Read,
    opts: &TraceOptions,
) -> Result<Trace, TraceError> {
    match format {
        TraceFormat::Csv => read_csv(r, opts),
        TraceFormat::Alibaba => read_alibaba(r, opts),
        TraceFormat::Sacct => read_sacct(r, opts),
    }
}

// ---------------------------------------------------------------------------
// Shared machinery of the readers.

/// Default curve distribution of a class, for traces that record none.
pub(crate) fn class_curves(class: JobClass) -> CurveDist {
    match class {
        JobClass::Training => CurveDist::TRAINING,
        JobClass::Inference => CurveDist::INFERENCE,
    }
}

/// The RNG of one row: independent of every other row.
pub(crate) fn row_rng(seed: u64, line: usize) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(line as u64);
    rng
}

/// Draws the deadline of a trace job whose other fields are set: arrival +
/// U(deadline_factor) x its run time on the `requested_slices` it got (the
/// whole GPU when it asked for no size). Relative to the whole-GPU work, a
/// job that ran for T on a 30 % share would get a deadline below T, and its
/// own recorded run would be late.
pub(crate) fn sample_deadline(rng: &mut ChaCha8Rng, opts: &TraceOptions, job: &Job) -> f64 {
    use rand::Rng;
    let total = opts.model.spec().compute_slices;
    let run = job
        .requested_slices
        .map_or(job.work, |k| job.runtime_on(k, total));
    job.arrival + lerp(opts.deadline_factor, rng.random()) * run
}

/// Draws a curve of the class.
pub(crate) fn sample_curve(rng: &mut ChaCha8Rng, class: JobClass) -> SpeedupCurve {
    class_curves(class).sample(rng)
}

/// Collects rows, errors and drops, and assembles the [`Trace`].
pub(crate) struct Collector<'a> {
    opts: &'a TraceOptions,
    rows: Vec<(usize, String, Job)>,
    skipped: Vec<SkippedRow>,
    dropped: BTreeMap<String, usize>,
}

impl<'a> Collector<'a> {
    /// Fails on invalid options, so that no reader samples with them.
    pub(crate) fn new(opts: &'a TraceOptions) -> Result<Self, TraceError> {
        opts.validate()?;
        Ok(Collector {
            opts,
            rows: Vec::new(),
            skipped: Vec::new(),
            dropped: BTreeMap::new(),
        })
    }

    /// A malformed row: an error in strict mode, a skip in lenient mode.
    pub(crate) fn bad_row(&mut self, line: usize, error: RowError) -> Result<(), TraceError> {
        if self.opts.lenient {
            self.skipped.push(SkippedRow {
                line,
                reason: error.to_string(),
            });
            Ok(())
        } else {
            Err(TraceError::Row { line, error })
        }
    }

    pub(crate) fn drop_row(&mut self, reason: &str) {
        *self.dropped.entry(reason.to_string()).or_default() += 1;
    }

    pub(crate) fn push(&mut self, line: usize, source_id: String, job: Job) {
        self.rows.push((line, source_id, job));
    }

    /// Sorts, shifts the clock to the first arrival and numbers the jobs.
    pub(crate) fn finish(mut self) -> Trace {
        self.rows
            .sort_by(|a, b| a.2.arrival.total_cmp(&b.2.arrival).then(a.0.cmp(&b.0)));
        let offset = self.rows.first().map_or(0.0, |r| r.2.arrival);
        let mut jobs = Vec::with_capacity(self.rows.len());
        let mut source_ids = Vec::with_capacity(self.rows.len());
        for (i, (_, sid, mut job)) in self.rows.into_iter().enumerate() {
            job.id = i as u64;
            job.arrival -= offset;
            job.deadline -= offset;
            jobs.push(job);
            source_ids.push(sid);
        }
        Trace {
            jobs,
            skipped: self.skipped,
            dropped: self.dropped,
            source_ids,
            time_offset_s: offset,
        }
    }
}

/// Column lookup by (case-insensitive, trimmed) header name.
pub(crate) struct Columns {
    names: Vec<String>,
}

impl Columns {
    pub(crate) fn new<'s>(names: impl IntoIterator<Item = &'s str>) -> Self {
        Columns {
            names: names.into_iter().map(|n| n.trim().to_string()).collect(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    pub(crate) fn get(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n.eq_ignore_ascii_case(name))
    }

    /// The index of each of `names`, or an error naming every one the
    /// header lacks (one message for all of them).
    pub(crate) fn require<const N: usize>(
        &self,
        format: &str,
        names: [&str; N],
    ) -> Result<[usize; N], TraceError> {
        let missing: Vec<String> = names
            .iter()
            .filter(|c| self.get(c).is_none())
            .map(std::string::ToString::to_string)
            .collect();
        if !missing.is_empty() {
            return Err(self.missing_error(format, &missing));
        }
        Ok(names.map(|n| self.get(n).unwrap_or(0)))
    }

    /// Error naming every missing requirement. Each requirement is a list of
    /// alternatives, any of which satisfies it (e.g. `Elapsed` or `Start`+`End`
    /// is expressed by the caller).
    pub(crate) fn missing_error(&self, format: &str, missing: &[String]) -> TraceError {
        TraceError::Header(format!(
            "{format} trace: missing required column(s): {} (header has: {})",
            missing.join(", "),
            if self.names.is_empty() {
                "nothing".to_string()
            } else {
                self.names.join(", ")
            }
        ))
    }
}

/// `column C: "v" is not a number` style parse helpers.
pub(crate) fn parse_f64(col: &str, v: &str) -> Result<f64, RowError> {
    match v.trim().parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(x),
        _ => Err(RowError::field(
            col,
            FieldProblem::NotANumber(v.to_string()),
        )),
    }
}

pub(crate) fn parse_i64(col: &str, v: &str) -> Result<i64, RowError> {
    v.trim()
        .parse::<i64>()
        .map_err(|_| RowError::field(col, FieldProblem::NotAnInteger(v.to_string())))
}

/// Reads the whole input as text lines; `\r\n` endings are accepted.
pub(crate) fn read_all(mut r: impl Read) -> Result<String, TraceError> {
    let mut bytes = Vec::new();
    r.read_to_end(&mut bytes)?;
    String::from_utf8(bytes).map_err(|e| {
        let line = e.as_bytes()[..e.utf8_error().valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1;
        TraceError::Row {
            line,
            error: RowError::NotUtf8,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_rebase_and_renumber() {
        let opts = TraceOptions::new(GpuModel::A100_40gb);
        let csv = "arrival_s,work_s,memory_gb,class,deadline_s\n\
                   0,10,4,inference,100\n50,10,4,inference,90\n\
                   250,10,4,inference,400\n260,10,4,inference,300\n";
        let t = read_trace(TraceFormat::Csv, csv.as_bytes(), &opts).unwrap();
        let w = t.windows(100.0);
        // Window 1 ([100, 200)) has no job and is left out.
        assert_eq!(
            w.iter().map(|(k, j)| (*k, j.len())).collect::<Vec<_>>(),
            vec![(0, 2), (2, 2)]
        );
        let (_, second) = &w[1];
        assert_eq!(second[0].id, 0);
        assert_eq!(second[1].id, 1);
        assert_eq!(second[0].arrival, 50.0);
        assert_eq!(second[0].deadline, 200.0);
        assert_eq!(second[1].deadline, 100.0);
        assert!(t.windows(0.0).is_empty());
        assert!(t.windows(f64::NAN).is_empty());
    }

    #[test]
    fn one_window_rebases_and_renumbers() {
        let opts = TraceOptions::new(GpuModel::A100_40gb);
        let csv = "arrival_s,work_s,memory_gb,class,deadline_s\n\
                   0,10,4,inference,100\n50,10,4,inference,90\n\
                   250,10,4,inference,400\n260,10,4,inference,300\n\
                   300,10,4,inference,350\n";
        let t = read_trace(TraceFormat::Csv, csv.as_bytes(), &opts).unwrap();
        // [250, 300): the job at 300 is out, the window's start is in.
        let w = window(&t.jobs, 250.0, 50.0);
        assert_eq!(w.len(), 2);
        assert_eq!((w[0].id, w[0].arrival, w[0].deadline), (0, 0.0, 150.0));
        assert_eq!((w[1].id, w[1].arrival, w[1].deadline), (1, 10.0, 50.0));
        assert_eq!(w[0].work, t.jobs[2].work);
        // The same jobs as the matching window of Trace::windows.
        let ws = t.windows(50.0);
        assert_eq!(ws.iter().find(|(k, _)| *k == 5).map(|(_, j)| j), Some(&w));
        assert_eq!(window(&t.jobs, 0.0, 1e9).len(), 5);
        assert!(window(&t.jobs, 301.0, 100.0).is_empty());
        assert!(window(&t.jobs, 0.0, 0.0).is_empty());
        assert!(window(&t.jobs, f64::NAN, 10.0).is_empty());
        assert!(window(&t.jobs, 0.0, f64::INFINITY).is_empty());
    }

    #[test]
    fn deadline_factor_is_validated() {
        let ok = TraceOptions::new(GpuModel::A100_40gb);
        ok.validate().unwrap();
        let csv = "arrival_s,work_s,memory_gb,class\n5,10,4,inference\n";
        for bad in [(1.5, 1.2), (-1.0, 1.0), (0.5, 1.0), (1.0, f64::NAN)] {
            let o = TraceOptions {
                deadline_factor: bad,
                ..ok
            };
            let e = o.validate().unwrap_err().to_string();
            assert!(e.contains("deadline_factor"), "{e}");
            for f in TraceFormat::ALL {
                let e = read_trace(f, csv.as_bytes(), &o).unwrap_err();
                assert!(matches!(e, TraceError::Options(_)), "{f}: {e}");
            }
        }
    }

    #[test]
    fn format_names() {
        for f in TraceFormat::ALL {
            assert_eq!(f.as_str().parse::<TraceFormat>().unwrap(), f);
        }
        assert_eq!("SACCT".parse::<TraceFormat>().unwrap(), TraceFormat::Sacct);
        let e = "parquet".parse::<TraceFormat>().unwrap_err().to_string();
        assert!(e.contains("parquet") && e.contains("alibaba"), "{e}");
    }

    #[test]
    fn read_trace_dispatches() {
        let opts = TraceOptions::new(GpuModel::A100_40gb);
        let csv = "arrival_s,work_s,memory_gb,class\n5,10,4,inference\n";
        let t = read_trace(TraceFormat::Csv, csv.as_bytes(), &opts).unwrap();
        assert_eq!(t.jobs.len(), 1);
        assert!(matches!(
            read_trace(TraceFormat::Sacct, "".as_bytes(), &opts),
            Err(TraceError::Empty)
        ));
    }

    #[test]
    fn row_rngs_are_independent_and_reproducible() {
        use rand::Rng;
        let a: u64 = row_rng(1, 5).random();
        let b: u64 = row_rng(1, 5).random();
        let c: u64 = row_rng(1, 6).random();
        let d: u64 = row_rng(2, 5).random();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }
}
