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

use std::collections::{HashMap, HashSet};
use std::io::BufRead;

use serde::Serialize;

use super::events::{
    Header, JobRecord, KindCounts, OomHeader, OomRecord, ReconfigRecord, Record, SummaryRecord,
    UnservedRecord,
};
use super::metrics::{never_ran_charge, NeverRan};
use super::reshape::{classify_descs, ReconfigKind};
use crate::mig::{Geometry, InstanceDesc, Layout, Shape, SpotId};
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
///
/// The checks run in this order, each a function of its own: every
/// record on its own and on the timelines it joins ([`Tally::read`]), the
/// restarts of each job ([`check_restarts`]), each GPU's replay
/// ([`replay_gpu`]), the gang jobs' pieces, and the summary against the
/// recomputed totals ([`check_summary`]).
pub fn audit(records: &[Record]) -> Result<AuditReport, AuditError> {
    let Some(Record::Header(header)) = records.first() else {
        return Err(AuditError::MissingHeader);
    };
    let cluster = Cluster::new(header);
    // Failed runs as job-like records (ending at the failure), so the
    // replay treats both alike.
    let oom_runs: Vec<JobRecord> = records
        .iter()
        .filter_map(|r| match r {
            Record::Oom(o) => Some(oom_as_run(o)),
            _ => None,
        })
        .collect();
    let mut tally = Tally::new(cluster.n());
    let summary = tally.read(records, &cluster, &oom_runs)?;
    check_restarts(&tally, header)?;
    let horizon = header.workload_horizon_s.max(tally.last_end);
    let mut energy = 0.0;
    let (mut idle_w, mut whole_gpu_w) = (0.0, 0.0_f64);
    for gpu in 0..cluster.n() {
        let power = cluster.power_of(gpu)?;
        idle_w += power.power_w(0.0);
        whole_gpu_w = whole_gpu_w.max(power.power_w(1.0));
        let timeline = &mut tally.timeline[gpu];
        energy += replay_gpu(
            &cluster,
            records,
            gpu,
            power,
            timeline,
            &mut tally.kinds,
            horizon,
        )?;
    }
    tally.gangs.all_whole()?;
    let report = AuditReport {
        gpus: cluster.n(),
        jobs: tally.jobs,
        unserved: tally.unserved,
        reconfigurations: tally.reconfigs,
        horizon_s: horizon,
        energy_j: 0.0,
        unserved_energy_j: 0.0,
        total_tardiness_s: 0.0,
        mean_tardiness_s: 0.0,
        late_jobs: 0,
        oom_failures: tally.oom_failures,
        early_restarts: tally.early_restarts,
        false_early_restarts: tally.false_early_restarts,
        kinds: tally.kinds,
        books: Books {
            gpu_energy_j: energy,
            idle_w,
            whole_gpu_w,
            served_tardiness_s: tally.tardiness,
            served_late: tally.late,
            unserved: tally.unserved_jobs,
        },
    }
    .at_horizon(horizon);
    if let Some(s) = summary {
        check_summary(s, &report)?;
    }
    Ok(report)
}

/// The header's GPUs as the checks see them.
struct Cluster<'a> {
    header: &'a Header,
    geos: Vec<&'static Geometry>,
}

impl<'a> Cluster<'a> {
    fn new(header: &'a Header) -> Self {
        let geos = header.gpus.iter().map(|g| Geometry::of(g.model)).collect();
        Cluster { header, geos }
    }

    fn n(&self) -> usize {
        self.header.gpus.len()
    }

    /// The largest memory size in the cluster: no early restart on it.
    fn largest_gb(&self) -> u32 {
        self.geos
            .iter()
            .flat_map(|g| g.spec.profiles.iter().map(|p| p.memory_gb))
            .max()
            .unwrap_or(0)
    }

    /// The header's power model of `gpu`'s model.
    fn power_of(&self, gpu: usize) -> Result<PowerModel, AuditError> {
        let model = self.header.gpus[gpu].model;
        self.header
            .power
            .iter()
            .find(|p| p.model == model)
            .map(|p| p.power)
            .ok_or_else(|| violation(0.0, Some(gpu), format!("no power model for {model}")))
    }

    /// The placement `d` names on `gpu`, which must be one of its model's
    /// with the profile the log gives it.
    fn pid(&self, gpu: usize, time: f64, d: &InstanceDesc) -> Result<SpotId, AuditError> {
        let g = self.geos[gpu];
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
    }
}

/// What the first pass over the records gathers: the per-GPU timelines to
/// replay, the runs of each job for [`check_restarts`], and the counts.
struct Tally<'a> {
    /// Sorted (by [`replay_gpu`]) timelines per GPU.
    timeline: Vec<Vec<Keyed<'a>>>,
    /// Per job: (start, fail, instance GB) of its failed runs.
    failed: HashMap<u64, Vec<(f64, f64, u32)>>,
    /// Per job: its successful run (start, instance GB).
    ran: HashMap<u64, (f64, u32)>,
    seen: HashSet<u64>,
    gangs: GangPieces,
    next_oom: usize,
    jobs: u64,
    unserved: u64,
    unserved_jobs: Vec<NeverRan>,
    reconfigs: u64,
    kinds: KindCounts,
    tardiness: f64,
    late: u64,
    last_end: f64,
    oom_failures: u64,
    early_restarts: u64,
    false_early_restarts: u64,
}

impl<'a> Tally<'a> {
    fn new(gpus: usize) -> Self {
        Tally {
            timeline: vec![Vec::new(); gpus],
            failed: HashMap::new(),
            ran: HashMap::new(),
            seen: HashSet::new(),
            gangs: GangPieces::default(),
            next_oom: 0,
            jobs: 0,
            unserved: 0,
            unserved_jobs: Vec::new(),
            reconfigs: 0,
            kinds: KindCounts::default(),
            tardiness: 0.0,
            late: 0,
            last_end: 0.0,
            oom_failures: 0,
            early_restarts: 0,
            false_early_restarts: 0,
        }
    }

    /// Checks every record after the header on its own, in file order;
    /// returns the summary record, if any.
    fn read(
        &mut self,
        records: &'a [Record],
        cluster: &Cluster,
        oom_runs: &'a [JobRecord],
    ) -> Result<Option<&'a SummaryRecord>, AuditError> {
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
                Record::Reconfig(r) => self.reconfig(seq, r, cluster.header)?,
                Record::Job(j) => self.job(seq, j, cluster)?,
                Record::Oom(o) => {
                    let run = &oom_runs[self.next_oom];
                    self.next_oom += 1;
                    self.oom(seq, o, run, cluster)?;
                }
                Record::Unserved(u) => self.never_ran(u)?,
                Record::Summary(s) => summary = Some(s),
            }
        }
        Ok(summary)
    }

    /// A reconfiguration: on a GPU of the header, lasting the header's
    /// time, of the kind its instances make it.
    fn reconfig(
        &mut self,
        seq: usize,
        r: &ReconfigRecord,
        header: &Header,
    ) -> Result<(), AuditError> {
        let n = header.gpus.len();
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
            ReconfigKind::Fusion => self.kinds.fusions += 1,
            ReconfigKind::Fission => self.kinds.fissions += 1,
            ReconfigKind::Reshape => self.kinds.reshapes += 1,
        }
        self.reconfigs += 1;
        self.timeline[r.gpu].push((r.time, 1, seq, 0, Item::ReconfigStart(seq)));
        self.timeline[r.gpu].push((r.ready, 1, seq, 1, Item::ReconfigReady(seq)));
        Ok(())
    }

    /// A completed run: on a GPU of the header, once per job (a gang job
    /// once per GPU it spans), checked by [`check_job`]; its job's
    /// tardiness counts once.
    fn job(&mut self, seq: usize, j: &'a JobRecord, cluster: &Cluster) -> Result<(), AuditError> {
        let n = cluster.n();
        if j.run.gpu >= n {
            return Err(violation(
                j.run.start,
                None,
                format!("job {} on GPU {} of {n}", j.run.id, j.run.gpu),
            ));
        }
        let first = self.gangs.piece(j)?;
        if first && !self.seen.insert(j.run.id) {
            return Err(violation(
                j.run.start,
                Some(j.run.gpu),
                format!("job {} ran twice", j.run.id),
            ));
        }
        check_job(j, cluster.header, &cluster.geos)?;
        if first {
            self.ran
                .insert(j.run.id, (j.run.start, j.run.instance_memory_gb));
            self.jobs += 1;
            let t = (j.end - j.run.deadline).max(0.0);
            self.tardiness += t;
            if j.end > j.run.deadline {
                self.late += 1;
            }
        }
        self.last_end = self.last_end.max(j.end);
        self.timeline[j.run.gpu].push((j.end, 0, seq, 0, Item::End(j)));
        self.timeline[j.run.gpu].push((j.run.start, 2, seq, 0, Item::Start(j)));
        Ok(())
    }

    /// An out-of-memory run or early restart (`run`: it as a job record
    /// ending at the failure): the header must have an oom mode, the run
    /// must end where the rule says ([`oom_share`]), and it is checked as
    /// a job that needs what the instance has.
    fn oom(
        &mut self,
        seq: usize,
        o: &OomRecord,
        run: &'a JobRecord,
        cluster: &Cluster,
    ) -> Result<(), AuditError> {
        let n = cluster.n();
        if o.run.gpu >= n {
            return Err(violation(
                o.run.start,
                None,
                format!("job {} on GPU {} of {n}", o.run.id, o.run.gpu),
            ));
        }
        let Some(h) = &cluster.header.oom else {
            return Err(violation(
                o.run.start,
                Some(o.run.gpu),
                format!(
                    "job {}: out-of-memory record but the header has no oom mode",
                    o.run.id
                ),
            ));
        };
        // The run as a job that needs only what the instance has and
        // whose work is the share it ran.
        let mut as_job = run.clone();
        as_job.run.memory_gb = f64::from(o.run.instance_memory_gb).min(o.run.memory_gb);
        as_job.run.work = self.oom_share(o, h, cluster.largest_gb())?;
        check_job(&as_job, cluster.header, &cluster.geos)?;
        self.failed.entry(o.run.id).or_default().push((
            o.run.start,
            o.fail,
            o.run.instance_memory_gb,
        ));
        self.last_end = self.last_end.max(o.fail);
        // A run that fails at its start (its base use alone exceeds the
        // instance) occupies nothing and draws no energy: it is not
        // replayed (its end would sort before its start).
        if o.fail > o.run.start {
            self.timeline[o.run.gpu].push((o.fail, 0, seq, 0, Item::End(run)));
            self.timeline[o.run.gpu].push((o.run.start, 2, seq, 0, Item::Start(run)));
        }
        Ok(())
    }

    /// The work an out-of-memory run or early restart did before it
    /// ended: an early restart's time from the rule ([`check_early`]), a
    /// failure's share from where the job's memory use crosses the
    /// instance's. Counts it.
    fn oom_share(
        &mut self,
        o: &OomRecord,
        h: &OomHeader,
        largest_gb: u32,
    ) -> Result<f64, AuditError> {
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
        if o.early {
            let t = check_early(o, h, &growth, largest_gb)?;
            self.early_restarts += 1;
            if inst >= o.run.memory_gb {
                self.false_early_restarts += 1;
            }
            return Ok(t * o.run.speed);
        }
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
        self.oom_failures += 1;
        Ok(o.run.work * p)
    }

    /// A job that never ran: not also run.
    fn never_ran(&mut self, u: &UnservedRecord) -> Result<(), AuditError> {
        if !self.seen.insert(u.id) {
            return Err(violation(
                u.arrival,
                None,
                format!("job {} is both run and unserved", u.id),
            ));
        }
        self.unserved += 1;
        self.unserved_jobs.push(NeverRan {
            deadline: u.deadline,
            run_s: u.work,
            gpus: u.gpus,
        });
        Ok(())
    }
}

/// Restarts: bounded, in order, each on more memory than the last failure.
fn check_restarts(tally: &Tally, header: &Header) -> Result<(), AuditError> {
    let mut ids: Vec<&u64> = tally.failed.keys().collect();
    ids.sort();
    for id in ids {
        let runs = &tally.failed[id];
        let max = header.oom.as_ref().map_or(0, |h| h.max_retries);
        let finished = tally.ran.get(id);
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
    Ok(())
}

/// The summary, when the log has one, agrees with the recomputed totals.
fn check_summary(s: &SummaryRecord, report: &AuditReport) -> Result<(), AuditError> {
    let (horizon, energy, tardiness) =
        (report.horizon_s, report.energy_j, report.total_tardiness_s);
    let (jobs, unserved, reconfigs, kinds) = (
        report.jobs,
        report.unserved,
        report.reconfigurations,
        report.kinds,
    );
    let ok = close(s.horizon_s, horizon, 1e-12)
        && close(s.energy_j, energy, 1e-9)
        && close(s.total_tardiness_s, tardiness, 1e-9)
        && s.completed == jobs
        && s.unserved == unserved
        && s.reconfigurations == reconfigs
        && s.oom_failures == report.oom_failures
        && s.early_restarts == report.early_restarts
        && s.kinds.is_none_or(|k| k == kinds);
    if !ok {
        return Err(violation(horizon, None, format!(
            "the summary disagrees with the records: summary {s:?}, recomputed energy {energy} J, tardiness {tardiness} s, {jobs} jobs, {unserved} unserved, {reconfigs} reconfigurations, {kinds:?}")));
    }
    Ok(())
}

/// Replays one GPU's timeline from its initial layout ([`initial_layout`])
/// through [`GpuReplay`]; returns its energy up to `horizon`, J.
fn replay_gpu(
    cluster: &Cluster,
    records: &[Record],
    gpu: usize,
    power: PowerModel,
    timeline: &mut [Keyed],
    kinds: &mut KindCounts,
    horizon: f64,
) -> Result<f64, AuditError> {
    let total = u32::from(cluster.header.gpus[gpu].compute_slices);
    let layout = initial_layout(cluster, gpu)?;
    let mut gpu_state = GpuReplay {
        cluster,
        gpu,
        power,
        total,
        layout,
        ready: layout,
        running: [None; 32],
        origin: [ReconfigKind::Reshape; 32],
        active: 0,
        e: 0.0,
        last: 0.0,
    };
    timeline.sort_by(|a, b| {
        a.0.total_cmp(&b.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    for &(time, _, seq_of, _, item) in timeline.iter() {
        match item {
            Item::ReconfigStart(seq) => {
                if let Record::Reconfig(r) = &records[seq] {
                    gpu_state.reconfig_start(time, r)?;
                }
            }
            Item::ReconfigReady(seq) => {
                if let Record::Reconfig(r) = &records[seq] {
                    gpu_state.reconfig_ready(time, r)?;
                }
            }
            Item::Start(j) => {
                // Completed runs only: out-of-memory runs served nothing.
                let completed = matches!(records[seq_of], Record::Job(_));
                gpu_state.start(time, j, completed.then_some(&mut *kinds))?;
            }
            Item::End(j) => gpu_state.end(time, j)?,
        }
    }
    gpu_state.advance(horizon);
    Ok(gpu_state.e)
}

/// A GPU's initial layout: the header's compute slices are its model's,
/// and its instances are placements of it that the hardware accepts
/// together.
fn initial_layout(cluster: &Cluster, gpu: usize) -> Result<Layout, AuditError> {
    let g = cluster.geos[gpu];
    let total = u32::from(cluster.header.gpus[gpu].compute_slices);
    if total != u32::from(g.spec.compute_slices) {
        return Err(violation(
            0.0,
            Some(gpu),
            "compute_slices does not match the model",
        ));
    }
    let mut layout = Layout::EMPTY;
    for d in &cluster.header.gpus[gpu].initial {
        let id = cluster.pid(gpu, 0.0, d)?;
        layout = layout.with(id);
    }
    if !g.is_valid(layout) {
        return Err(violation(
            0.0,
            Some(gpu),
            format!("initial layout {} is not valid", g.picture(layout)),
        ));
    }
    Ok(layout)
}

/// One GPU during the replay: its instances, those ready, the job on each,
/// and the energy so far.
struct GpuReplay<'c, 'a> {
    cluster: &'c Cluster<'a>,
    gpu: usize,
    power: PowerModel,
    total: u32,
    layout: Layout,
    ready: Layout,
    running: [Option<u64>; 32],
    /// Kind of the reconfiguration that created each instance.
    origin: [ReconfigKind; 32],
    active: u32,
    e: f64,
    last: f64,
}

impl GpuReplay<'_, '_> {
    fn err(&self, time: f64, what: String) -> AuditError {
        violation(time, Some(self.gpu), what)
    }

    /// Integrates the power drawn since the last event up to `time`.
    fn advance(&mut self, time: f64) {
        self.e += self
            .power
            .power_w(f64::from(self.active) / f64::from(self.total))
            * (time - self.last);
        self.last = time;
    }

    /// A reconfiguration begins: it destroys only existing, idle, ready
    /// instances and creates only new ones, into a valid layout.
    fn reconfig_start(&mut self, time: f64, r: &ReconfigRecord) -> Result<(), AuditError> {
        let kind = classify_descs(&r.destroyed, &r.created);
        for d in &r.destroyed {
            let id = self.cluster.pid(self.gpu, time, d)?;
            if !self.layout.contains(id) {
                return Err(self.err(time, format!("destroys {d}, which does not exist")));
            }
            if let Some(job) = self.running[id.0 as usize] {
                return Err(self.err(time, format!("destroys {d}, busy with job {job}")));
            }
            if !self.ready.contains(id) {
                return Err(self.err(time, format!("destroys {d}, still being created")));
            }
            self.layout = self.layout.without(id);
            self.ready = self.ready.without(id);
            self.origin[id.0 as usize] = ReconfigKind::Reshape;
        }
        for d in &r.created {
            let id = self.cluster.pid(self.gpu, time, d)?;
            if self.layout.contains(id) {
                return Err(self.err(time, format!("creates {d}, which exists")));
            }
            self.layout = self.layout.with(id);
            self.origin[id.0 as usize] = kind;
        }
        let g = self.cluster.geos[self.gpu];
        if !g.is_valid(self.layout) {
            return Err(self.err(
                time,
                format!(
                    "layout after the reconfiguration overlaps or exceeds the compute slices: {}",
                    g.describe(self.layout)
                        .iter()
                        .map(std::string::ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        Ok(())
    }

    /// A reconfiguration ends: the instances it created (and that still
    /// exist) are ready.
    fn reconfig_ready(&mut self, time: f64, r: &ReconfigRecord) -> Result<(), AuditError> {
        for d in &r.created {
            let id = self.cluster.pid(self.gpu, time, d)?;
            if self.layout.contains(id) {
                self.ready = self.ready.with(id);
            }
        }
        Ok(())
    }

    /// A run starts on an instance that exists, is ready and is idle;
    /// `kinds`, for a completed run, counts it if a fusion or fission
    /// made its instance.
    fn start(
        &mut self,
        time: f64,
        j: &JobRecord,
        kinds: Option<&mut KindCounts>,
    ) -> Result<(), AuditError> {
        let d = instance_of(j);
        let id = self.cluster.pid(self.gpu, time, &d)?;
        if !self.layout.contains(id) {
            return Err(self.err(
                time,
                format!("job {} starts on {d}, which does not exist", j.run.id),
            ));
        }
        if !self.ready.contains(id) {
            return Err(self.err(
                time,
                format!("job {} starts on {d}, still being created", j.run.id),
            ));
        }
        if let Some(other) = self.running[id.0 as usize] {
            return Err(self.err(
                time,
                format!("job {} starts on {d}, busy with job {other}", j.run.id),
            ));
        }
        self.running[id.0 as usize] = Some(j.run.id);
        if let Some(kinds) = kinds {
            match self.origin[id.0 as usize] {
                ReconfigKind::Fusion => kinds.jobs_served_by_fusion += 1,
                ReconfigKind::Fission => kinds.jobs_served_by_fission += 1,
                ReconfigKind::Reshape => {}
            }
        }
        self.advance(time);
        self.active += u32::from(j.run.compute);
        Ok(())
    }

    /// A run ends on the instance it runs on.
    fn end(&mut self, time: f64, j: &JobRecord) -> Result<(), AuditError> {
        let d = instance_of(j);
        let id = self.cluster.pid(self.gpu, time, &d)?;
        if self.running[id.0 as usize] != Some(j.run.id) {
            return Err(self.err(
                time,
                format!("job {} ends on {d}, where it was not running", j.run.id),
            ));
        }
        self.running[id.0 as usize] = None;
        self.advance(time);
        self.active -= u32::from(j.run.compute);
        Ok(())
    }
}

/// The instance a run ran on.
fn instance_of(j: &JobRecord) -> InstanceDesc {
    InstanceDesc {
        profile: j.run.profile.clone(),
        compute: j.run.compute,
        memory_slices: j.run.memory_slices,
        start: j.run.start_slot,
    }
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

/// A run starts after its arrival, on a profile of its GPU's model with
/// the memory the log says, enough for its need, a whole GPU for a gang
/// job and at least the compute it requested; then [`check_speed`].
fn check_job(j: &JobRecord, header: &Header, geos: &[&'static Geometry]) -> Result<(), AuditError> {
    let _ = header;
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
    check_speed(j, total)
}

/// A run's speed is its curve's on its instance, and its end is its start
/// plus its work at that speed.
fn check_speed(j: &JobRecord, total: u8) -> Result<(), AuditError> {
    let gpu = Some(j.run.gpu);
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
    Ok(())
}
