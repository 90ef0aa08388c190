//! The strongest *fixed* competitors, found by search: `static-best` (one
//! layout per GPU for the whole run) and `twice-daily` (a day and a night
//! assignment, switched at two times of day, as admins who drain nodes
//! twice a day do).
//!
//! The searches optimise whatever objective the caller passes: an evaluator
//! (`FnMut(&mut dyn RepartitionPolicy) -> Result<Standing, E>`, lower is
//! better: fewer jobs left unserved first, then lower ET; [`Standing`]).
//! The lab's `eval::baselines` passes the standing over *training* days, which makes the result an opponent an admin could really run
//! (`static-hist`, `twice-daily-hist`); passing the scored day itself gives
//! the hindsight references. So the search is pure, deterministic and
//! testable with a fake objective, and its cost is a bounded number of
//! evaluations ([`SearchConfig`]):
//!
//! - **static-best**: (1) every catalog layout on every GPU (19 runs on the
//!   eight-slice models; on a mixed cluster the same catalog index on each
//!   model); (2) two-layout mixes: for every ordered pair of the best
//!   `pair_top` uniform layouts (X, Y) and every k in 1..N, k GPUs of X then
//!   N - k of Y (8 x 7 x 7 = 392 runs on 8 GPUs); (3) coordinate descent
//!   over blocks of GPUs from the best so far: for block sizes N/2, N/4,
//!   ..., 1 and the blocks at the low and the high end of the GPU order
//!   (the engine packs load onto the lowest GPUs, so the two ends see
//!   different loads), try each of the best `top` layouts of step 1 on the
//!   block; keep a move only if it strictly improves; repeat until a pass
//!   improves nothing or the budget is spent. The winner is at least as
//!   good as every uniform layout and every two-layout split by
//!   construction. Its name prints the assignment in the replay syntax of
//!   `static:` (`static:7x 1|1|22|3333 + 1x 77777777`).
//! - **twice-daily**: candidates are the static-best assignment, the next
//!   `mixes` best distinct assignments step (1)-(3) evaluated, and the best
//!   `top` uniform layouts; every ordered (day, night) pair of different
//!   candidates is tried with the switch at 08:00 and 20:00, then the
//!   switch hours of the best three pairs are refined on a 5 x 5 grid (day
//!   04-12 h, night 16-24 h, every 2 h; [`SwitchHours`]). The static-best
//!   assignment on both phases counts as a candidate (with its known
//!   score), so twice-daily is never worse than static-best on the search
//!   objective. A switch is applied at the first decision epoch after the
//!   switch time; a GPU whose busy instances are in the way moves as far as
//!   it can (keeps its busy instances, creates the target's instances that
//!   fit) and completes the move at later epochs, as a rolling drain would.
//!
//! [`SearchConfig::coarse`] is the first wave's smaller search (no pair
//! step, no mixes, the 3 x 3 hour grid for the best pair only), kept for
//! the trainer's teacher.

use super::standing::Standing;
use super::{ClusterView, Decision, PolicyParseError, RepartitionPolicy, StaticLayout};
use crate::mig::{Geometry, GpuModel, Layout};

/// How much searching the two policies may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SearchConfig {
    /// Uniform layouts kept as candidates for the mix and twice-daily steps.
    pub top: usize,
    /// Most evaluations of the coordinate-descent step of static-best.
    pub mix_budget: usize,
    /// Best uniform layouts combined in pairs as "k GPUs of X, the rest
    /// of Y" for every k (0: no pair step).
    pub pair_top: usize,
    /// Best distinct assignments of the static search (besides the winner)
    /// offered to twice-daily as day or night candidates.
    pub mixes: usize,
    /// Switch hours tried for the best twice-daily pairs.
    pub hours: SwitchHours,
}

/// The switch-hour grid of the twice-daily search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchHours {
    /// 3 x 3 around 08:00 / 20:00 (day 06, 08, 10; night 18, 20, 22), for
    /// the best pair only.
    Narrow,
    /// 5 x 5 (day 04-12, night 16-24, every 2 h), for the best three pairs.
    Wide,
}

impl SwitchHours {
    fn grid(self) -> (&'static [f64], &'static [f64], usize) {
        match self {
            SwitchHours::Narrow => (&[6.0, 8.0, 10.0], &[18.0, 20.0, 22.0], 1),
            SwitchHours::Wide => (
                &[4.0, 6.0, 8.0, 10.0, 12.0],
                &[16.0, 18.0, 20.0, 22.0, 0.0],
                3,
            ),
        }
    }
}

impl Default for SearchConfig {
    /// The baselines' search: uniform layouts, every two-layout mix of the
    /// best eight, coordinate descent; twice-daily over the best mixes and
    /// a wide grid of switch hours.
    fn default() -> Self {
        SearchConfig {
            top: 4,
            mix_budget: 40,
            pair_top: 8,
            mixes: 4,
            hours: SwitchHours::Wide,
        }
    }
}

impl SearchConfig {
    /// The first wave's smaller search (uniform layouts and coordinate
    /// descent; twice-daily from static-best and uniform layouts, narrow
    /// hours), which the trainer's teacher still uses.
    pub fn coarse() -> Self {
        SearchConfig {
            top: 4,
            mix_budget: 40,
            pair_top: 0,
            mixes: 0,
            hours: SwitchHours::Narrow,
        }
    }
}

/// A fixed assignment: catalog index per GPU (each GPU's own model catalog).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticMix {
    label: String,
    layouts: Vec<Layout>,
}

/// Catalog layout `index` of `model` (the last one if out of range).
pub(crate) fn catalog_layout(model: GpuModel, index: usize) -> Layout {
    let c = Geometry::of(model).catalog();
    c[index.min(c.len() - 1)]
}

/// Compact description of an assignment: `8x 4444|3333` or
/// `4x 4444|3333 + 4x 2|2|2|1`.
pub fn describe_assignment(cluster: &[GpuModel], layouts: &[Layout]) -> String {
    let mut parts: Vec<(String, usize)> = Vec::new();
    for (m, l) in cluster.iter().zip(layouts) {
        let pic = Geometry::of(*m).picture(*l);
        match parts.last_mut() {
            Some((p, n)) if *p == pic => *n += 1,
            _ => parts.push((pic, 1)),
        }
    }
    parts
        .iter()
        .map(|(p, n)| format!("{n}x {p}"))
        .collect::<Vec<_>>()
        .join(" + ")
}

impl StaticMix {
    /// Catalog index `indices[g]` on GPU `g` of `cluster`.
    pub fn from_indices(label: &str, cluster: &[GpuModel], indices: &[usize]) -> Self {
        StaticMix {
            label: label.to_string(),
            layouts: cluster
                .iter()
                .zip(indices)
                .map(|(&m, &i)| catalog_layout(m, i))
                .collect(),
        }
    }

    /// The layout of every GPU, by index.
    pub fn layouts(&self) -> &[Layout] {
        &self.layouts
    }
}

impl RepartitionPolicy for StaticMix {
    fn name(&self) -> String {
        self.label.clone()
    }

    /// A site's own fixed layouts, run with Slurm's typed MIG GRES.
    fn served_through_shards(&self) -> bool {
        false
    }

    fn initial_layout(&mut self, gpu: usize, geometry: &'static Geometry) -> Layout {
        super::layout_or_whole(&self.layouts, gpu, geometry)
    }

    fn decide(&mut self, _view: &ClusterView<'_>) -> Vec<Decision> {
        Vec::new()
    }
}

/// Two assignments switched at two hours of the day.
#[derive(Clone, Debug, PartialEq)]
pub struct TwiceDaily {
    label: String,
    day: Vec<Layout>,
    night: Vec<Layout>,
    /// Hour the day assignment starts, in [0, 24).
    pub day_hour: f64,
    /// Hour the night assignment starts, in [0, 24).
    pub night_hour: f64,
    /// Hour of day at time 0 (selects the initial assignment).
    pub start_hour: f64,
}

impl TwiceDaily {
    pub fn new(
        label: &str,
        day: Vec<Layout>,
        night: Vec<Layout>,
        day_hour: f64,
        night_hour: f64,
        start_hour: f64,
    ) -> Self {
        TwiceDaily {
            label: label.to_string(),
            day,
            night,
            day_hour,
            night_hour,
            start_hour,
        }
    }

    /// An admin's own schedule, `DAY=SPEC/NIGHT=SPEC` (the text after
    /// `twice:`), e.g. `8=1|1|22|3333/20=4444|3333`: from hour 8 every GPU
    /// of `cluster` is `1|1|22|3333`, from hour 20 `4444|3333`. Each SPEC is
    /// anything `static:` takes, mixes included (`7x1|1|22|3333+1x0`);
    /// hours are whole or fractional, with an optional `h` (`08h`).
    pub fn parse(
        spec: &str,
        cluster: &[GpuModel],
        start_hour: f64,
    ) -> Result<Self, PolicyParseError> {
        let bad = |why: &str| PolicyParseError::BadTwice {
            given: spec.to_string(),
            why: why.to_string(),
        };
        let (day, night) = spec
            .split_once('/')
            .ok_or_else(|| bad("expected DAY=SPEC/NIGHT=SPEC"))?;
        let models = GpuModel::distinct(cluster);
        let phase = |part: &str| -> Result<(f64, Vec<Layout>), PolicyParseError> {
            let (hour, layout) = part
                .split_once('=')
                .ok_or_else(|| bad(&format!("`{}` is not HOUR=SPEC", part.trim())))?;
            let hour = hour.trim();
            let hour: f64 = hour
                .strip_suffix('h')
                .unwrap_or(hour)
                .parse()
                .ok()
                .filter(|h: &f64| (0.0..24.0).contains(h))
                .ok_or_else(|| bad(&format!("hour `{hour}` is not in [0, 24)")))?;
            let fixed = StaticLayout::parse(layout, &models)?;
            let layouts = cluster
                .iter()
                .enumerate()
                .map(|(gpu, &m)| fixed.layout_of(gpu, m))
                .collect();
            Ok((hour, layouts))
        };
        let (day_hour, day) = phase(day)?;
        let (night_hour, night) = phase(night)?;
        if day_hour == night_hour {
            return Err(bad("the two hours are the same"));
        }
        Ok(TwiceDaily::new(
            &format!("twice:{}", spec.trim()),
            day,
            night,
            day_hour,
            night_hour,
            start_hour,
        ))
    }

    /// Whether `hour` falls in the day phase.
    pub fn is_day(&self, hour: f64) -> bool {
        let h = hour.rem_euclid(24.0);
        if self.day_hour <= self.night_hour {
            h >= self.day_hour && h < self.night_hour
        } else {
            h >= self.day_hour || h < self.night_hour
        }
    }

    fn phase(&self, hour: f64) -> &[Layout] {
        if self.is_day(hour) {
            &self.day
        } else {
            &self.night
        }
    }

    pub fn day(&self) -> &[Layout] {
        &self.day
    }

    /// `day 08h 8x 4444|3333 / night 20h 8x 77777777`.
    pub fn schedule(&self, cluster: &[GpuModel]) -> String {
        format!(
            "day {:02}h {} / night {:02}h {}",
            self.day_hour as u32,
            describe_assignment(cluster, &self.day),
            self.night_hour as u32,
            describe_assignment(cluster, &self.night)
        )
    }

    pub fn night(&self) -> &[Layout] {
        &self.night
    }
}

impl RepartitionPolicy for TwiceDaily {
    fn name(&self) -> String {
        self.label.clone()
    }

    /// A site's own fixed layouts, run with Slurm's typed MIG GRES.
    fn served_through_shards(&self) -> bool {
        false
    }

    fn initial_layout(&mut self, gpu: usize, geometry: &'static Geometry) -> Layout {
        super::layout_or_whole(self.phase(self.start_hour), gpu, geometry)
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        let targets = self.phase(view.hour_of_day);
        let mut out = Vec::new();
        for (gpu, status) in view.gpus.iter().enumerate() {
            let Some(&target) = targets.get(gpu) else {
                continue;
            };
            if let Some(target) = super::step_toward(status, target) {
                out.push(Decision { gpu, target });
            }
        }
        out
    }
}

/// One evaluated candidate.
#[derive(Clone, Debug, PartialEq)]
pub struct Scored {
    /// `8x 4444|3333`, or `day 8x ... / night 8x ... (08-20)`.
    pub description: String,
    pub score: Standing,
}

/// What the static-best search found.
#[derive(Clone, Debug)]
pub struct StaticBest {
    pub policy: StaticMix,
    pub score: Standing,
    /// Every uniform catalog layout, best first (catalog index, score).
    pub uniform: Vec<(usize, Standing)>,
    /// Every evaluated assignment (catalog index per GPU), best first.
    pub ranked: Vec<(Vec<usize>, Standing)>,
    pub evaluations: usize,
}

/// What the twice-daily search found.
#[derive(Clone, Debug)]
pub struct TwiceDailyBest {
    pub policy: TwiceDaily,
    pub score: Standing,
    pub evaluations: usize,
}

/// Catalog length used for uniform assignments on `cluster` (the longest).
fn catalog_len(cluster: &[GpuModel]) -> usize {
    cluster
        .iter()
        .map(|&m| Geometry::of(m).catalog().len())
        .max()
        .unwrap_or(0)
}

/// Searches the best static assignment (module docs). `evaluate` runs one
/// policy on the workload and returns its objective (lower is better).
pub fn static_best<E>(
    cluster: &[GpuModel],
    cfg: &SearchConfig,
    evaluate: &mut dyn FnMut(&mut dyn RepartitionPolicy) -> Result<Standing, E>,
) -> Result<StaticBest, E> {
    let n = cluster.len();
    let mut ranked: Vec<(Vec<usize>, Standing)> = Vec::new();
    let mut eval = |indices: &[usize]| -> Result<Standing, E> {
        let mut p = StaticMix::from_indices("static-best", cluster, indices);
        let score = evaluate(&mut p)?;
        ranked.push((indices.to_vec(), score));
        Ok(score)
    };

    // (1) Uniform layouts.
    let mut uniform: Vec<(usize, Standing)> = Vec::new();
    for i in 0..catalog_len(cluster) {
        uniform.push((i, eval(&vec![i; n])?));
    }
    uniform.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
    let Some(&(first, first_score)) = uniform.first() else {
        let policy = StaticMix::from_indices("static-best", cluster, &[]);
        return Ok(StaticBest {
            policy,
            score: Standing::WORST,
            uniform,
            ranked: Vec::new(),
            evaluations: 0,
        });
    };
    let mut best = vec![first; n];
    let mut best_score = first_score;
    let mut seen: Vec<Vec<usize>> = vec![best.clone()];

    // (2) Two-layout mixes: k GPUs of X, then n - k of Y, for every k.
    let pair: Vec<usize> = uniform.iter().take(cfg.pair_top).map(|u| u.0).collect();
    for &x in &pair {
        for &y in &pair {
            if x == y {
                continue;
            }
            for k in 1..n {
                let mut trial = vec![x; k];
                trial.resize(n, y);
                let score = eval(&trial)?;
                seen.push(trial.clone());
                if score < best_score {
                    best = trial;
                    best_score = score;
                }
            }
        }
    }

    // (3) Coordinate descent over blocks at both ends of the GPU order.
    let top: Vec<usize> = uniform.iter().take(cfg.top.max(1)).map(|u| u.0).collect();
    let mut blocks: Vec<usize> = Vec::new();
    let mut s = n / 2;
    while s >= 1 {
        if !blocks.contains(&s) {
            blocks.push(s);
        }
        s /= 2;
    }
    let mut spent = 0;
    'descent: loop {
        let mut improved = false;
        for &size in &blocks {
            for from in [0, n - size] {
                for &layout in &top {
                    if spent >= cfg.mix_budget {
                        break 'descent;
                    }
                    let mut trial = best.clone();
                    trial[from..from + size]
                        .iter_mut()
                        .for_each(|x| *x = layout);
                    if seen.contains(&trial) {
                        continue;
                    }
                    seen.push(trial.clone());
                    spent += 1;
                    let score = eval(&trial)?;
                    if score < best_score {
                        best = trial;
                        best_score = score;
                        improved = true;
                    }
                }
            }
        }
        if !improved {
            break;
        }
    }
    let evaluations = ranked.len();
    // Stable: among equal scores the earlier (simpler) assignment first.
    ranked.sort_by_key(|a| a.1);
    ranked.dedup_by(|a, b| a.0 == b.0);
    let mut policy = StaticMix::from_indices("static-best", cluster, &best);
    policy.label = format!(
        "static-best ({})",
        describe_assignment(cluster, &policy.layouts)
    );
    Ok(StaticBest {
        policy,
        score: best_score,
        uniform,
        ranked,
        evaluations,
    })
}

/// Searches the best twice-daily pair (module docs), reusing the ranking of
/// [`static_best`]. `start_hour` is the hour of day at time 0.
pub fn twice_daily<E>(
    cluster: &[GpuModel],
    cfg: &SearchConfig,
    statics: &StaticBest,
    start_hour: f64,
    evaluate: &mut dyn FnMut(&mut dyn RepartitionPolicy) -> Result<Standing, E>,
) -> Result<TwiceDailyBest, E> {
    let mut candidates: Vec<Vec<Layout>> = vec![statics.policy.layouts().to_vec()];
    let to_layouts = |indices: &[usize]| -> Vec<Layout> {
        cluster
            .iter()
            .zip(indices)
            .map(|(&m, &i)| catalog_layout(m, i))
            .collect()
    };
    let mixes = statics
        .ranked
        .iter()
        .map(|(indices, _)| to_layouts(indices))
        .filter(|l| !candidates.contains(l))
        .take(cfg.mixes)
        .collect::<Vec<_>>();
    candidates.extend(mixes);
    for &(i, _) in statics.uniform.iter().take(cfg.top.max(1)) {
        let l: Vec<Layout> = cluster.iter().map(|&m| catalog_layout(m, i)).collect();
        if !candidates.contains(&l) {
            candidates.push(l);
        }
    }
    let mut evaluations = 0;
    let mut run = |d: usize, nt: usize, dh: f64, nh: f64| -> Result<Standing, E> {
        let mut p = TwiceDaily::new(
            "twice-daily",
            candidates[d].clone(),
            candidates[nt].clone(),
            dh,
            nh,
            start_hour,
        );
        evaluations += 1;
        evaluate(&mut p)
    };
    // The static-best assignment on both phases is a twice-daily schedule
    // too (already evaluated), so the result is never worse than it.
    let mut best: (Standing, usize, usize, f64, f64) = (statics.score, 0, 0, 8.0, 20.0);
    let mut pairs: Vec<(Standing, usize, usize)> = Vec::new();
    for d in 0..candidates.len() {
        for nt in 0..candidates.len() {
            if d != nt {
                let s = run(d, nt, 8.0, 20.0)?;
                pairs.push((s, d, nt));
                if s < best.0 {
                    best = (s, d, nt, 8.0, 20.0);
                }
            }
        }
    }
    pairs.sort_by_key(|a| a.0);
    let (day_hours, night_hours, refine) = cfg.hours.grid();
    let refined: Vec<(usize, usize)> = match cfg.hours {
        // Only a pair that beat static-best at 08/20.
        SwitchHours::Narrow => Some((best.1, best.2))
            .filter(|p| p.0 != p.1)
            .into_iter()
            .collect(),
        SwitchHours::Wide => pairs.iter().take(refine).map(|p| (p.1, p.2)).collect(),
    };
    for (d, nt) in refined {
        for &dh in day_hours {
            for &nh in night_hours {
                if (dh, nh) != (8.0, 20.0) {
                    let s = run(d, nt, dh, nh)?;
                    if s < best.0 {
                        best = (s, d, nt, dh, nh);
                    }
                }
            }
        }
    }
    let (score, d, nt, dh, nh) = best;
    let (day, night) = (candidates[d].clone(), candidates[nt].clone());
    let mut policy = TwiceDaily::new("", day, night, dh, nh, start_hour);
    policy.label = format!("twice-daily ({})", policy.schedule(cluster));
    Ok(TwiceDailyBest {
        policy,
        score,
        evaluations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{GpuStatus, PendingByProfile};

    const M: GpuModel = GpuModel::A100_40gb;

    /// A fake objective: distance of each GPU's layout from a target index.
    fn objective(
        target: Vec<usize>,
    ) -> impl FnMut(&mut dyn RepartitionPolicy) -> Result<Standing, ()> {
        move |p| {
            let g = Geometry::of(M);
            Ok(Standing::new(
                0,
                target
                    .iter()
                    .enumerate()
                    .map(|(i, &t)| {
                        let l = p.initial_layout(i, g);
                        let got = g.catalog_index(l).unwrap_or(99);
                        (got as f64 - t as f64).abs()
                    })
                    .sum(),
            ))
        }
    }

    /// An assignment that leaves a job unserved never wins, whatever its
    /// ET: here every layout but 5 starves one job at ET 0, layout 5
    /// serves all at ET 7.
    #[test]
    fn searches_never_prefer_leaving_jobs_unserved() {
        let cluster = vec![M; 2];
        let mut f = |p: &mut dyn RepartitionPolicy| -> Result<Standing, ()> {
            let g = Geometry::of(M);
            let all_five = (0..2).all(|i| g.catalog_index(p.initial_layout(i, g)) == Some(5));
            Ok(if all_five {
                Standing::new(0, 7.0)
            } else {
                Standing::new(1, 0.0)
            })
        };
        let r = static_best(&cluster, &SearchConfig::default(), &mut f).unwrap();
        assert_eq!((r.score.unserved, r.score.et), (0, 7.0));
        let td = twice_daily(&cluster, &SearchConfig::default(), &r, 0.0, &mut f).unwrap();
        assert_eq!(td.score.unserved, 0);
    }

    #[test]
    fn static_best_beats_every_uniform_layout_and_finds_mixes() {
        let cluster = vec![M; 4];
        let mut f = objective(vec![3, 3, 5, 5]);
        let r = static_best(&cluster, &SearchConfig::coarse(), &mut f).unwrap();
        assert_eq!(r.uniform.len(), 19);
        assert!(r.uniform.iter().all(|u| r.score <= u.1));
        let g = Geometry::of(M);
        let got: Vec<usize> = r
            .policy
            .layouts()
            .iter()
            .map(|&l| g.catalog_index(l).unwrap())
            .collect();
        assert_eq!(got, vec![3, 3, 5, 5]);
        assert_eq!(r.score, Standing::new(0, 0.0));
        assert!(r.evaluations <= 19 + SearchConfig::coarse().mix_budget);
        assert!(
            r.policy.name().starts_with("static-best (2x "),
            "{}",
            r.policy.name()
        );
        // Deterministic.
        let mut f2 = objective(vec![3, 3, 5, 5]);
        let r2 = static_best(&cluster, &SearchConfig::coarse(), &mut f2).unwrap();
        assert_eq!(r2.policy, r.policy);
    }

    /// "k GPUs of X + the rest of Y" for a k the block descent never tries
    /// (3 of 4: blocks are halves and single GPUs at the ends): the pair
    /// step finds it, the coarse search does not.
    #[test]
    fn pair_step_finds_every_split_of_two_layouts() {
        let cluster = vec![M; 4];
        // Layout 5 is the best uniform one and 9 the second: far from the
        // target on three GPUs, the pair (9 x3, 5 x1) is exact.
        let target = vec![9, 9, 9, 5];
        let cost = |indices: &[usize]| -> f64 {
            let hit: f64 = indices
                .iter()
                .zip(&target)
                .map(|(a, b)| if a == b { 0.0 } else { 1.0 })
                .sum();
            // Uniform layouts other than 5 and 9 are poor.
            hit + if indices.iter().all(|&i| i != 5 && i != 9) {
                10.0
            } else {
                0.0
            }
        };
        let mut f = |p: &mut dyn RepartitionPolicy| -> Result<Standing, ()> {
            let g = Geometry::of(M);
            let idx: Vec<usize> = (0..4)
                .map(|i| g.catalog_index(p.initial_layout(i, g)).unwrap_or(99))
                .collect();
            Ok(Standing::new(0, cost(&idx)))
        };
        let cfg = SearchConfig {
            mix_budget: 0,
            ..SearchConfig::default()
        };
        let r = static_best(&cluster, &cfg, &mut f).unwrap();
        assert_eq!(r.score.et, 0.0, "{}", r.policy.name());
        assert!(
            r.policy.name().contains("3x 3333|1|1|1|. + 1x 3333|22|1|."),
            "{}",
            r.policy.name()
        );
        // Every evaluation is ranked, best first, without duplicates.
        assert_eq!(r.ranked[0].1.et, 0.0);
        assert!(r
            .ranked
            .windows(2)
            .all(|w| w[0].1 <= w[1].1 && w[0].0 != w[1].0));
        let coarse = static_best(
            &cluster,
            &SearchConfig {
                mix_budget: 0,
                ..SearchConfig::coarse()
            },
            &mut f,
        )
        .unwrap();
        assert!(coarse.score.et > 0.0);
        // The twice-daily search offers the best mixes as candidates.
        let td = twice_daily(&cluster, &cfg, &r, 0.0, &mut f).unwrap();
        assert!(td.score <= r.score);
    }

    #[test]
    fn an_admins_twice_daily_schedule_parses_and_bad_ones_say_why() {
        let g = Geometry::of(M);
        let pic = |l: Layout| g.picture(l);
        let cluster = [M; 3];
        let p = TwiceDaily::parse("08h=2x1|1|22|3333+1x0/20=4444|3333", &cluster, 0.0).unwrap();
        assert_eq!((p.day_hour, p.night_hour), (8.0, 20.0));
        let day: Vec<String> = p.day().iter().map(|&l| pic(l)).collect();
        assert_eq!(day, ["1|1|22|3333", "1|1|22|3333", "77777777"]);
        assert!(p.night().iter().all(|&l| pic(l) == "4444|3333"));
        assert_eq!(p.name(), "twice:08h=2x1|1|22|3333+1x0/20=4444|3333");
        for (bad, why) in [
            ("8=1", "DAY=SPEC/NIGHT=SPEC"),
            ("8=1/1", "is not HOUR=SPEC"),
            ("24=1/3=2", "hour `24` is not in [0, 24)"),
            ("x=1/3=2", "hour `x`"),
            ("8=1/8h=2", "the two hours are the same"),
        ] {
            let e = TwiceDaily::parse(bad, &cluster, 0.0)
                .unwrap_err()
                .to_string();
            assert!(e.contains(why) && e.contains(bad), "{bad}: {e}");
        }
        // A layout that is not one of the model's is the static parser's error.
        let e = TwiceDaily::parse("8=4444|4444/20=1", &cluster, 0.0).unwrap_err();
        assert!(matches!(e, PolicyParseError::BadPicture { .. }), "{e}");
        // Only a command that knows the cluster builds it.
        let e = crate::policy::parse_policy("twice:8=1/20=2", &[M])
            .err()
            .unwrap();
        assert!(matches!(e, PolicyParseError::NeedsCluster(_)), "{e}");
        let p = crate::policy::parse_policy_on("twice:8=1/20=2", &cluster, 0.0).unwrap();
        assert_eq!(p.name(), "twice:8=1/20=2");
    }

    #[test]
    fn twice_daily_switches_with_the_hour_and_keeps_busy_instances() {
        let g = Geometry::of(M);
        let day = g.catalog()[0];
        let night = g.catalog()[g.catalog().len() - 1]; // 1g x7
        let mut p = TwiceDaily::new("t", vec![day], vec![night], 8.0, 20.0, 0.0);
        assert_eq!(p.initial_layout(0, g), night);
        assert!(p.is_day(12.0) && !p.is_day(21.0) && !p.is_day(3.0));
        let mut status = GpuStatus::new(M, night);
        let counts = PendingByProfile::default();
        let mut view = |s: &[GpuStatus], h: f64| -> Vec<Decision> {
            let v = ClusterView {
                now: 0.0,
                hour_of_day: h,
                gpus: s,
                pending: &[],
                pending_by_profile: &counts,
                arrivals: &[],
            };
            p.decide(&v)
        };
        assert!(view(std::slice::from_ref(&status), 3.0).is_empty());
        let d = view(std::slice::from_ref(&status), 9.0);
        assert_eq!(
            d,
            vec![Decision {
                gpu: 0,
                target: day
            }]
        );
        // One 1g busy: the 7g cannot be made; nothing else of `day` fits.
        status.busy = Layout::single(night.iter().next().unwrap());
        assert!(view(std::slice::from_ref(&status), 9.0).is_empty());
        // Night target from a 4g+3g with the 4g busy: keep it, make 1g's.
        let mixed = g
            .catalog()
            .iter()
            .copied()
            .find(|&l| g.picture(l) == "4444|3333")
            .unwrap();
        let mut s2 = GpuStatus::new(M, mixed);
        s2.busy = mixed
            .iter()
            .find(|&id| g.spot(id).compute() == 4)
            .map(Layout::single)
            .unwrap();
        let d = view(std::slice::from_ref(&s2), 21.0);
        assert_eq!(d.len(), 1);
        assert!(d[0].target.contains_all(s2.busy));
        assert!(s2.accepts(d[0].target));
        assert_eq!(g.picture(d[0].target), "4444|1|1|1|.");
        // The target's instances take precedence over idle ones in the way.
        let cur = g
            .layout_from(&[
                (crate::mig::Shape::new(4, 4), 0),
                (crate::mig::Shape::new(2, 2), 4),
            ])
            .unwrap();
        let mut s3 = GpuStatus::new(M, cur);
        s3.busy = s2.busy;
        let d = view(std::slice::from_ref(&s3), 21.0);
        assert_eq!(g.picture(d[0].target), "4444|1|1|1|.");
    }

    #[test]
    fn twice_daily_search_is_bounded() {
        let cluster = vec![M; 2];
        let mut f = objective(vec![2, 2]);
        let coarse = SearchConfig::coarse();
        let sb = static_best(&cluster, &coarse, &mut f).unwrap();
        let r = twice_daily(&cluster, &coarse, &sb, 0.0, &mut f).unwrap();
        // At most (top + 1)^2 pairs + 8 refinements.
        assert!(r.evaluations <= 5 * 4 + 8, "{}", r.evaluations);
        // The wide search: (1 + mixes + top)^2 pairs + 3 x 24 refinements.
        let wide = SearchConfig::default();
        let sb = static_best(&cluster, &wide, &mut f).unwrap();
        let r = twice_daily(&cluster, &wide, &sb, 0.0, &mut f).unwrap();
        let c = 1 + wide.mixes + wide.top;
        assert!(r.evaluations <= c * (c - 1) + 3 * 24, "{}", r.evaluations);
        assert!(r.policy.name().starts_with("twice-daily (day "));
    }
}
