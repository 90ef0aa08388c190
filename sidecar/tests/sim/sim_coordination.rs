//! Coordination across nodes (issue 23, part 2; `smartmig bench
//! coordination`, docs/evaluation.md): the per-node wrapper against the
//! central policy, the claimed split of the queue, the herd reaction on a
//! burst, and the wasted-reshape counter.

use smartmig::eval::coordination::build;
use smartmig::eval::{
    run_coordination, Arrangement, CoordinationConfig, CoordinationRow, Day, DaySet,
};
use smartmig::mig::{Geometry, GpuModel, Layout};
use smartmig::policy::nodes::{Nodes, PerNode, Split};
use smartmig::policy::share::{claimant, claims};
use smartmig::policy::{
    ClusterView, Decision, Greedy, GreedyConfig, PendingByProfile, RepartitionPolicy,
};
use smartmig::scenario::{default_scenarios, Scenario};
use smartmig::sim::events::{JobRecord, OomRecord, ReconfigRecord, Run};
use smartmig::sim::{
    audit, count_waste, simulate, Collect, Heuristic, Metrics, Record, RunHooks, SimConfig,
};
use smartmig::workload::{Job, JobClass, SpeedupCurve};

const M: GpuModel = GpuModel::A100_40gb;

fn scenario(name: &str) -> Scenario {
    default_scenarios()
        .into_iter()
        .find(|s| s.name == name)
        .expect("a shipped scenario")
}

fn day(gpus: usize, seed: u64) -> Day {
    let s = scenario("campaigns/tight");
    Day::generated(
        s.generate(M, gpus, seed),
        seed,
        s.horizon_s(),
        s.start_hour(),
    )
}

/// One run with its event log, audited.
fn run(set: &DaySet, policy: &mut dyn RepartitionPolicy) -> (Metrics, Vec<Record>) {
    let mut log = Collect::default();
    let r = set.run(0, policy, Some(&mut log)).expect("simulates");
    let a = audit(&log.0).expect("the log passes the audit");
    assert!((a.energy_j - r.metrics.energy_j).abs() <= 1e-6 * r.metrics.energy_j);
    assert_eq!(a.reconfigurations, r.metrics.reconfigurations);
    (r.metrics, log.0)
}

/// With one node, the wrapper is the central policy: same metrics, same
/// event log record for record (the header names the policy).
#[test]
fn one_node_decides_exactly_as_the_central_policy() {
    let cluster = vec![M; 8];
    let set = DaySet::new(&cluster, Heuristic::Edf, vec![day(8, 7)]).unwrap();
    let (central, central_log) = run(
        &set,
        build("greedy", Arrangement::Central, &cluster, 8, 0.0)
            .unwrap()
            .as_mut(),
    );
    assert!(central.reconfigurations > 0, "the day must make greedy act");
    for a in [Arrangement::NodesWhole, Arrangement::NodesClaimed] {
        let mut p = build("greedy", a, &cluster, 8, 0.0).unwrap();
        let (m, log) = run(&set, p.as_mut());
        assert_eq!(m, central, "{a}");
        assert_eq!(log.len(), central_log.len(), "{a}");
        assert_eq!(log[1..], central_log[1..], "{a}");
        match (&log[0], &central_log[0]) {
            (Record::Header(h), Record::Header(c)) => {
                assert_eq!(c.policy, "greedy");
                assert_eq!(h.policy, format!("nodes:8:{}:greedy", a.split().unwrap()));
                assert_eq!(h.gpus, c.gpus);
            }
            _ => panic!("no header"),
        }
    }
}

/// Greedy on a node that records the queue it was shown.
struct Spy {
    inner: Greedy,
    seen: Vec<(Vec<u64>, PendingByProfile)>,
}

impl RepartitionPolicy for Spy {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn initial_layout(&mut self, gpu: usize, g: &'static Geometry) -> Layout {
        self.inner.initial_layout(gpu, g)
    }
    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        self.seen.push((
            view.pending.iter().map(|p| p.id).collect(),
            *view.pending_by_profile,
        ));
        self.inner.decide(view)
    }
}

/// The cluster's view at each epoch, then the per-node wrapper.
struct Outer {
    nodes: PerNode<Spy>,
    seen: Vec<(Vec<u64>, PendingByProfile)>,
}

impl RepartitionPolicy for Outer {
    fn name(&self) -> String {
        self.nodes.name()
    }
    fn initial_layout(&mut self, gpu: usize, g: &'static Geometry) -> Layout {
        self.nodes.initial_layout(gpu, g)
    }
    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        self.seen.push((
            view.pending.iter().map(|p| p.id).collect(),
            *view.pending_by_profile,
        ));
        self.nodes.decide(view)
    }
}

/// At every epoch of a real run, the claimed split shows each waiting job
/// to exactly one node, the one that claims it, and the nodes' counts add
/// up to the cluster's.
#[test]
fn the_claimed_split_shows_each_pending_job_to_exactly_one_node() {
    let cluster = vec![M; 64];
    let set = DaySet::new(&cluster, Heuristic::Edf, vec![day(64, 2)]).unwrap();
    let nodes = Nodes::new(64, 8).unwrap();
    let names = nodes.names().to_vec();
    let spies = (0..8)
        .map(|_| Spy {
            inner: Greedy::new(GreedyConfig::default()),
            seen: Vec::new(),
        })
        .collect();
    let mut outer = Outer {
        nodes: PerNode::new(nodes, Split::Claimed, spies).unwrap(),
        seen: Vec::new(),
    };
    let (m, _) = run(&set, &mut outer);
    assert_eq!(outer.seen.len() as u64, m.epochs);
    let mut shown = 0;
    for (e, (all, counts)) in outer.seen.iter().enumerate() {
        let mut union = Vec::new();
        let mut sum = PendingByProfile::default();
        for (n, name) in names.iter().enumerate() {
            let (ids, c) = &outer.nodes.policy(n).unwrap().seen[e];
            for &id in ids {
                assert!(
                    claims(id, name, &names),
                    "epoch {e}: job {id} shown to {name}"
                );
            }
            union.extend_from_slice(ids);
            for (s, x) in sum.iter_mut().flatten().zip(c.iter().flatten()) {
                *s += x;
            }
        }
        union.sort_unstable();
        let mut all = all.clone();
        all.sort_unstable();
        assert_eq!(
            union, all,
            "epoch {e}: each pending job to exactly one node"
        );
        assert_eq!(&sum, counts, "epoch {e}");
        shown += all.len();
    }
    assert!(
        shown > 100,
        "the day must keep jobs waiting at epochs ({shown})"
    );
}

/// 20 jobs that each need a whole GPU arrive at once on 64 idle GPUs of 8
/// nodes, all in greedy's `4444|3333`. Before jobs were served on demand
/// (issue 54) they waited for the policies: every node that saw the whole
/// queue fused all of its 8 GPUs for the same 20 jobs (64 reconfigurations,
/// 44 whole GPUs never used). Served as smartmigd serves them, each job's
/// allocate fuses one GPU at its arrival, whatever the arrangement: no
/// policy sees the burst waiting, so none reshapes for it.
#[test]
fn a_burst_served_on_demand_reshapes_one_gpu_per_job_in_every_arrangement() {
    let curve = SpeedupCurve {
        beta: 1.0,
        saturation: 1.0,
    };
    let jobs: Vec<Job> = (0..20)
        .map(|id| Job {
            id,
            arrival: 0.0,
            work: 3600.0,
            speedup: curve,
            memory_gb: 30.0,
            deadline: 86_400.0,
            class: JobClass::Training,
            requested_slices: None,
            declared_memory_gb: None,
            template: None,
            memory_growth: None,
            gpus: 1,
        })
        .collect();
    let cluster = vec![M; 64];
    let names = Nodes::new(64, 8).unwrap().names().to_vec();
    let mut claimed = [0usize; 8];
    for j in &jobs {
        claimed[claimant(j.id, &names).unwrap()] += 1;
    }
    assert!(claimed.iter().all(|&c| c <= 8), "{claimed:?}");
    let waste = |a: Arrangement| {
        let mut p = build("greedy", a, &cluster, 8, 0.0).unwrap();
        let mut log = Collect::default();
        let mut h = Heuristic::Edf.build(0);
        let r = simulate(
            &cluster,
            &jobs,
            h.as_mut(),
            p.as_mut(),
            &SimConfig::default(),
            RunHooks {
                sink: Some(&mut log),
                progress: None,
            },
        )
        .unwrap();
        audit(&log.0).unwrap();
        assert_eq!(r.metrics.completed, 20, "{a}");
        count_waste(&log.0)
    };
    for a in [
        Arrangement::Central,
        Arrangement::NodesWhole,
        Arrangement::NodesClaimed,
    ] {
        let w = waste(a);
        assert_eq!((w.reconfigurations, w.wasted()), (20, 0), "{a}");
    }
}

fn desc(g: &Geometry, l: Layout) -> Vec<smartmig::mig::InstanceDesc> {
    g.describe(l)
}

fn picture(g: &Geometry, s: &str) -> Layout {
    g.layouts()
        .iter()
        .copied()
        .find(|&l| g.picture(l) == s)
        .unwrap_or_else(|| panic!("no layout {s}"))
}

fn reconfig(g: &Geometry, time: f64, gpu: usize, from: Layout, to: Layout) -> Record {
    let t = g.transition(from, to);
    Record::Reconfig(ReconfigRecord {
        time,
        gpu,
        destroyed: desc(g, t.destroy),
        created: desc(g, t.create),
        duration: 4.0,
        ready: time + 4.0,
        kind: None,
    })
}

fn run_on(gpu: usize, d: &smartmig::mig::InstanceDesc, start: f64) -> Run {
    Run {
        id: 0,
        arrival: 0.0,
        deadline: 1e6,
        work: 10.0,
        memory_gb: 1.0,
        requested_slices: None,
        speedup: SpeedupCurve {
            beta: 1.0,
            saturation: 1.0,
        },
        gpu,
        profile: d.profile.clone(),
        compute: d.compute,
        memory_slices: d.memory_slices,
        start_slot: d.start,
        instance_memory_gb: 20,
        speed: 1.0,
        start,
        gpus: 1,
    }
}

/// An out-of-memory run uses its instance; a run on the same placement of
/// another GPU does not; an instance destroyed and built again is a new
/// one, unused until a job runs on it.
#[test]
fn wasted_reshapes_on_a_hand_built_log() {
    let g = Geometry::of(M);
    let whole = picture(g, "77777777");
    let halves = picture(g, "4444|3333");
    let half = desc(g, halves)[0].clone();
    let log = vec![
        reconfig(g, 0.0, 0, whole, halves),
        reconfig(g, 0.0, 1, whole, halves),
        // GPU 0's first half ran out of memory: used. GPU 1 ran nothing
        // on that placement, although GPU 0 did.
        Record::Oom(OomRecord {
            run: run_on(0, &half, 5.0),
            asked_memory_gb: 1.0,
            fail: 6.0,
            attempt: 1,
            memory_growth: None,
            early: false,
        }),
        reconfig(g, 10.0, 0, halves, whole),
        reconfig(g, 10.0, 1, halves, whole),
        reconfig(g, 20.0, 1, whole, halves),
        Record::Job(JobRecord {
            run: run_on(1, &half, 30.0),
            end: 40.0,
        }),
    ];
    let w = count_waste(&log);
    assert_eq!(w.reconfigurations, 5);
    assert_eq!(w.created, 2 + 2 + 1 + 1 + 2);
    // Used: GPU 0's first half; GPU 1's first half of the second split.
    assert_eq!(w.used, 2);
    // Undone unused: GPU 0's second half, both of GPU 1's first halves,
    // GPU 1's whole GPU.
    assert_eq!(w.destroyed_unused, 4);
    // Left unused: GPU 0's whole GPU, GPU 1's second half.
    assert_eq!(w.unused_at_end, 2);
    assert_eq!(w.used + w.wasted(), w.created);
    // GPU 1's first split, both merges.
    assert_eq!(w.futile_reconfigurations, 3);
}

/// The experiment end to end on a small cluster: every arrangement runs
/// the same jobs, every log is audited, the counts add up, and the claimed
/// split wastes no more than the whole queue.
#[test]
fn the_experiment_runs_every_arrangement_on_the_same_days() {
    let mut cfg = CoordinationConfig::new(M, 64, 8, scenario("campaigns/tight"));
    cfg.seeds = vec![3];
    let r = run_coordination(&cfg, &mut |_| {}).unwrap();
    assert_eq!(r.nodes, 8);
    assert_eq!(r.audited_logs, 3);
    let labels: Vec<String> = r.rows.iter().map(CoordinationRow::label).collect();
    assert_eq!(
        labels,
        [
            "none",
            "greedy central",
            "greedy nodes/whole",
            "greedy nodes/claimed"
        ]
    );
    let jobs = r.rows[0].days[0].jobs;
    assert!(jobs > 1000);
    for row in &r.rows {
        let d = &row.days[0];
        assert_eq!(d.jobs, jobs, "{}", row.label());
        assert_eq!(d.waste.used + d.waste.wasted(), d.waste.created);
        assert_eq!(row.unserved, 0, "{}", row.label());
    }
    assert_eq!(r.rows[0].reconfigurations, 0.0);
    let whole = r.row("greedy", Arrangement::NodesWhole).unwrap();
    let claimed = r.row("greedy", Arrangement::NodesClaimed).unwrap();
    assert!(whole.reconfigurations > 0.0);
    assert!(
        claimed.wasted <= whole.wasted,
        "{} > {}",
        claimed.wasted,
        whole.wasted
    );
    assert!(serde_json::to_string(&r)
        .unwrap()
        .contains("\"nodes-claimed\""));
}
