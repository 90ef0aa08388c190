//! The expected effect of one reconfiguration (issue 22, part 2): a short
//! simulation of the node's own queue, once with the layouts as they are
//! and once with the plan applied, so `smartmig plan` can say what a plan
//! is expected to change before an admin applies it.
//!
//! What the node knows goes in: its GPUs and layouts, the jobs running on
//! them (their compute size, memory and the time left until Slurm's end
//! time) and the jobs waiting for it (on a cluster, the share it claims
//! from the summary, `daemon::summary`). Both runs hold the layouts fixed
//! (no policy acts meanwhile) and place jobs as smartmigd does: arrival
//! order, instances of exactly the requested size
//! ([`SimConfig::exact_size`]). They run until the queue drains. It is an
//! estimate: run times come from time limits, the jobs arriving later are
//! unknown, and the reconfiguration's own few seconds are not counted.

use crate::mig::{Geometry, GpuModel, Layout};
use crate::policy::{ClusterView, Decision, RepartitionPolicy};
use crate::sim::{simulate, EpochRule, Heuristic, RunHooks, SimConfig, SimError};
use crate::workload::{Job, JobClass, SpeedupCurve};

/// Most waiting jobs simulated (the oldest ones): a plan's effect shows
/// in the near queue, and the simulation stays well under a millisecond.
pub const MAX_WAITING: usize = 200;

/// A deadline far enough not to count (the simulator needs one).
const NO_DEADLINE_S: f64 = 1.0e9;

/// A job running on one of the node's instances now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Running {
    pub compute: u8,
    pub memory_gb: f64,
    /// Seconds until Slurm's end time for it (capped by the caller).
    pub remaining_s: f64,
}

/// A job waiting for the node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Waiting {
    pub compute: u8,
    /// The memory it needs (0: any instance of its size).
    pub memory_gb: f64,
    /// Seconds of work on a whole GPU (from its time limit).
    pub work_s: f64,
    /// Seconds from now to its deadline (`None`: none).
    pub deadline_in_s: Option<f64>,
    /// Seconds it has waited already (orders the queue).
    pub waited_s: f64,
}

/// The node as it is now.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeNow {
    pub models: Vec<GpuModel>,
    pub layouts: Vec<Layout>,
    pub running: Vec<Running>,
    pub waiting: Vec<Waiting>,
    pub speedup: SpeedupCurve,
}

/// What one run expects for the waiting jobs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    /// Mean wait of the waiting jobs from now, s.
    pub mean_wait_s: f64,
    /// Energy of the node's GPUs until the queue drains, J.
    pub energy_j: f64,
    /// Waiting jobs that would miss their deadline.
    pub late: u64,
    /// Waiting jobs no instance of the layouts can run.
    pub unserved: u64,
}

/// The plan against keeping the layouts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Effect {
    /// Waiting jobs simulated.
    pub waiting: usize,
    pub running: usize,
    pub keep: Outcome,
    pub plan: Outcome,
}

/// Holds each GPU at a layout (initial and forever).
struct Fixed(Vec<Layout>);

impl RepartitionPolicy for Fixed {
    fn name(&self) -> String {
        "fixed".into()
    }

    /// The runs compare two layouts held fixed: nothing is built on demand
    /// in between, or both would serve the queue alike.
    fn served_through_shards(&self) -> bool {
        false
    }

    fn initial_layout(&mut self, gpu: usize, geometry: &'static Geometry) -> Layout {
        self.0
            .get(gpu)
            .copied()
            .filter(|&l| geometry.is_valid(l))
            .unwrap_or_else(|| geometry.whole_gpu())
    }

    fn decide(&mut self, _view: &ClusterView<'_>) -> Vec<Decision> {
        Vec::new()
    }
}

/// The jobs of `now` as the simulator's: running ones first (arrival 0,
/// lower ids), then the waiting ones in the order they waited.
fn jobs_of(now: &NodeNow) -> Vec<Job> {
    let total = now.models.first().map_or(7, |m| m.spec().compute_slices);
    let mut waiting = now.waiting.clone();
    waiting.sort_by(|a, b| b.waited_s.total_cmp(&a.waited_s));
    waiting.truncate(MAX_WAITING);
    let mut out = Vec::with_capacity(now.running.len() + waiting.len());
    for (i, r) in now.running.iter().enumerate() {
        out.push(Job {
            id: i as u64,
            arrival: 0.0,
            work: r.remaining_s.max(1.0) * now.speedup.speed(r.compute, total),
            speedup: now.speedup,
            memory_gb: r.memory_gb,
            deadline: NO_DEADLINE_S,
            class: JobClass::Training,
            requested_slices: Some(r.compute),
            declared_memory_gb: None,
            template: None,
            memory_growth: None,
            gpus: 1,
        });
    }
    let base = out.len() as u64;
    for (i, w) in waiting.iter().enumerate() {
        out.push(Job {
            id: base + i as u64,
            // After the running jobs, in the order they waited.
            arrival: 1e-3 * (i + 1) as f64,
            work: w.work_s.max(1.0),
            speedup: now.speedup,
            memory_gb: w.memory_gb,
            deadline: w.deadline_in_s.unwrap_or(NO_DEADLINE_S),
            class: JobClass::Training,
            requested_slices: Some(w.compute),
            declared_memory_gb: None,
            template: None,
            memory_growth: None,
            gpus: 1,
        });
    }
    out
}

fn run(
    now: &NodeNow,
    layouts: Vec<Layout>,
    jobs: &[Job],
    waiting: usize,
) -> Result<Outcome, SimError> {
    let cfg = SimConfig {
        epoch: EpochRule::Seconds(60.0),
        exact_size: true,
        ..SimConfig::default()
    };
    let mut heuristic = Heuristic::BestFit.build(0);
    let mut policy = Fixed(layouts);
    let r = simulate(
        &now.models,
        jobs,
        heuristic.as_mut(),
        &mut policy,
        &cfg,
        RunHooks::default(),
    )?;
    let m = r.metrics;
    // Running jobs start at once on their instances: the wait is the
    // waiting jobs'.
    let n = waiting.max(1) as f64;
    Ok(Outcome {
        mean_wait_s: m.mean_wait_s * m.jobs as f64 / n,
        energy_j: m.energy_j,
        late: m.late_jobs,
        unserved: m.unserved + m.rejected,
    })
}

/// One epoch's look-ahead of a node: the jobs are built once, and the
/// run with every layout held once, however many plans are scored.
pub struct Lookahead {
    node: NodeNow,
    jobs: Vec<Job>,
    waiting: usize,
    keep: Option<Outcome>,
}

impl Lookahead {
    pub fn new(node: NodeNow) -> Lookahead {
        let jobs = jobs_of(&node);
        let waiting = jobs.len() - node.running.len();
        Lookahead {
            node,
            jobs,
            waiting,
            keep: None,
        }
    }

    /// The expected effect of setting GPU `gpu` to `target`, against
    /// keeping every layout. `None` when there is nothing waiting (no
    /// effect to estimate) or `gpu` is not one of the node's.
    pub fn effect(&mut self, gpu: usize, target: Layout) -> Result<Option<Effect>, SimError> {
        let n = &self.node;
        if self.waiting == 0 || gpu >= n.layouts.len() || n.models.len() != n.layouts.len() {
            return Ok(None);
        }
        let keep = match self.keep {
            Some(k) => k,
            None => *self
                .keep
                .insert(run(n, n.layouts.clone(), &self.jobs, self.waiting)?),
        };
        let mut planned = n.layouts.clone();
        planned[gpu] = target;
        let plan = run(n, planned, &self.jobs, self.waiting)?;
        Ok(Some(Effect {
            waiting: self.waiting,
            running: n.running.len(),
            keep,
            plan,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(layouts: Vec<Layout>, waiting: Vec<Waiting>) -> NodeNow {
        NodeNow {
            models: vec![GpuModel::A100_40gb; layouts.len()],
            layouts,
            running: Vec::new(),
            waiting,
            speedup: SpeedupCurve::default(),
        }
    }

    fn wait(compute: u8, work_s: f64) -> Waiting {
        Waiting {
            compute,
            memory_gb: 0.0,
            work_s,
            deadline_in_s: None,
            waited_s: 10.0,
        }
    }

    #[test]
    fn a_plan_that_builds_what_the_queue_asks_for_cuts_its_wait() {
        let g = Geometry::of(GpuModel::A100_40gb);
        // One whole GPU, four 1-slice jobs waiting: seven 1g instances run
        // them side by side.
        let sevens = g
            .catalog()
            .iter()
            .copied()
            .find(|&l| g.describe(l).len() == 7)
            .expect("a layout of seven instances");
        let now = node(
            vec![g.whole_gpu()],
            (0..4).map(|_| wait(1, 600.0)).collect(),
        );
        let e = Lookahead::new(now.clone())
            .effect(0, sevens)
            .unwrap()
            .unwrap();
        // One look-ahead scoring several plans: the held run is shared and
        // each plan's answer is what it would be alone.
        let mut shared = Lookahead::new(now.clone());
        let held = shared.effect(0, g.whole_gpu()).unwrap().unwrap();
        assert_eq!(shared.effect(0, sevens).unwrap().unwrap(), e);
        assert_eq!(held.keep, e.keep);
        assert_eq!(e.waiting, 4);
        assert_eq!(
            e.keep.unserved, 4,
            "a whole GPU cannot run 1-slice jobs of exact size"
        );
        assert_eq!(e.plan.unserved, 0);
        // And the other way round: the plan would strand them.
        let now = node(vec![sevens], (0..4).map(|_| wait(1, 600.0)).collect());
        let e = Lookahead::new(now.clone())
            .effect(0, g.whole_gpu())
            .unwrap()
            .unwrap();
        assert_eq!((e.keep.unserved, e.plan.unserved), (0, 4));
    }

    #[test]
    fn running_jobs_keep_their_instances_and_delay_the_queue() {
        let g = Geometry::of(GpuModel::A100_40gb);
        let mut now = node(vec![g.whole_gpu()], vec![wait(7, 100.0)]);
        assert!(Lookahead::new(now.clone())
            .effect(0, g.whole_gpu())
            .unwrap()
            .is_some());
        now.running.push(Running {
            compute: 7,
            memory_gb: 40.0,
            remaining_s: 500.0,
        });
        let e = Lookahead::new(now.clone())
            .effect(0, g.whole_gpu())
            .unwrap()
            .unwrap();
        assert!(
            (e.keep.mean_wait_s - 500.0).abs() < 1.0,
            "the waiting job starts when the running one ends: {e:?}"
        );
        assert_eq!(e.keep, e.plan, "the same layout, the same outcome");
        now.waiting.clear();
        assert!(Lookahead::new(now.clone())
            .effect(0, g.whole_gpu())
            .unwrap()
            .is_none());
    }
}
