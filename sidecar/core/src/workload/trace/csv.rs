//! smartmig's own job CSV: one row per job, the [`Job`] fields in seconds.
//!
//! ```text
//! id,arrival_s,work_s,memory_gb,class,deadline_s,requested_slices,speedup_beta,speedup_saturation
//! train-1,0,3600,24,training,5000,,1,0.9
//! serve-7,30,120,4.5,inference,,2,,
//! ```
//!
//! Required columns: `arrival_s`, `work_s`, `memory_gb`, `class`; optional
//! (the column may be absent, or a cell empty): `id` (kept as the source id),
//! `deadline_s` (empty: sampled, arrival + U(deadline_factor) x the run time
//! on `requested_slices`, or x `work_s` without a request),
//! `requested_slices` (rounded up to a profile size, as Slurm does),
//! `speedup_beta` and `speedup_saturation` (both empty: sampled from the
//! class's distribution; one empty: that one is 1.0), `gpus` (empty: 1;
//! more is a gang job of that many whole GPUs, [`Job::gpus`], whose
//! `requested_slices` is empty or the whole GPU and whose `memory_gb` is
//! per GPU). Column order is free.

use std::io::{Read, Write};

use super::{
    parse_f64, parse_i64, row_rng, sample_curve, sample_deadline, Collector, Columns, FieldProblem,
    RowError, Trace, TraceError, TraceOptions,
};
use rand_chacha::ChaCha8Rng;

use crate::workload::{round_up_to_profile, Job, JobClass, SpeedupCurve};

/// The columns [`write_csv`] writes, in order.
pub const CSV_COLUMNS: [&str; 10] = [
    "id",
    "arrival_s",
    "work_s",
    "memory_gb",
    "class",
    "deadline_s",
    "requested_slices",
    "speedup_beta",
    "speedup_saturation",
    "gpus",
];

/// A parsed CSV table: header and `(line, fields)` records, or a row error.
pub(crate) struct Table {
    pub(crate) columns: Columns,
    pub(crate) rows: Vec<(usize, Result<Vec<String>, RowError>)>,
}

/// Reads a comma-separated table with a header line (RFC 4180 quoting,
/// fields trimmed, blank lines ignored). Rows with the wrong number of fields
/// come back as row errors so that lenient mode can skip them.
pub(crate) fn read_table(r: impl Read) -> Result<Table, TraceError> {
    let mut rdr = ::csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .trim(::csv::Trim::All)
        .from_reader(r);
    let header = rdr.byte_headers().map_err(csv_error)?.clone();
    if header.is_empty() {
        return Err(TraceError::Empty);
    }
    let names: Vec<String> = header
        .iter()
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    let columns = Columns::new(names.iter().map(String::as_str));
    let mut rows = Vec::new();
    let mut rec = ::csv::ByteRecord::new();
    loop {
        match rdr.read_byte_record(&mut rec) {
            Ok(false) => break,
            Ok(true) => {
                let line = rec.position().map_or(0, |p| p.line() as usize);
                // A lone empty field is a line of spaces: ignore it like a blank line.
                if rec.len() == 1 && rec[0].is_empty() {
                    continue;
                }
                let fields = if rec.len() != columns.len() {
                    Err(RowError::FieldCount {
                        expected: columns.len(),
                        found: rec.len(),
                    })
                } else {
                    rec.iter()
                        .enumerate()
                        .map(|(i, f)| {
                            std::str::from_utf8(f)
                                .map(str::to_string)
                                .map_err(|_| RowError::field(&names[i], FieldProblem::NotUtf8))
                        })
                        .collect()
                };
                rows.push((line, fields));
            }
            Err(e) => match e.kind() {
                ::csv::ErrorKind::Io(_) => return Err(csv_error(e)),
                _ => {
                    let line = e.position().map_or(0, |p| p.line() as usize);
                    rows.push((line, Err(RowError::Csv(e.to_string()))));
                }
            },
        }
    }
    Ok(Table { columns, rows })
}

fn csv_error(e: ::csv::Error) -> TraceError {
    let line = e.position().map_or(1, |p| p.line() as usize);
    match e.into_kind() {
        ::csv::ErrorKind::Io(io) => TraceError::Io(io),
        other => TraceError::Row {
            line,
            error: RowError::Csv(format!("{other:?}")),
        },
    }
}

/// Reads smartmig's job CSV (format in the module docs).
pub fn read_csv(r: impl Read, opts: &TraceOptions) -> Result<Trace, TraceError> {
    let mut out = Collector::new(opts)?;
    let table = read_table(r)?;
    let cols = &table.columns;
    let [arrival, work, memory, class] =
        cols.require("csv", ["arrival_s", "work_s", "memory_gb", "class"])?;
    let ix = |n: &str| cols.get(n);
    let c = CsvCols {
        id: ix("id"),
        arrival,
        work,
        memory,
        class,
        deadline: ix("deadline_s"),
        requested: ix("requested_slices"),
        beta: ix("speedup_beta"),
        saturation: ix("speedup_saturation"),
        gpus: ix("gpus"),
    };
    for (line, fields) in table.rows {
        let parsed = fields.and_then(|f| parse_row(&f, &c, line, opts));
        match parsed {
            Ok(Row::Job(id, job)) => out.push(line, id, job),
            Ok(Row::Dropped(reason)) => out.drop_row(reason),
            Err(e) => out.bad_row(line, e)?,
        }
    }
    Ok(out.finish())
}

struct CsvCols {
    id: Option<usize>,
    arrival: usize,
    work: usize,
    memory: usize,
    class: usize,
    deadline: Option<usize>,
    requested: Option<usize>,
    beta: Option<usize>,
    saturation: Option<usize>,
    gpus: Option<usize>,
}

enum Row {
    Job(String, Job),
    Dropped(&'static str),
}

fn optional(f: &[String], i: Option<usize>) -> Option<&str> {
    i.map(|i| f[i].as_str()).filter(|s| !s.is_empty())
}

fn parse_row(f: &[String], c: &CsvCols, line: usize, opts: &TraceOptions) -> Result<Row, RowError> {
    let spec = opts.model.spec();
    let arrival = parse_f64("arrival_s", &f[c.arrival])?;
    let work = parse_f64("work_s", &f[c.work])?;
    if work <= 0.0 {
        return Err(RowError::field(
            "work_s",
            FieldProblem::NotPositive(f[c.work].clone()),
        ));
    }
    let memory_gb = parse_f64("memory_gb", &f[c.memory])?;
    if memory_gb <= 0.0 {
        return Err(RowError::field(
            "memory_gb",
            FieldProblem::NotPositive(f[c.memory].clone()),
        ));
    }
    let class: JobClass = f[c.class]
        .parse()
        .map_err(|_| RowError::field("class", FieldProblem::NotAClass(f[c.class].clone())))?;
    let (requested_slices, gpus) = parse_slices(f, c, opts)?;
    let mut rng = row_rng(opts.seed, line);
    let speedup = parse_speedup(f, c, &mut rng, class)?;
    let mut job = Job {
        id: 0,
        arrival,
        work,
        speedup,
        memory_gb,
        deadline: arrival,
        class,
        requested_slices,
        declared_memory_gb: None,
        template: None,
        memory_growth: None,
        gpus,
    };
    job.deadline = parse_deadline(f, c, &mut rng, opts, &job)?;
    if memory_gb > f64::from(spec.memory_gb) {
        return Ok(Row::Dropped("memory exceeds the GPU"));
    }
    let id = optional(f, c.id).map_or_else(|| format!("line{line}"), str::to_string);
    Ok(Row::Job(id, job))
}

/// The row's requested compute slices (rounded up to a profile) and GPUs;
/// a gang job (more than one GPU) asks for whole GPUs.
fn parse_slices(
    f: &[String],
    c: &CsvCols,
    opts: &TraceOptions,
) -> Result<(Option<u8>, u32), RowError> {
    let spec = opts.model.spec();
    let requested_slices = match optional(f, c.requested) {
        None => None,
        Some(v) => {
            let k = parse_i64("requested_slices", v)?;
            let k = u8::try_from(k)
                .ok()
                .filter(|&k| k >= 1)
                .and_then(|k| round_up_to_profile(opts.model, k))
                .ok_or_else(|| {
                    RowError::field(
                        "requested_slices",
                        FieldProblem::SlicesOutOfRange {
                            value: k,
                            max: spec.compute_slices,
                            model: opts.model,
                        },
                    )
                })?;
            Some(k)
        }
    };
    let gpus = match optional(f, c.gpus) {
        None => 1,
        Some(v) => {
            let n = parse_i64("gpus", v)?;
            u32::try_from(n)
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| RowError::field("gpus", FieldProblem::NotAGpuCount(v.to_string())))?
        }
    };
    let requested_slices = match requested_slices {
        Some(k) if gpus > 1 && k != spec.compute_slices => {
            return Err(RowError::field(
                "requested_slices",
                FieldProblem::GangNotWhole {
                    gpus,
                    value: k,
                    whole: spec.compute_slices,
                },
            ));
        }
        _ if gpus > 1 => Some(spec.compute_slices),
        k => k,
    };
    Ok((requested_slices, gpus))
}

/// The row's speed-up curve: its columns (each in (0, 1], a missing one 1),
/// or one sampled for its class when it has neither.
fn parse_speedup(
    f: &[String],
    c: &CsvCols,
    rng: &mut ChaCha8Rng,
    class: JobClass,
) -> Result<SpeedupCurve, RowError> {
    let beta = optional(f, c.beta)
        .map(|v| parse_f64("speedup_beta", v))
        .transpose()?;
    let sat = optional(f, c.saturation)
        .map(|v| parse_f64("speedup_saturation", v))
        .transpose()?;
    Ok(match (beta, sat) {
        (None, None) => sample_curve(rng, class),
        (b, s) => {
            let in_unit = |col: &str, v: f64| {
                if v > 0.0 && v <= 1.0 {
                    Ok(v)
                } else {
                    Err(RowError::field(col, FieldProblem::NotAFraction(v)))
                }
            };
            SpeedupCurve {
                beta: in_unit("speedup_beta", b.unwrap_or(1.0))?,
                saturation: in_unit("speedup_saturation", s.unwrap_or(1.0))?,
            }
        }
    })
}

/// The row's deadline: its column (not before its arrival), or one sampled.
fn parse_deadline(
    f: &[String],
    c: &CsvCols,
    rng: &mut ChaCha8Rng,
    opts: &TraceOptions,
    job: &Job,
) -> Result<f64, RowError> {
    Ok(match optional(f, c.deadline) {
        Some(v) => {
            let d = parse_f64("deadline_s", v)?;
            if d < job.arrival {
                return Err(RowError::field(
                    "deadline_s",
                    FieldProblem::Before {
                        value: d.to_string(),
                        earlier: "arrival_s",
                        earlier_value: Some(job.arrival.to_string()),
                    },
                ));
            }
            d
        }
        None => sample_deadline(rng, opts, job),
    })
}

/// Writes jobs in the format [`read_csv`] reads (all columns, `id` = job id).
/// Numbers are printed in Rust's shortest round-trip form, so reading the
/// file back gives the same values (up to the shift of the first arrival to 0).
pub fn write_csv(jobs: &[Job], w: impl Write) -> Result<(), TraceError> {
    let mut wr = ::csv::Writer::from_writer(w);
    let io = |e: ::csv::Error| match e.into_kind() {
        ::csv::ErrorKind::Io(io) => TraceError::Io(io),
        other => TraceError::Io(std::io::Error::other(format!("{other:?}"))),
    };
    wr.write_record(CSV_COLUMNS).map_err(io)?;
    for j in jobs {
        wr.write_record([
            j.id.to_string(),
            j.arrival.to_string(),
            j.work.to_string(),
            j.memory_gb.to_string(),
            j.class.to_string(),
            j.deadline.to_string(),
            j.requested_slices
                .map_or_else(String::new, |k| k.to_string()),
            j.speedup.beta.to_string(),
            j.speedup.saturation.to_string(),
            j.gpus.to_string(),
        ])
        .map_err(io)?;
    }
    wr.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::GpuModel;
    use crate::workload::{generate_diurnal, DiurnalConfig};

    fn opts() -> TraceOptions {
        TraceOptions::new(GpuModel::A100_40gb)
    }

    const EXAMPLE: &str = "\
id,arrival_s,work_s,memory_gb,class,deadline_s,requested_slices,speedup_beta,speedup_saturation
train-1,100,3600,24,training,5100,,1,0.9
serve-7,40,120,4.5,inference,,5,,
serve-8,40,60,4.5,Inference,200,,0.5,
";

    #[test]
    fn hand_checked_example() {
        let t = read_csv(EXAMPLE.as_bytes(), &opts()).unwrap();
        assert_eq!(t.source_ids, ["serve-7", "serve-8", "train-1"]);
        assert_eq!(t.time_offset_s, 40.0);
        let [a, b, c] = &t.jobs[..] else { panic!() };
        assert_eq!((a.id, a.arrival, a.work), (0, 0.0, 120.0));
        assert_eq!(a.requested_slices, Some(7), "5 rounds up to 7");
        assert!(
            a.deadline >= 120.0 && a.deadline <= 180.0,
            "sampled: {}",
            a.deadline
        );
        assert_eq!(b.deadline, 160.0);
        assert_eq!(
            b.speedup,
            SpeedupCurve {
                beta: 0.5,
                saturation: 1.0
            }
        );
        assert_eq!(
            (c.arrival, c.deadline, c.class),
            (60.0, 5060.0, JobClass::Training)
        );
        assert_eq!(
            c.speedup,
            SpeedupCurve {
                beta: 1.0,
                saturation: 0.9
            }
        );
        assert!(t.skipped.is_empty() && t.dropped.is_empty());
    }

    #[test]
    fn sampled_deadlines_follow_the_requested_size() {
        // Linear curves: 1 slice of 7 runs 7 x longer than the whole GPU.
        let text = "arrival_s,work_s,memory_gb,class,requested_slices,speedup_beta\n\
                    0,100,4,training,1,1\n\
                    0,100,4,training,,1\n\
                    0,100,4,training,3,1\n";
        let tight = TraceOptions {
            deadline_factor: (1.0, 1.0),
            ..opts()
        };
        let t = read_csv(text.as_bytes(), &tight).unwrap();
        let d: Vec<f64> = t.jobs.iter().map(|j| j.deadline).collect();
        assert!((d[0] - 700.0).abs() < 1e-9, "{d:?}");
        assert_eq!(d[1], 100.0, "no request: relative to the whole GPU");
        assert!((d[2] - 700.0 / 3.0).abs() < 1e-9, "{d:?}");
        let wide = TraceOptions {
            deadline_factor: (2.0, 3.0),
            ..opts()
        };
        let j = &read_csv(text.as_bytes(), &wide).unwrap().jobs[0];
        assert!((1400.0..=2100.0).contains(&j.deadline), "{}", j.deadline);
    }

    #[test]
    fn errors_name_line_and_column() {
        let bad = "arrival_s,work_s,memory_gb,class\n1,10,4,inference\n2,abc,4,inference\n";
        let e = read_csv(bad.as_bytes(), &opts()).unwrap_err().to_string();
        assert_eq!(e, "line 3: column work_s: \"abc\" is not a number");
        let bad = "arrival_s,work_s,memory_gb,class,requested_slices\n1,10,4,inference,9\n";
        let e = read_csv(bad.as_bytes(), &opts()).unwrap_err().to_string();
        assert!(e.starts_with("line 2: column requested_slices: 9"), "{e}");
        let bad = "arrival_s,work_s,memory_gb,class\n1,10,4\n";
        let e = read_csv(bad.as_bytes(), &opts()).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("found 3"), "{e}");
        let bad = "arrival_s,work_s,memory_gb,class,deadline_s\n10,10,4,training,5\n";
        assert!(read_csv(bad.as_bytes(), &opts())
            .unwrap_err()
            .to_string()
            .contains("before arrival_s"));
        let bad = "arrival_s,work_s,memory_gb,class,speedup_beta\n10,10,4,training,1.5\n";
        assert!(read_csv(bad.as_bytes(), &opts())
            .unwrap_err()
            .to_string()
            .contains("column speedup_beta: 1.5"));
    }

    #[test]
    fn gang_jobs_span_whole_gpus() {
        let text = "arrival_s,work_s,memory_gb,class,requested_slices,gpus\n\
                    0,3600,30,training,,4\n\
                    1,60,30,training,7,2\n\
                    2,60,5,inference,1,\n";
        let t = read_csv(text.as_bytes(), &opts()).unwrap();
        let g: Vec<(u32, Option<u8>)> = t
            .jobs
            .iter()
            .map(|j| (j.gpus, j.requested_slices))
            .collect();
        assert_eq!(g, [(4, Some(7)), (2, Some(7)), (1, Some(1))]);
        let bad = "arrival_s,work_s,memory_gb,class,requested_slices,gpus\n0,60,5,inference,3,2\n";
        let e = read_csv(bad.as_bytes(), &opts()).unwrap_err().to_string();
        assert_eq!(
            e,
            "line 2: column requested_slices: a job of 2 GPUs runs on whole GPUs (7 slices each), not on 3"
        );
        for zero in ["0", "-1", "x"] {
            let bad = format!("arrival_s,work_s,memory_gb,class,gpus\n0,60,5,inference,{zero}\n");
            let e = read_csv(bad.as_bytes(), &opts()).unwrap_err().to_string();
            assert!(e.starts_with("line 2: column gpus:"), "{e}");
        }
        // Written and read back.
        let mut buf = Vec::new();
        write_csv(&t.jobs, &mut buf).unwrap();
        let back = read_csv(buf.as_slice(), &opts()).unwrap();
        assert_eq!(
            back.jobs.iter().map(|j| j.gpus).collect::<Vec<_>>(),
            [4, 2, 1]
        );
    }

    #[test]
    fn header_and_empty_errors() {
        let e = read_csv("id,arrival_s,class\n".as_bytes(), &opts())
            .unwrap_err()
            .to_string();
        assert!(e.contains("work_s, memory_gb"), "{e}");
        assert!(matches!(
            read_csv("".as_bytes(), &opts()),
            Err(TraceError::Empty)
        ));
        let t = read_csv("arrival_s,work_s,memory_gb,class\n".as_bytes(), &opts()).unwrap();
        assert!(t.jobs.is_empty());
    }

    #[test]
    fn lenient_skips_and_counts() {
        let text = "arrival_s,work_s,memory_gb,class\n\
                    1,10,4,inference\n\
                    2,-1,4,inference\n\
                    3,10,400,training\n\
                    4,10,4,gpu\n\
                    5,10,4,training\n";
        let lenient = TraceOptions {
            lenient: true,
            ..opts()
        };
        let t = read_csv(text.as_bytes(), &lenient).unwrap();
        assert_eq!(t.jobs.len(), 2);
        assert_eq!(t.skipped.iter().map(|s| s.line).collect::<Vec<_>>(), [3, 5]);
        assert_eq!(t.dropped["memory exceeds the GPU"], 1);
        assert!(read_csv(text.as_bytes(), &opts()).is_err());
    }

    #[test]
    fn round_trip_through_write_csv() {
        let m = GpuModel::A100_40gb;
        let jobs = generate_diurnal(&DiurnalConfig::default(), m, 4, 3);
        let mut buf = Vec::new();
        write_csv(&jobs, &mut buf).unwrap();
        let t = read_csv(buf.as_slice(), &opts()).unwrap();
        assert_eq!(t.jobs.len(), jobs.len());
        let off = jobs[0].arrival;
        assert_eq!(t.time_offset_s, off);
        for (a, b) in jobs.iter().zip(&t.jobs) {
            assert_eq!(
                (a.id, a.work, a.memory_gb, a.class),
                (b.id, b.work, b.memory_gb, b.class)
            );
            assert_eq!(
                (a.speedup, a.requested_slices),
                (b.speedup, b.requested_slices)
            );
            assert!((a.arrival - off - b.arrival).abs() < 1e-6);
            assert!((a.deadline - off - b.deadline).abs() < 1e-6);
        }
    }

    #[test]
    fn sampled_values_depend_on_seed_and_line_only() {
        let text =
            "arrival_s,work_s,memory_gb,class\n1,10,4,inference\nx,1,1,training\n3,10,4,training\n";
        let lenient = TraceOptions {
            lenient: true,
            ..opts()
        };
        let a = read_csv(text.as_bytes(), &lenient).unwrap();
        let b = read_csv(text.as_bytes(), &lenient).unwrap();
        assert_eq!(a, b);
        let c = read_csv(text.as_bytes(), &TraceOptions { seed: 1, ..lenient }).unwrap();
        assert_ne!(a.jobs, c.jobs);
    }
}
