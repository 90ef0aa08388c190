//! The imitation teacher and the baseline searches the trainer uses: the
//! teacher ([`Teacher`]) is a demand-covering greedy that rests on layouts
//! ([`Base`]) searched on training days by `policy::search` (static-best,
//! twice-daily, best uniform layout) or `policy::adaptive`. The same
//! searches give the static-best reference the trainer reports.

use super::config::{TeacherBase, TrainConfig};
use super::data::Day;
use super::LearnError;
use crate::mig::{Geometry, GpuModel, Layout, SpotId};
use crate::policy::adaptive::Adaptive;
use crate::policy::{ClusterView, Decision, GpuStatus, RepartitionPolicy};
use crate::sim::Standing;

/// The imitation teacher: a nos-style greedy plus a resting layout.
///
/// In GPU order, each GPU that may change picks the reachable catalog
/// layout that covers the most still-uncovered waiting demand (in compute
/// slices), counting only gains over its current layout; ties go to fewer
/// changed instances, then the lower catalog index. A GPU with nothing to
/// gain returns to `base` (the best static layout of a training day) when
/// it can without touching busy instances: demand-only greedy never
/// partitions a cluster whose queue is empty, and so misses most of the
/// gain of MIG (several jobs per GPU).
#[derive(Clone, Debug)]
pub struct Teacher {
    model: GpuModel,
    /// Resting layout per GPU position (scaled to the cluster's size), by
    /// day and by night.
    base: Base,
}

/// Resting layouts of the teacher.
#[derive(Clone, Debug, Default)]
pub struct Base {
    pub day: Vec<Layout>,
    pub night: Vec<Layout>,
    /// Hours the day and the night assignments start.
    pub day_hour: f64,
    pub night_hour: f64,
    /// When set, the resting layouts follow this load-driven rule instead
    /// of the clock (`teacher_base = "adaptive"`).
    pub adaptive: Option<Adaptive>,
}

impl Base {
    /// The same layouts all day.
    pub fn fixed(layouts: Vec<Layout>) -> Self {
        Base {
            night: layouts.clone(),
            day: layouts,
            day_hour: 0.0,
            night_hour: 0.0,
            adaptive: None,
        }
    }

    fn at(&self, hour: f64) -> &[Layout] {
        let day = if self.day_hour <= self.night_hour {
            hour >= self.day_hour && hour < self.night_hour
        } else {
            hour >= self.day_hour || hour < self.night_hour
        };
        if day {
            &self.day
        } else {
            &self.night
        }
    }
}

impl Teacher {
    pub fn new(model: GpuModel, base: Base) -> Self {
        Teacher { model, base }
    }

    /// The resting layout of GPU `gpu` of `n` at `hour`.
    fn base_of(&self, gpu: usize, n: usize, hour: f64) -> Option<Layout> {
        let base = self.base.at(hour);
        if base.is_empty() || n == 0 {
            return None;
        }
        base.get(gpu * base.len() / n).copied()
    }

    /// Catalog index per GPU of the model (or `None` = keep), plus the
    /// decisions.
    pub fn choose(&self, view: &ClusterView<'_>) -> Vec<(usize, Option<usize>)> {
        let g = Geometry::of(self.model);
        let catalog = g.catalog();
        let mut demand = Demand::new(g, self.model, view);
        let adaptive = self.base.adaptive.map(|a| a.targets(view));
        let mut out = Vec::new();
        for (gi, st) in view.gpus.iter().enumerate() {
            if st.model != self.model {
                continue;
            }
            let rest = || {
                match &adaptive {
                    Some(t) => t.get(gi).copied(),
                    None => self.base_of(gi, view.gpus.len(), view.hour_of_day),
                }
                .filter(|&b| b != st.layout && st.accepts(b))
                .and_then(|b| g.catalog_index(b))
            };
            if st.in_reconfiguration {
                out.push((gi, None));
                continue;
            }
            if demand.covered() {
                out.push((gi, rest()));
                continue;
            }
            match demand.best_target(st) {
                Some(a) => {
                    demand.claim(st, catalog[a]);
                    out.push((gi, Some(a)));
                }
                None => out.push((gi, rest())),
            }
        }
        out
    }
}

impl RepartitionPolicy for Teacher {
    fn name(&self) -> String {
        "teacher".into()
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        let catalog = Geometry::of(self.model).catalog();
        self.choose(view)
            .into_iter()
            .filter_map(|(gpu, a)| {
                a.map(|a| Decision {
                    gpu,
                    target: catalog[a],
                })
            })
            .collect()
    }
}

/// The waiting demand the teacher has not covered yet, per instance shape.
///
/// Demand is counted per (compute, memory) shape of the model's catalog
/// instances, each job in the smallest shape with at least its compute and
/// memory slices; idle instances of the current layouts cover it first.
struct Demand {
    geometry: &'static Geometry,
    /// Every instance shape of the catalog, sorted.
    sizes: Vec<(u8, u8)>,
    /// Jobs per shape not covered by an idle instance (negative: idle
    /// instances to spare).
    uncovered: Vec<i64>,
}

impl Demand {
    fn new(g: &'static Geometry, model: GpuModel, view: &ClusterView<'_>) -> Self {
        let sizes: Vec<(u8, u8)> = {
            let mut v: Vec<(u8, u8)> = g
                .catalog()
                .iter()
                .flat_map(|l| l.iter().map(|id| g.spot(id).shape()))
                .map(|s| (s.compute, s.memory))
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let class_of =
            |compute: u8, memory: u8| sizes.iter().position(|&(c, m)| c >= compute && m >= memory);
        let mut uncovered = vec![0i64; sizes.len()];
        for job in view.pending {
            if let Some(s) = job.shape(model) {
                if let Some(k) = class_of(s.compute, s.memory) {
                    uncovered[k] += 1;
                }
            }
        }
        let mut demand = Demand {
            geometry: g,
            sizes,
            uncovered,
        };
        for st in view.gpus.iter().filter(|s| s.model == model) {
            for id in st.idle().iter() {
                if let Some(k) = demand.size_of(id) {
                    demand.uncovered[k] -= 1;
                }
            }
        }
        demand
    }

    /// The shape class of instance `id` (exact shape).
    fn size_of(&self, id: SpotId) -> Option<usize> {
        let s = self.geometry.spot(id).shape();
        self.sizes
            .iter()
            .position(|&(c, m)| c == s.compute && m == s.memory)
    }

    fn covered(&self) -> bool {
        self.uncovered.iter().all(|&u| u <= 0)
    }

    /// Idle instances per shape class if `st` had layout `l`.
    fn idle_counts(&self, st: &GpuStatus, l: Layout) -> Vec<i64> {
        let mut c = vec![0i64; self.sizes.len()];
        for id in l.minus(st.busy).iter() {
            if let Some(k) = self.size_of(id) {
                c[k] += 1;
            }
        }
        c
    }

    /// Compute slices of uncovered demand that `counts` instances cover.
    fn cover(&self, counts: &[i64]) -> i64 {
        counts
            .iter()
            .zip(&self.uncovered)
            .zip(&self.sizes)
            .map(|((&n, &u), &(c, _))| n.min(u.max(0)) * i64::from(c))
            .sum()
    }

    /// The catalog index of the reachable layout of `st` that covers the
    /// most uncovered demand with what it adds over the current layout
    /// (ties: fewer changed instances, then the lower index); `None` when
    /// no layout covers any.
    fn best_target(&self, st: &GpuStatus) -> Option<usize> {
        let g = self.geometry;
        // Idle instances of the current layout are already subtracted
        // from `uncovered`: only what a target adds counts.
        let current = self.idle_counts(st, st.layout);
        let mut best: Option<(i64, usize, usize)> = None;
        for (a, &target) in g.catalog().iter().enumerate() {
            if target == st.layout || !st.accepts(target) {
                continue;
            }
            let counts = self.idle_counts(st, target);
            // Instances the target adds over the current layout.
            let gained: Vec<i64> = counts
                .iter()
                .zip(&current)
                .map(|(&t, &c)| (t - c).max(0))
                .collect();
            let score = self.cover(&gained);
            let changed = g.transition(st.layout, target);
            let churn = changed.destroy.len() + changed.create.len();
            if score > 0 && best.is_none_or(|(s, ch, _)| score > s || (score == s && churn < ch)) {
                best = Some((score, churn, a));
            }
        }
        best.map(|(_, _, a)| a)
    }

    /// Counts the instances `target` adds over the current layout of `st`
    /// as covering demand.
    fn claim(&mut self, st: &GpuStatus, target: Layout) {
        let current = self.idle_counts(st, st.layout);
        let counts = self.idle_counts(st, target);
        for (k, (&t, &c)) in counts.iter().zip(&current).enumerate() {
            self.uncovered[k] -= (t - c).max(0);
        }
    }
}

/// The `static-best` assignment of [`crate::policy::search`] on `day`
/// (hindsight coordinate descent over per-GPU catalog layouts) and its ET.
/// The objective is the day's [`Day::objective`]: a layout that leaves
/// jobs unserved never wins over one that serves them all.
pub fn static_best(cfg: &TrainConfig, day: &Day) -> Result<(f64, Vec<Layout>, String), LearnError> {
    let mut evaluate = objective(cfg, std::slice::from_ref(day));
    let best = crate::policy::search::static_best(
        &day.cluster,
        &crate::policy::search::SearchConfig::coarse(),
        &mut evaluate,
    )?;
    let label = crate::policy::search::describe_assignment(&day.cluster, best.policy.layouts());
    Ok((best.score.et, best.policy.layouts().to_vec(), label))
}

/// The search objective over `days` (same cluster): the jobs left unserved
/// summed, then the mean ET (`sim::Standing`).
fn objective<'a>(
    cfg: &'a TrainConfig,
    days: &'a [Day],
) -> impl FnMut(&mut dyn RepartitionPolicy) -> Result<Standing, LearnError> + 'a {
    move |p: &mut dyn RepartitionPolicy| {
        let mut each = Vec::with_capacity(days.len());
        for day in days {
            each.push(day.objective(cfg, p)?);
        }
        Ok(Standing::over(each))
    }
}

/// The `twice-daily` search of [`crate::policy::search`] on `days` (mean
/// objective), as the teacher's day and night resting layouts.
pub fn twice_daily_base(cfg: &TrainConfig, days: &[Day]) -> Result<Base, LearnError> {
    if days.is_empty() {
        return Ok(Base::default());
    }
    let best = twice_daily_search(cfg, days)?;
    Ok(Base {
        day: best.policy.day().to_vec(),
        night: best.policy.night().to_vec(),
        day_hour: best.policy.day_hour,
        night_hour: best.policy.night_hour,
        adaptive: None,
    })
}

/// The `twice-daily` search of [`crate::policy::search`] on `days` (mean
/// objective; `days` must not be empty).
pub fn twice_daily_search(
    cfg: &TrainConfig,
    days: &[Day],
) -> Result<crate::policy::search::TwiceDailyBest, LearnError> {
    let first = days
        .first()
        .ok_or_else(|| LearnError::Other("twice-daily search needs a day".into()))?;
    let mut evaluate = objective(cfg, days);
    let scfg = crate::policy::search::SearchConfig::coarse();
    let statics = crate::policy::search::static_best(&first.cluster, &scfg, &mut evaluate)?;
    crate::policy::search::twice_daily(
        &first.cluster,
        &scfg,
        &statics,
        cfg.workload.start_hour,
        &mut evaluate,
    )
}

/// The [`Adaptive`] rule with the lowest mean objective on `days`: a grid
/// over the best uniform layouts (as split layout), thresholds and gains.
pub fn adaptive_search(
    cfg: &TrainConfig,
    days: &[Day],
) -> Result<(Adaptive, Standing), LearnError> {
    let g = Geometry::of(cfg.gpu_model);
    let mut evaluate = objective(cfg, days);
    // Split layouts: the best uniform ones that are not the whole GPU.
    let mut uniform = Vec::new();
    for (i, &l) in g.catalog().iter().enumerate() {
        if l == g.whole_gpu() {
            continue;
        }
        let mut p = Adaptive {
            split: i,
            threshold: 0.0,
            gain: 1e9,
        };
        uniform.push((evaluate(&mut p)?, i));
    }
    uniform.sort_by_key(|a| a.0);
    let mut best = (
        Standing::WORST,
        Adaptive {
            split: 0,
            threshold: 0.0,
            gain: 0.0,
        },
    );
    for &(_, split) in uniform.iter().take(4) {
        for threshold in [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0] {
            for gain in [0.25, 0.5, 1.0, 2.0, 4.0, 1e9] {
                let mut p = Adaptive {
                    split,
                    threshold,
                    gain,
                };
                let sc = evaluate(&mut p)?;
                if sc < best.0 {
                    best = (sc, p);
                }
            }
        }
    }
    Ok((best.1, best.0))
}

/// The teacher's resting layouts searched on `days` (`cfg.teacher_base`).
pub fn teacher_base(cfg: &TrainConfig, days: &[Day]) -> Result<Base, LearnError> {
    let Some(first) = days.first() else {
        return Ok(Base::default());
    };
    Ok(match cfg.teacher_base {
        TeacherBase::Uniform => Base::fixed(vec![best_uniform(cfg, days)?]),
        TeacherBase::Adaptive => Base {
            adaptive: Some(adaptive_search(cfg, days)?.0),
            ..Base::default()
        },
        TeacherBase::StaticBest => {
            let best = crate::policy::search::static_best(
                &first.cluster,
                &crate::policy::search::SearchConfig::coarse(),
                &mut objective(cfg, days),
            )?;
            Base::fixed(best.policy.layouts().to_vec())
        }
        TeacherBase::TwiceDaily => twice_daily_base(cfg, days)?,
    })
}

/// The catalog layout that ranks first on `days` when every GPU uses it
/// (the fewest jobs left unserved, then the lowest mean ET).
pub fn best_uniform(cfg: &TrainConfig, days: &[Day]) -> Result<Layout, LearnError> {
    let g = Geometry::of(cfg.gpu_model);
    let mut best = (Standing::WORST, g.whole_gpu());
    for &l in g.catalog() {
        let mut each = Vec::with_capacity(days.len());
        for day in days {
            let mut p = crate::policy::search::StaticMix::from_indices(
                "uniform",
                &day.cluster,
                &vec![g.catalog_index(l).unwrap_or(0); day.cluster.len()],
            );
            each.push(day.objective(cfg, &mut p)?);
        }
        let score = Standing::over(each);
        if score < best.0 {
            best = (score, l);
        }
    }
    Ok(best.1)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{day, tiny};
    use super::*;
    use crate::mig::Shape;
    use crate::policy::{PendingJob, MODEL_COUNT};
    use crate::workload::SpeedupCurve;

    const M: GpuModel = GpuModel::A100_40gb;

    fn pending(id: u64, compute: u8, memory: u8) -> PendingJob {
        let mut shapes = [None; MODEL_COUNT];
        shapes[M as usize] = Some(Shape { compute, memory });
        PendingJob {
            id,
            arrival: 0.0,
            deadline: 10_000.0,
            work: 100.0,
            memory_gb: 4.0,
            min_compute: compute,
            speedup: SpeedupCurve::default(),
            shapes,
        }
    }

    fn choose(
        teacher: &Teacher,
        gpus: &[GpuStatus],
        pending: &[PendingJob],
        hour: f64,
    ) -> Vec<(usize, Option<usize>)> {
        let counts = [[0; 8]; MODEL_COUNT];
        teacher.choose(&ClusterView {
            now: 0.0,
            hour_of_day: hour,
            gpus,
            pending,
            pending_by_profile: &counts,
            arrivals: &[],
        })
    }

    /// The catalog index of a layout picture.
    fn index(picture: &str) -> usize {
        let g = Geometry::of(M);
        g.catalog()
            .iter()
            .position(|&l| g.picture(l) == picture)
            .expect(picture)
    }

    fn layout(picture: &str) -> Layout {
        Geometry::of(M).catalog()[index(picture)]
    }

    /// Seven one-slice jobs wait: the first GPU splits into seven 1g
    /// instances, which covers them all, so the second stays at rest.
    #[test]
    fn covers_waiting_demand_first() {
        let g = Geometry::of(M);
        let gpus = vec![GpuStatus::new(M, g.whole_gpu()); 2];
        let jobs: Vec<_> = (0..7).map(|i| pending(i, 1, 1)).collect();
        let t = Teacher::new(M, Base::fixed(vec![g.whole_gpu()]));
        let seven = index("1|1|1|1|1|1|1|.");
        assert_eq!(
            choose(&t, &gpus, &jobs, 12.0),
            vec![(0, Some(seven)), (1, None)]
        );
        // Two 4-slice jobs: each GPU covers one; of the layouts with a 4g
        // instance, 4g+3g changes the fewest instances. As decisions they
        // are re-shapes.
        let jobs = [pending(0, 4, 4), pending(1, 4, 4)];
        let mut t = t;
        let d = t.decide(&ClusterView {
            now: 0.0,
            hour_of_day: 12.0,
            gpus: &gpus,
            pending: &jobs,
            pending_by_profile: &[[0; 8]; MODEL_COUNT],
            arrivals: &[],
        });
        assert_eq!(d.len(), 2);
        for x in &d {
            assert_eq!(g.picture(x.target), "4444|3333");
        }
    }

    /// Nothing waits: every GPU that can goes to its resting layout, the
    /// day's or the night's by the hour (the day may wrap past midnight);
    /// a GPU in reconfiguration or with a busy instance in the way keeps.
    #[test]
    fn rests_by_day_and_by_night() {
        let g = Geometry::of(M);
        let mut gpus = vec![GpuStatus::new(M, g.whole_gpu()); 4];
        gpus[2].in_reconfiguration = true;
        gpus[3].busy = g.whole_gpu();
        let base = Base {
            day: vec![layout("4444|3333")],
            night: vec![layout("3333|3333")],
            day_hour: 20.0,
            night_hour: 6.0,
            adaptive: None,
        };
        let t = Teacher::new(M, base);
        for (hour, rest) in [(22.0, "4444|3333"), (3.0, "4444|3333"), (12.0, "3333|3333")] {
            let a = Some(index(rest));
            assert_eq!(
                choose(&t, &gpus, &[], hour),
                vec![(0, a), (1, a), (2, None), (3, None)],
                "{hour} h"
            );
        }
        // No resting layouts: keep.
        let t = Teacher::new(M, Base::default());
        assert!(choose(&t, &gpus, &[], 12.0)
            .iter()
            .all(|(_, a)| a.is_none()));
    }

    /// Resting layouts are spread over the cluster by position: two
    /// layouts over four GPUs give two GPUs each.
    #[test]
    fn resting_layouts_scale_to_the_cluster() {
        let t = Teacher::new(
            M,
            Base::fixed(vec![layout("4444|3333"), layout("3333|3333")]),
        );
        let got: Vec<_> = (0..4).map(|gpu| t.base_of(gpu, 4, 0.0)).collect();
        let (a, b) = (layout("4444|3333"), layout("3333|3333"));
        assert_eq!(got, vec![Some(a), Some(a), Some(b), Some(b)]);
    }

    /// The searches on a tiny day give catalog layouts for every GPU; the
    /// static-best one is no worse than `none` (whole GPUs are one of its
    /// candidates); each teacher base comes out of its own search.
    #[test]
    fn searches_on_a_tiny_day() {
        let cfg = tiny();
        let days = [day(&cfg, 1)];
        let catalog = Geometry::of(cfg.gpu_model).catalog();
        let (et, layouts, label) = static_best(&cfg, &days[0]).unwrap();
        assert_eq!(layouts.len(), 3);
        assert!(layouts.iter().all(|l| catalog.contains(l)));
        assert!(et <= 1.0 + 1e-12, "{et:?}");
        assert!(!label.is_empty());
        assert!(catalog.contains(&best_uniform(&cfg, &days).unwrap()));
        for kind in [
            TeacherBase::Uniform,
            TeacherBase::StaticBest,
            TeacherBase::TwiceDaily,
            TeacherBase::Adaptive,
        ] {
            let cfg = TrainConfig {
                teacher_base: kind,
                ..tiny()
            };
            let base = teacher_base(&cfg, &days).unwrap();
            if kind == TeacherBase::Adaptive {
                assert!(base.adaptive.is_some());
            } else {
                assert!(base.adaptive.is_none());
                assert!(!base.day.is_empty() && !base.night.is_empty(), "{kind:?}");
                assert!(base
                    .day
                    .iter()
                    .chain(&base.night)
                    .all(|l| catalog.contains(l)));
            }
            let mut teacher = Teacher::new(cfg.gpu_model, base);
            assert!(days[0].evaluate(&cfg, &mut teacher).unwrap().1.is_finite());
        }
        assert!(teacher_base(&cfg, &[]).unwrap().day.is_empty());
        assert!(twice_daily_search(&cfg, &[]).is_err());
    }
}
