//! Re-checks an event log from scratch: feasibility, then energy and
//! tardiness recomputed from the records alone.
//!
//! Checks, in order of time on each GPU (at equal times: job ends, then
//! reconfigurations in file order, each followed by its end if its duration
//! is 0, then job starts):
//!
//! - the initial layout and every layout after a reconfiguration is one the
//!   hardware accepts (no overlapping memory slots, compute budget kept);
//! - a reconfiguration destroys only existing, idle instances, creates only
//!   new ones, and lasts the header's reconfiguration time;
//! - a job runs on an instance that exists and is ready for its whole run,
//!   alone, and is not destroyed under it;
//! - a job starts no earlier than it arrives, its instance's memory holds its
//!   need and its compute meets its request, `speed` is its curve on that
//!   instance and `end - start = work / speed`.
//!
//! Out-of-memory runs (`oom` records, only when the header has `oom`) are
//! checked like jobs, with these differences: the instance must really be
//! smaller than the job's need, the run ends where the job's memory use
//! crosses the instance's (`start + crossing × work / speed`, crossing from
//! the record's `memory_growth`, else `fail_fraction`), each further run of
//! the job starts after the previous failure on an instance with more
//! memory, and a job has at most `max_retries + 1` failures (`max_retries`
//! if it finally ran). Early restarts (`early: true`, only when the header
//! has an early-restart rule) are recomputed from the rule
//! (`EarlyRestartRule::first_restart` on the record's growth, need,
//! instance, run time and the header's `sample_s`): the time must be that
//! one, a restart must have been left (`attempt <= max_retries`) and a
//! larger memory size must exist in the cluster; they count as restarts
//! in the bounds above, and those of jobs that fitted are counted as
//! false. Both count in energy but not in tardiness; a run that fails at
//! its start (its base use alone exceeds the instance) takes no time and
//! is not replayed on the timeline.
//!
//! Each reconfiguration's `kind` (fusion, fission, reshape), when the log
//! has one, must be what [`super::reshape::classify`] reads off its
//! `destroyed` and `created` lists. The kinds are counted, and so are the
//! jobs that completed on an instance a fusion or fission created; when
//! the summary carries these counts (`kinds`), they must match.
//!
//! Energy is then integrated per GPU exactly as the simulator does and
//! compared with the log's summary (relative 1e-9).
//!
//! Jobs that never ran (`unserved` records) are charged by the rule of
//! `sim::metrics`, recomputed here from the records alone: each is late, and
//! runs on a whole GPU of the header's hungriest model at full power from
//! the horizon for its `work` (its whole-GPU run time). A comparison that
//! charges every run at a later, common horizon re-checks a run with
//! [`AuditReport::at_horizon`]: every GPU idles until then (header power)
//! and the jobs that never ran start there.

use std::io::BufRead;

use serde::Serialize;

use super::events::{Header, JobRecord, KindCounts, OomHeader, OomRecord, Record};
use super::metrics::{never_ran_charge, NeverRan};
use super::reshape::{classify_descs, ReconfigKind};
use crate::mig::{Geometry, Layout, Shape, SpotId};
use crate::workload::{MemoryGrowth, PowerModel};

/// What the audit recomputed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AuditReport {
    pub gpus: usize,
    pub jobs: u64,
    pub unserved: u64,
    pub reconfigurations: u64,
    pub horizon_s: f64,
    /// Energy of every GPU up to the horizon plus `unserved_energy_j`, J.
    pub energy_j: f64,
    /// The charge for jobs that never ran, J.
    pub unserved_energy_j: f64,
    pub total_tardiness_s: f64,
    pub mean_tardiness_s: f64,
    pub late_jobs: u64,
    /// Out-of-memory runs (failed, counted in energy only).
    pub oom_failures: u64,
    /// Early restarts, and of those the ones whose job fitted (omitted
    /// when 0).
    #[serde(skip_serializing_if = "is_zero")]
    pub early_restarts: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub false_early_restarts: u64,
    /// Reconfigurations by kind, recomputed from their instances, and the
    /// jobs served by fusions and fissions.
    pub kinds: KindCounts,
    /// What [`AuditReport::at_horizon`] re-charges from.
    #[serde(skip)]
    pub books: Books,
}

/// The horizon-free parts of the audit's totals.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Books {
    /// Energy integrated over `[0, horizon]` from the records, J.
    pub gpu_energy_j: f64,
    /// Idle power of every GPU of the header, summed, W.
    pub idle_w: f64,
    /// Full power of a whole GPU of the header's hungriest model, W.
    pub whole_gpu_w: f64,
    pub served_tardiness_s: f64,
    pub served_late: u64,
    /// The `unserved` records, as the charge sees them.
    pub unserved: Vec<NeverRan>,
}

impl AuditReport {
    /// The totals as a comparison charging at `horizon_s` (at least the
    /// log's own horizon) sees them: GPUs idle until then, each job that
    /// never ran starts there on a whole GPU (module docs).
    pub fn at_horizon(&self, horizon_s: f64) -> AuditReport {
        let h = horizon_s.max(self.horizon_s);
        let b = &self.books;
        let gpu_energy = b.gpu_energy_j + b.idle_w * (h - self.horizon_s);
        let (late_tardiness, unserved_energy_j) = never_ran_charge(&b.unserved, h, b.whole_gpu_w);
        let mut r = self.clone();
        r.horizon_s = h;
        r.books.gpu_energy_j = gpu_energy;
        r.unserved_energy_j = unserved_energy_j;
        r.energy_j = gpu_energy + r.unserved_energy_j;
        r.total_tardiness_s = b.served_tardiness_s + late_tardiness;
        r.late_jobs = b.served_late + b.unserved.len() as u64;
        r.mean_tardiness_s = r.total_tardiness_s / (r.jobs + r.unserved).max(1) as f64;
        r
    }
}

/// Why a log failed the audit (or could not be read).
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("line {line}: {message}")]
    Parse { line: usize, message: String },
    #[error("the log does not start with a header record")]
    MissingHeader,
    #[error("violation at t={time} s{}: {what}", gpu.map(|g| format!(" on GPU {g}")).unwrap_or_default())]
    Violation {
        time: f64,
        gpu: Option<usize>,
        what: String,
    },
    #[error("reading the log: {0}")]
    Io(#[from] std::io::Error),
}

fn violation(time: f64, gpu: Option<usize>, what: impl Into<String>) -> AuditError {
    AuditError::Violation {
        time,
        gpu,
        what: what.into(),
    }
}

/// Parses JSON lines into records (blank lines are skipped).
pub fn read_events(reader: impl BufRead) -> Result<Vec<Record>, AuditError> {
    let mut out = Vec::new();
    for (n, line) in reader.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let rec: Record = serde_json::from_str(&line).map_err(|e| AuditError::Parse {
            line: n + 1,
            message: e.to_string(),
        })?;
        out.push(rec);
    }
    Ok(out)
}

/// One thing that happens on one GPU, with its sort key.
#[derive(Clone, Copy)]
enum Item<'a> {
    End(&'a JobRecord),
    ReconfigStart(usize),
    ReconfigReady(usize),
    Start(&'a JobRecord),
}

/// (time, rank, record index, sub-order, item): the audit's sort key.
type Keyed<'a> = (f64, u8, usize, u8, Item<'a>);

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1.0)
}

/// Audits parsed records. Pure: no IO.
pub fn audit(records: &[Record]) -> Result<AuditReport, AuditError> {
    let Some(Record::Header(header)) = records.first() else {
        return Err(AuditError::MissingHeader);
    };
    let n = header.gpus.len();
    let geos: Vec<&'static Geometry> = header.gpus.iter().map(|g| Geometry::of(g.model)).collect();
    let power_of = |gpu: usize| -> Result<PowerModel, AuditError> {
        let model = header.gpus[gpu].model;
        header
            .power
            .iter()
            .find(|p| p.model == model)
            .map(|p| p.power)
            .ok_or_else(|| violation(0.0, Some(gpu), format!("no power model for {model}")))
    };
    let pid = |gpu: usize, time: f64, d: &crate::mig::InstanceDesc| -> Result<SpotId, AuditError> {
        let g = geos[gpu];
        let shape = Shape::new(d.compute, d.memory_slices);
        let id = g.spot_id(shape, d.start).ok_or_else(|| {
            violation(
                time,
                Some(gpu),
                format!("{d} is not a placement of {}", g.model()),
            )
        })?;
        let name = g.spot(id).profile.name();
        if name != d.profile {
            return Err(violation(
                time,
                Some(gpu),
                format!(
                    "instance {d}: a {}-compute/{}-memory-slice profile is {name}",
                    d.compute, d.memory_slices
                ),
            ));
        }
        Ok(id)
    };

    // Failed runs as job-like records (ending at the failure), so the
    // replay below treats both alike.
    let oom_runs: Vec<JobRecord> = records
        .iter()
        .filter_map(|r| match r {
            Record::Oom(o) => Some(oom_as_run(o)),
            _ => None,
        })
        .collect();
    let mut next_oom = 0usize;
    // Per job: (start, fail, instance GB) of its failed runs, and its
    // successful run (start, instance GB).
    let mut failed: std::collections::HashMap<u64, Vec<(f64, f64, u32)>> =
        std::collections::HashMap::new();
    let mut ran: std::collections::HashMap<u64, (f64, u32)> = std::collections::HashMap::new();
    let mut oom_failures = 0u64;
    let mut early_restarts = 0u64;
    let mut false_early_restarts = 0u64;
    // The largest memory size in the cluster: no early restart on it.
    let largest_gb = geos
        .iter()
        .flat_map(|g| g.spec.profiles.iter().map(|p| p.memory_gb))
        .max()
        .unwrap_or(0);
    // Sorted timelines per GPU.
    let mut timeline: Vec<Vec<Keyed>> = vec![Vec::new(); n];
    let mut jobs = 0u64;
    let mut unserved = 0u64;
    let mut unserved_jobs = Vec::new();
    let mut reconfigs = 0u64;
    let mut kinds = KindCounts::default();
    let mut tardiness = 0.0;
    let mut late = 0u64;
    let mut last_end: f64 = 0.0;
    let mut seen = std::collections::HashSet::new();
    let mut gangs = GangPieces::default();
    let mut summary = None;
    for (seq, rec) in records.iter().enumerate().skip(1) {
        match rec {
            Record::Header(_) => {
                return Err(violation(
                    0.0,
                    None,
                    format!("second header at record {}", seq + 1),
                ))
            }
            Record::Reconfig(r) => {
                if r.gpu >= n {
                    return Err(violation(
                        r.time,
                        None,
                        format!("reconfiguration of GPU {} of {n}", r.gpu),
                    ));
                }
                if !close(r.duration, header.reconfig_time_s, 1e-12)
                    || !close(r.ready, r.time + r.duration, 1e-12)
                {
                    return Err(violation(
                        r.time,
                        Some(r.gpu),
                        format!(
                            "reconfiguration lasts {} s until {} but the header says {} s",
                            r.duration, r.ready, header.reconfig_time_s
                        ),
                    ));
                }
                let kind = classify_descs(&r.destroyed, &r.created);
                if let Some(k) = r.kind {
                    if k != kind {
                        return Err(violation(
                            r.time,
                            Some(r.gpu),
                            format!("reconfiguration is logged as {k} but its instances make it a {kind}"),
                        ));
                    }
                }
                match kind {
                    ReconfigKind::Fusion => kinds.fusions += 1,
                    ReconfigKind::Fission => kinds.fissions += 1,
                    ReconfigKind::Reshape => kinds.reshapes += 1,
                }
                reconfigs += 1;
                timeline[r.gpu].push((r.time, 1, seq, 0, Item::ReconfigStart(seq)));
                timeline[r.gpu].push((r.ready, 1, seq, 1, Item::ReconfigReady(seq)));
            }
            Record::Job(j) => {
                if j.run.gpu >= n {
                    return Err(violation(
                        j.run.start,
                        None,
                        format!("job {} on GPU {} of {n}", j.run.id, j.run.gpu),
                    ));
                }
                let first = gangs.piece(j)?;
                if first && !seen.insert(j.run.id) {
                    return Err(violation(
                        j.run.start,
                        Some(j.run.gpu),
                        format!("job {} ran twice", j.run.id),
                    ));
                }
                check_job(j, header, &geos)?;
                if first {
                    ran.insert(j.run.id, (j.run.start, j.run.instance_memory_gb));
                    jobs += 1;
                    let t = (j.end - j.run.deadline).max(0.0);
                    tardiness += t;
                    if j.end > j.run.deadline {
                        late += 1;
                    }
                }
                last_end = last_end.max(j.end);
                timeline[j.run.gpu].push((j.end, 0, seq, 0, Item::End(j)));
                timeline[j.run.gpu].push((j.run.start, 2, seq, 0, Item::Start(j)));
            }
            Record::Oom(o) => {
                let run = &oom_runs[next_oom];
                next_oom += 1;
                if o.run.gpu >= n {
                    return Err(violation(
                        o.run.start,
                        None,
                        format!("job {} on GPU {} of {n}", o.run.id, o.run.gpu),
                    ));
                }
                let Some(h) = &header.oom else {
                    return Err(violation(
                        o.run.start,
                        Some(o.run.gpu),
                        format!(
                            "job {}: out-of-memory record but the header has no oom mode",
                            o.run.id
                        ),
                    ));
                };
                let inst = f64::from(o.run.instance_memory_gb);
                let growth = o
                    .memory_growth
                    .unwrap_or_else(|| MemoryGrowth::step_at(h.fail_fraction));
                if let Err(e) = growth.validate() {
                    return Err(violation(
                        o.run.start,
                        Some(o.run.gpu),
                        format!("job {}: {e}", o.run.id),
                    ));
                }
                // The run as a job that needs only what the instance has
                // and whose work is the share it ran.
                let mut as_job = run.clone();
                as_job.run.memory_gb = inst.min(o.run.memory_gb);
                if o.early {
                    let t = check_early(o, h, &growth, largest_gb)?;
                    as_job.run.work = t * o.run.speed;
                    early_restarts += 1;
                    if inst >= o.run.memory_gb {
                        false_early_restarts += 1;
                    }
                } else {
                    let Some(p) = growth.crossing(o.run.memory_gb, inst) else {
                        return Err(violation(
                            o.run.start,
                            Some(o.run.gpu),
                            format!(
                                "job {} ran out of memory on {} GB but needs only {} GB",
                                o.run.id, o.run.instance_memory_gb, o.run.memory_gb
                            ),
                        ));
                    };
                    as_job.run.work = o.run.work * p;
                    oom_failures += 1;
                }
                check_job(&as_job, header, &geos)?;
                failed.entry(o.run.id).or_default().push((
                    o.run.start,
                    o.fail,
                    o.run.instance_memory_gb,
                ));
                last_end = last_end.max(o.fail);
                // A run that fails at its start (its base use alone
                // exceeds the instance) occupies nothing and draws no
                // energy: it is not replayed (its end would sort before
                // its start).
                if o.fail > o.run.start {
                    timeline[o.run.gpu].push((o.fail, 0, seq, 0, Item::End(run)));
                    timeline[o.run.gpu].push((o.run.start, 2, seq, 0, Item::Start(run)));
                }
            }
            Record::Unserved(u) => {
                if !seen.insert(u.id) {
                    return Err(violation(
                        u.arrival,
                        None,
                        format!("job {} is both run and unserved", u.id),
                    ));
                }
                unserved += 1;
                unserved_jobs.push(NeverRan {
                    deadline: u.deadline,
                    run_s: u.work,
                    gpus: u.gpus,
                });
            }
            Record::Summary(s) => summary = Some(s),
        }
    }
    // Restarts: bounded, in order, each on more memory than the last failure.
    let mut ids: Vec<&u64> = failed.keys().collect();
    ids.sort();
    for id in ids {
        let runs = &failed[id];
        let max = header.oom.as_ref().map_or(0, |h| h.max_retries);
        let finished = ran.get(id);
        let allowed = u64::from(max) + u64::from(finished.is_none());
        if runs.len() as u64 > allowed {
            return Err(violation(
                runs[0].0,
                None,
                format!(
                    "job {id} failed out of memory or was restarted early {} times; at most {allowed} allowed ({max} restarts)",
                    runs.len()
                ),
            ));
        }
        let mut sorted = runs.clone();
        sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
        let later = sorted
            .iter()
            .skip(1)
            .map(|&(start, _, mem)| (start, mem))
            .chain(finished.copied());
        for (prev, (start, mem)) in sorted.iter().zip(later) {
            if start < prev.1 || mem <= prev.2 {
                return Err(violation(
                    start,
                    None,
                    format!(
                        "job {id} restarts at {start} s on {mem} GB after running out of {} GB at {} s",
                        prev.2, prev.1
                    ),
                ));
            }
        }
    }
    let horizon = header.workload_horizon_s.max(last_end);

    let mut energy = 0.0;
    let (mut idle_w, mut whole_gpu_w) = (0.0, 0.0_f64);
    for gpu in 0..n {
        let g = geos[gpu];
        let power = power_of(gpu)?;
        idle_w += power.power_w(0.0);
        whole_gpu_w = whole_gpu_w.max(power.power_w(1.0));
        let total = u32::from(header.gpus[gpu].compute_slices);
        if total != u32::from(g.spec.compute_slices) {
            return Err(violation(
                0.0,
                Some(gpu),
                "compute_slices does not match the model",
            ));
        }
        let mut layout = Layout::EMPTY;
        for d in &header.gpus[gpu].initial {
            let id = pid(gpu, 0.0, d)?;
            layout = layout.with(id);
        }
        if !g.is_valid(layout) {
            return Err(violation(
                0.0,
                Some(gpu),
                format!("initial layout {} is not valid", g.picture(layout)),
            ));
        }
        let mut ready = layout;
        let mut running: [Option<u64>; 32] = [None; 32];
        // Kind of the reconfiguration that created each instance.
        let mut origin = [ReconfigKind::Reshape; 32];
        let mut active = 0u32;
        let (mut e, mut last) = (0.0, 0.0);
        let tl = &mut timeline[gpu];
        tl.sort_by(|a, b| {
            a.0.total_cmp(&b.0)
                .then(a.1.cmp(&b.1))
                .then(a.2.cmp(&b.2))
                .then(a.3.cmp(&b.3))
        });
        for &(time, _, seq_of, _, item) in tl.iter() {
            match item {
                Item::ReconfigStart(seq) => {
                    let Record::Reconfig(r) = &records[seq] else {
                        continue;
                    };
                    let kind = classify_descs(&r.destroyed, &r.created);
                    for d in &r.destroyed {
                        let id = pid(gpu, time, d)?;
                        if !layout.contains(id) {
                            return Err(violation(
                                time,
                                Some(gpu),
                                format!("destroys {d}, which does not exist"),
                            ));
                        }
                        if let Some(job) = running[id.0 as usize] {
                            return Err(violation(
                                time,
                                Some(gpu),
                                format!("destroys {d}, busy with job {job}"),
                            ));
                        }
                        if !ready.contains(id) {
                            return Err(violation(
                                time,
                                Some(gpu),
                                format!("destroys {d}, still being created"),
                            ));
                        }
                        layout = layout.without(id);
                        ready = ready.without(id);
                        origin[id.0 as usize] = ReconfigKind::Reshape;
                    }
                    for d in &r.created {
                        let id = pid(gpu, time, d)?;
                        if layout.contains(id) {
                            return Err(violation(
                                time,
                                Some(gpu),
                                format!("creates {d}, which exists"),
                            ));
                        }
                        layout = layout.with(id);
                        origin[id.0 as usize] = kind;
                    }
                    if !g.is_valid(layout) {
                        return Err(violation(time, Some(gpu), format!(
                            "layout after the reconfiguration overlaps or exceeds the compute slices: {}",
                            g.describe(layout).iter().map(std::string::ToString::to_string).collect::<Vec<_>>().join(", "))));
                    }
                }
                Item::ReconfigReady(seq) => {
                    let Record::Reconfig(r) = &records[seq] else {
                        continue;
                    };
                    for d in &r.created {
                        let id = pid(gpu, time, d)?;
                        if layout.contains(id) {
                            ready = ready.with(id);
                        }
                    }
                }
                Item::Start(j) => {
                    let d = crate::mig::InstanceDesc {
                        profile: j.run.profile.clone(),
                        compute: j.run.compute,
                        memory_slices: j.run.memory_slices,
                        start: j.run.start_slot,
                    };
                    let id = pid(gpu, time, &d)?;
                    if !layout.contains(id) {
                        return Err(violation(
                            time,
                            Some(gpu),
                            format!("job {} starts on {d}, which does not exist", j.run.id),
                        ));
                    }
                    if !ready.contains(id) {
                        return Err(violation(
                            time,
                            Some(gpu),
                            format!("job {} starts on {d}, still being created", j.run.id),
                        ));
                    }
                    if let Some(other) = running[id.0 as usize] {
                        return Err(violation(
                            time,
                            Some(gpu),
                            format!("job {} starts on {d}, busy with job {other}", j.run.id),
                        ));
                    }
                    running[id.0 as usize] = Some(j.run.id);
                    // Completed runs only: out-of-memory runs served nothing.
                    if matches!(records[seq_of], Record::Job(_)) {
                        match origin[id.0 as usize] {
                            ReconfigKind::Fusion => kinds.jobs_served_by_fusion += 1,
                            ReconfigKind::Fission => kinds.jobs_served_by_fission += 1,
                            ReconfigKind::Reshape => {}
                        }
                    }
                    e += power.power_w(f64::from(active) / f64::from(total)) * (time - last);
                    last = time;
                    active += u32::from(j.run.compute);
                }
                Item::End(j) => {
                    let d = crate::mig::InstanceDesc {
                        profile: j.run.profile.clone(),
                        compute: j.run.compute,
                        memory_slices: j.run.memory_slices,
                        start: j.run.start_slot,
                    };
                    let id = pid(gpu, time, &d)?;
                    if running[id.0 as usize] != Some(j.run.id) {
                        return Err(violation(
                            time,
                            Some(gpu),
                            format!("job {} ends on {d}, where it was not running", j.run.id),
                        ));
                    }
                    running[id.0 as usize] = None;
                    e += power.power_w(f64::from(active) / f64::from(total)) * (time - last);
                    last = time;
                    active -= u32::from(j.run.compute);
                }
            }
        }
        e += power.power_w(f64::from(active) / f64::from(total)) * (horizon - last);
        energy += e;
    }
    gangs.all_whole()?;
    let report = AuditReport {
        gpus: n,
        jobs,
        unserved,
        reconfigurations: reconfigs,
        horizon_s: horizon,
        energy_j: 0.0,
        unserved_energy_j: 0.0,
        total_tardiness_s: 0.0,
        mean_tardiness_s: 0.0,
        late_jobs: 0,
        oom_failures,
        early_restarts,
        false_early_restarts,
        kinds,
        books: Books {
            gpu_energy_j: energy,
            idle_w,
            whole_gpu_w,
            served_tardiness_s: tardiness,
            served_late: late,
            unserved: unserved_jobs,
        },
    }
    .at_horizon(horizon);
    let (energy, tardiness) = (report.energy_j, report.total_tardiness_s);
    if let Some(s) = summary {
        let ok = close(s.horizon_s, horizon, 1e-12)
            && close(s.energy_j, energy, 1e-9)
            && close(s.total_tardiness_s, tardiness, 1e-9)
            && s.completed == jobs
            && s.unserved == unserved
            && s.reconfigurations == reconfigs
            && s.oom_failures == oom_failures
            && s.early_restarts == early_restarts
            && s.kinds.is_none_or(|k| k == kinds);
        if !ok {
            return Err(violation(horizon, None, format!(
                "the summary disagrees with the records: summary {s:?}, recomputed energy {energy} J, tardiness {tardiness} s, {jobs} jobs, {unserved} unserved, {reconfigs} reconfigurations, {kinds:?}")));
        }
    }
    Ok(report)
}

/// The pieces of gang jobs seen so far ([`Run::gpus`](super::events::Run::gpus) > 1):
/// each gang job runs once on `gpus` distinct GPUs, every piece with the
/// same start and end.
#[derive(Default)]
struct GangPieces {
    /// Job id -> (its first piece's start and end, GPUs, pieces expected).
    seen: std::collections::HashMap<u64, (f64, f64, Vec<usize>, u32)>,
}

impl GangPieces {
    /// Takes one run record; returns whether it is the job's first (or
    /// only) piece, which alone counts the job.
    fn piece(&mut self, j: &JobRecord) -> Result<bool, AuditError> {
        if j.run.gpus <= 1 {
            return Ok(true);
        }
        let at = |what: String| violation(j.run.start, Some(j.run.gpu), what);
        let Some((start, end, gpus, want)) = self.seen.get_mut(&j.run.id) else {
            self.seen
                .insert(j.run.id, (j.run.start, j.end, vec![j.run.gpu], j.run.gpus));
            return Ok(true);
        };
        if !close(*start, j.run.start, 1e-12) || !close(*end, j.end, 1e-12) {
            return Err(at(format!(
                "gang job {}: a piece runs {}-{}, another {start}-{end}",
                j.run.id, j.run.start, j.end
            )));
        }
        if gpus.contains(&j.run.gpu) || gpus.len() as u32 >= *want {
            return Err(at(format!(
                "gang job {} of {want} GPUs ran twice on GPU {} or on more GPUs",
                j.run.id, j.run.gpu
            )));
        }
        gpus.push(j.run.gpu);
        Ok(false)
    }

    /// Every gang job ran on as many GPUs as it spans.
    fn all_whole(&self) -> Result<(), AuditError> {
        for (id, (start, _, gpus, want)) in &self.seen {
            if gpus.len() as u32 != *want {
                return Err(violation(
                    *start,
                    None,
                    format!("gang job {id} of {want} GPUs ran on {} only", gpus.len()),
                ));
            }
        }
        Ok(())
    }
}

/// An early restart: the header must have a rule, the restart must have
/// been allowed, and its time must be the rule's. Returns the time run.
fn check_early(
    o: &OomRecord,
    h: &OomHeader,
    growth: &MemoryGrowth,
    largest_gb: u32,
) -> Result<f64, AuditError> {
    let at = |what: String| violation(o.run.start, Some(o.run.gpu), what);
    let id = o.run.id;
    let (Some(rule), Some(sample_s)) = (h.early_restart, h.sample_s) else {
        return Err(at(format!(
            "job {id}: early restart but the header has no early-restart rule and sample period"
        )));
    };
    if o.attempt > h.max_retries {
        return Err(at(format!(
            "job {id}: early restart on attempt {} but only {} restarts are allowed",
            o.attempt, h.max_retries
        )));
    }
    if o.run.instance_memory_gb >= largest_gb {
        return Err(at(format!(
            "job {id}: early restart on {} GB, the largest memory size in the cluster",
            o.run.instance_memory_gb
        )));
    }
    if o.run.speed.is_nan() || o.run.speed <= 0.0 {
        return Err(at(format!("job {id}: speed {}", o.run.speed)));
    }
    let run_s = o.run.work / o.run.speed;
    let inst = f64::from(o.run.instance_memory_gb);
    let Some(t) = rule.first_restart(growth, o.run.memory_gb, inst, run_s, sample_s) else {
        return Err(at(format!(
            "job {id}: restarted early at {} s but the rule never fires on this run",
            o.fail
        )));
    };
    if !close(o.fail, o.run.start + t, 1e-12) {
        return Err(at(format!(
            "job {id}: restarted early at {} s but the rule fires at {} s",
            o.fail,
            o.run.start + t
        )));
    }
    Ok(t)
}

/// A failed run as a job record that ends at the failure.
fn oom_as_run(o: &OomRecord) -> JobRecord {
    JobRecord {
        run: o.run.clone(),
        end: o.fail,
    }
}

fn check_job(j: &JobRecord, header: &Header, geos: &[&'static Geometry]) -> Result<(), AuditError> {
    let gpu = Some(j.run.gpu);
    let g = geos[j.run.gpu];
    let total = g.spec.compute_slices;
    if j.run.start < j.run.arrival {
        return Err(violation(
            j.run.start,
            gpu,
            format!(
                "job {} starts before it arrives ({})",
                j.run.id, j.run.arrival
            ),
        ));
    }
    let Some(profile) = g
        .spec
        .profile(Shape::new(j.run.compute, j.run.memory_slices))
    else {
        return Err(violation(
            j.run.start,
            gpu,
            format!(
                "job {}: no {}g/{}-slice profile",
                j.run.id, j.run.compute, j.run.memory_slices
            ),
        ));
    };
    if profile.memory_gb != j.run.instance_memory_gb {
        return Err(violation(
            j.run.start,
            gpu,
            format!(
                "job {}: {} has {} GB, the log says {}",
                j.run.id,
                profile.name(),
                profile.memory_gb,
                j.run.instance_memory_gb
            ),
        ));
    }
    if j.run.memory_gb > f64::from(profile.memory_gb) {
        return Err(violation(
            j.run.start,
            gpu,
            format!(
                "job {} needs {} GB but {} has {}",
                j.run.id,
                j.run.memory_gb,
                profile.name(),
                profile.memory_gb
            ),
        ));
    }
    if j.run.gpus > 1 && j.run.compute != total {
        return Err(violation(
            j.run.start,
            gpu,
            format!(
                "gang job {} of {} GPUs ran on {} of {total} compute slices, not a whole GPU",
                j.run.id, j.run.gpus, j.run.compute
            ),
        ));
    }
    if let Some(k) = j.run.requested_slices {
        if j.run.compute < k {
            return Err(violation(
                j.run.start,
                gpu,
                format!(
                    "job {} requested {k} compute slices but ran on {}",
                    j.run.id, j.run.compute
                ),
            ));
        }
    }
    if j.run.speedup.validate().is_err() {
        return Err(violation(
            j.run.start,
            gpu,
            format!("job {}: invalid speed-up curve", j.run.id),
        ));
    }
    let speed = j.run.speedup.speed(j.run.compute, total);
    if !close(speed, j.run.speed, 1e-12) {
        return Err(violation(
            j.run.start,
            gpu,
            format!(
                "job {}: speed {} but its curve gives {speed} on {}g",
                j.run.id, j.run.speed, j.run.compute
            ),
        ));
    }
    if !close(j.end, j.run.start + j.run.work / speed, 1e-12) || j.end < j.run.start {
        return Err(violation(
            j.run.start,
            gpu,
            format!(
                "job {}: runs {} s but work/speed = {} s",
                j.run.id,
                j.end - j.run.start,
                j.run.work / speed
            ),
        ));
    }
    let _ = header;
    Ok(())
}
