//! What Slurm may still offer on one GPU (issue 42).
//!
//! Slurm counts a GPU's free *shards*; MIG builds *instances*. The two
//! disagree when the free compute slices cannot form the instance a job
//! needs: next to `3g.20gb@0` and `3g.20gb@4` on an A100-40GB one slice is
//! free but no 1g fits (no memory slot is left), and next to `3g.20gb@4`
//! four slices are free but a `3g` and a `1g` cannot both be built. A job
//! that Slurm places on such shards waits in smartmigd and is requeued.
//!
//! [`Geometry::offer`] says how many of a GPU's free slices Slurm may offer
//! next to its busy instances, under an [`OfferRule`]; the rest is
//! *stranded* and smartmigd holds it in Slurm (a placeholder allocation of
//! those shards, docs/slurm-integration.md §9) until a neighbour ends.
//!
//! Billable sizes are the model's compute sizes (1, 2, 3, 4 and 7 on the
//! 7-slice models): `job_submit.lua` bills `shard:5` and `shard:6` as 7.
//! An instance of compute `k` serves any job billed `k`; where a profile has
//! a larger-memory variant (`1g.10gb`), the smaller one fits wherever the
//! larger does, so memory variants do not change the offer.
//!
//! A GPU with nothing busy offers all its slices under both rules: a
//! whole-GPU job needs every shard, and holding one back would starve it.
//! Three jobs of 3, 3 and 1 shards placed on an empty A100 by one scheduling
//! pass therefore still meet a 1g that cannot be built; the hold appears as
//! soon as the first of them runs.
//! [`Geometry::turned_away`] says which job of such a pass to refuse at
//! placement (the 1), so that the rest are built together.

use super::geometry::Geometry;
use super::layout::{Layout, SpotId};

/// How much of a GPU's free compute Slurm may offer next to busy instances.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OfferRule {
    /// Every single billable size up to the offer can be built: the next
    /// job always fits. Several jobs placed by one scheduling pass may
    /// still not fit together (3 and 1 next to `3g@4`); the hold is then
    /// updated after each start, so a requeued job does not land there
    /// again. Nothing buildable is held back.
    NextJob,
    /// Every combination of billable sizes that adds up to at most the
    /// offer can be built together: no scheduling pass can place jobs that
    /// MIG cannot serve. Holds back capacity that some combinations could
    /// use (next to `3g@4` a `4g` fits, but 3+1 does not, so only 3 are
    /// offered).
    AnyMix,
}

impl OfferRule {
    /// The name used in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            OfferRule::NextJob => "next-job",
            OfferRule::AnyMix => "any-mix",
        }
    }
}

impl std::str::FromStr for OfferRule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "next-job" => Ok(OfferRule::NextJob),
            "any-mix" => Ok(OfferRule::AnyMix),
            other => Err(format!(
                "unknown offer rule `{other}`: use `next-job` or `any-mix`"
            )),
        }
    }
}

impl std::fmt::Display for OfferRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Seconds a GPU holds by [`OfferRule::AnyMix`] after a job was turned
/// away or requeued there, under [`OfferPolicy::Adaptive`]: an hour, so that
/// a burst of small jobs keeps the strict rule while it lasts.
pub const COLLISION_MEMORY_S: u64 = 3600;

/// Which [`OfferRule`] each GPU's holds follow (issue 55).
///
/// `any-mix` never lets a pass place jobs MIG cannot build together, but it
/// holds back shards a single job could use: next to `3g@4` a 4-shard job
/// fits, yet only 3 shards are offered, so every 4-shard job waits for an
/// empty GPU. `next-job` offers them and risks a pass that places 3 + 1
/// there. Where jobs are long and passes seldom place two on one GPU,
/// `next-job` serves more (Slurm-like engine, tight deadlines: 9-18 % less
/// ET); under bursts of short jobs it requeues about 10 in 100.
/// `Adaptive` holds by `next-job` until a job is turned away or requeued
/// on the GPU, then by `any-mix` for [`COLLISION_MEMORY_S`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OfferPolicy {
    /// One rule on every GPU, always.
    Fixed(OfferRule),
    /// `next-job`, `any-mix` for a while on a GPU where jobs collided.
    Adaptive,
}

impl OfferPolicy {
    /// The rule for a GPU whose last collision was `since_collision_s`
    /// seconds ago (`None`: never).
    pub fn on_gpu(self, since_collision_s: Option<u64>) -> OfferRule {
        match self {
            OfferPolicy::Fixed(rule) => rule,
            OfferPolicy::Adaptive => match since_collision_s {
                Some(s) if s < COLLISION_MEMORY_S => OfferRule::AnyMix,
                _ => OfferRule::NextJob,
            },
        }
    }

    /// The name used in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            OfferPolicy::Fixed(rule) => rule.name(),
            OfferPolicy::Adaptive => "adaptive",
        }
    }
}

impl std::str::FromStr for OfferPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "adaptive" => Ok(OfferPolicy::Adaptive),
            other => other
                .parse::<OfferRule>()
                .map(OfferPolicy::Fixed)
                .map_err(|_| {
                    format!("unknown hold rule `{other}`: use `adaptive`, `next-job` or `any-mix`")
                }),
        }
    }
}

impl std::fmt::Display for OfferPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Instance counts per compute size (index = compute slices, 0..=7).
type Counts = [u8; 8];

/// The most jobs of one scheduling pass on one GPU that
/// [`Geometry::turned_away`] searches (2^n sets): a 7-slice GPU holds at
/// most 7 shard jobs, plus allocates still waiting there.
pub const MAX_PASS: usize = 12;

/// Jobs counted by the compute size they are billed (index = compute
/// slices, 0..=7): the jobs Slurm has placed on a GPU that hold no instance
/// yet, which one allocate's choice of spot must leave room for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mix(Counts);

impl Mix {
    /// The mix of jobs billed these compute sizes (0 and sizes above 7
    /// are ignored: no instance serves them).
    pub fn of(sizes: impl IntoIterator<Item = u8>) -> Mix {
        let mut c = [0u8; 8];
        for k in sizes.into_iter().filter(|&k| k > 0) {
            if let Some(n) = c.get_mut(usize::from(k)) {
                *n = n.saturating_add(1);
            }
        }
        Mix(c)
    }

    /// No job to leave room for.
    pub fn is_empty(&self) -> bool {
        self.0 == [0; 8]
    }
}

impl Geometry {
    /// Compute slices Slurm may offer on a GPU whose busy instances are
    /// `busy` (at most its free slices; all of them when nothing is busy).
    pub fn offer(&self, busy: Layout, rule: OfferRule) -> u8 {
        let total = self.spec.compute_slices;
        let free = total.saturating_sub(self.compute_used(busy));
        if busy.is_empty() {
            return total;
        }
        let sizes = self.spec.compute_sizes();
        match rule {
            OfferRule::NextJob => {
                // The first size that cannot be built bounds the offer.
                let blocked = sizes
                    .iter()
                    .copied()
                    .filter(|&k| k <= free)
                    .find(|&k| !self.buildable(busy, &single(k)));
                blocked.map_or(free, |k| k - 1)
            }
            OfferRule::AnyMix => {
                let room = self.room_beside(busy);
                let mut offer = 0;
                for f in 1..=free {
                    let mut all = true;
                    for_each_mix(&sizes, f, &mut |mix| {
                        all &= room.iter().any(|r| covers(r, mix));
                    });
                    if !all {
                        break;
                    }
                    offer = f;
                }
                offer
            }
        }
    }

    /// Slices of a GPU's free shards that Slurm must not offer: its free
    /// shards in Slurm's count (`slurm_free`) beyond [`Geometry::offer`].
    pub fn stranded(&self, busy: Layout, slurm_free: u8, rule: OfferRule) -> u8 {
        slurm_free.saturating_sub(self.offer(busy, rule))
    }

    /// The first of `options` (placements a job could get, in the caller's
    /// order of preference) after which Slurm's offer next to the busy
    /// instances is largest: placing a job where it rules out the least of
    /// what Slurm may still send to this GPU (two 1g next to each other at
    /// slots 4 and 6 would leave no room for the 3g a scheduling pass placed
    /// with them). `None` when `options` is empty.
    pub fn keeping_offer(
        &self,
        busy: Layout,
        options: impl IntoIterator<Item = SpotId>,
        rule: OfferRule,
    ) -> Option<SpotId> {
        options
            .into_iter()
            .enumerate()
            .min_by_key(|&(i, id)| (std::cmp::Reverse(self.offer(busy.with(id), rule)), i))
            .map(|(_, id)| id)
    }

    /// Whether every job of `mates` can still be built once `id` is taken
    /// beside `busy` (trivially so without mates).
    pub fn leaves_room(&self, busy: Layout, id: SpotId, mates: &Mix) -> bool {
        mates.is_empty() || self.buildable(busy.with(id), &mates.0)
    }

    /// The spot a job gets, of `options` (the spots that serve it, in
    /// smartmigd's order of preference: reuse, create, re-shape).
    ///
    /// First, the options after which the `mates` can all still be built:
    /// the other jobs Slurm placed on this GPU that hold no instance yet.
    /// One scheduling pass often starts several jobs on a GPU whose free
    /// shards they fill exactly; served one at a time at the spot that is
    /// best for each alone, the first ones can rule out the last (2, 1, 1
    /// and 3 shards on an empty A100: `2g@4`, `1g@0`, `1g@6`, and no 3g is
    /// left, though `3g@4 2g@0 1g@2 1g@3` serves all four), which is then
    /// requeued. When no option leaves room for all of them (3 + 3 + 1),
    /// every option stays in the running. Then, with holds, the one after
    /// which Slurm's offer stays largest ([`Geometry::keeping_offer`]);
    /// without, the first. `None` when `options` is empty.
    pub fn choose_spot(
        &self,
        busy: Layout,
        options: &[SpotId],
        mates: &Mix,
        holds: Option<OfferRule>,
    ) -> Option<SpotId> {
        let roomy: Vec<SpotId> = if mates.is_empty() {
            Vec::new()
        } else {
            options
                .iter()
                .copied()
                .filter(|&id| self.leaves_room(busy, id, mates))
                .collect()
        };
        let pool = if roomy.is_empty() { options } else { &roomy };
        match holds {
            None => pool.first().copied(),
            Some(rule) => self.keeping_offer(busy, pool.iter().copied(), rule),
        }
    }

    /// Of the jobs one scheduling pass placed on a GPU (their billed
    /// compute sizes, `pass`, in the pass's order: the earliest first),
    /// the ones to turn away so that all the others can be built beside
    /// `busy` together; empty when every one fits.
    ///
    /// Why: three jobs of 3, 3 and 1 shards that one pass places on an
    /// empty A100-40GB fill its 7 shards, but the two 3g take all 8
    /// memory slices and no layout holds the 1g beside them. Served one
    /// at a time, one of them waits `allocate_wait_s` for room that only
    /// a neighbour's end can make, and is requeued after all; deciding
    /// on the whole set tells the one that cannot fit at once, and lets
    /// the rest leave room for each other ([`Geometry::choose_spot`]).
    ///
    /// Kept are the most compute slices, then the most jobs; among equal
    /// sets the latest jobs are turned away (3 + 3 + 1 turns away the 1:
    /// six slices kept rather than four). A pass of more than
    /// [`MAX_PASS`] jobs is not searched (empty: no decision).
    pub fn turned_away(&self, busy: Layout, pass: &[u8]) -> Vec<usize> {
        let n = pass.len();
        if n == 0 || n > MAX_PASS {
            return Vec::new();
        }
        let room = self.room_beside(busy);
        let counts =
            |mask: u32| Mix::of((0..n).filter(|&i| mask & (1 << i) != 0).map(|i| pass[i])).0;
        let fits = |mask: u32| room.iter().any(|r| covers(r, &counts(mask)));
        let all = (1u32 << n) - 1;
        if fits(all) {
            return Vec::new();
        }
        let kept = (0..all)
            .filter(|&mask| fits(mask))
            .max_by_key(|&mask| {
                let compute: u32 = (0..n)
                    .filter(|&i| mask & (1 << i) != 0)
                    .map(|i| u32::from(pass[i]))
                    .sum();
                // A larger mask of the turned-away keeps earlier jobs.
                (compute, mask.count_ones(), all & !mask)
            })
            .unwrap_or(0);
        (0..n).filter(|&i| kept & (1 << i) == 0).collect()
    }

    /// Whether instances of the compute sizes in `mix` can all be built
    /// next to `busy`.
    pub fn buildable(&self, busy: Layout, mix: &Counts) -> bool {
        self.room_beside(busy).iter().any(|r| covers(r, mix))
    }

    /// For each valid layout that keeps `busy`, the instances it adds,
    /// counted by compute size: what can be built beside `busy`.
    fn room_beside(&self, busy: Layout) -> Vec<Counts> {
        self.reachable(busy, self.layouts())
            .map(|l| {
                let mut c = [0u8; 8];
                for id in l.minus(busy).iter() {
                    c[usize::from(self.spot(id).compute())] += 1;
                }
                c
            })
            .collect()
    }
}

fn single(k: u8) -> Counts {
    let mut c = [0u8; 8];
    c[usize::from(k)] = 1;
    c
}

fn covers(room: &Counts, mix: &Counts) -> bool {
    room.iter().zip(mix).all(|(r, m)| r >= m)
}

/// Calls `f` with every multiset of `sizes` whose sum is exactly `total`.
fn for_each_mix(sizes: &[u8], total: u8, f: &mut dyn FnMut(&Counts)) {
    fn go(sizes: &[u8], left: u8, mix: &mut Counts, f: &mut dyn FnMut(&Counts)) {
        if left == 0 {
            f(mix);
            return;
        }
        let Some((&k, rest)) = sizes.split_first() else {
            return;
        };
        let mut n = 0;
        loop {
            go(rest, left - n * k, mix, f);
            if (n + 1) * k > left {
                break;
            }
            n += 1;
            mix[usize::from(k)] += 1;
        }
        mix[usize::from(k)] -= n;
    }
    go(sizes, total, &mut [0u8; 8], f);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GpuModel, Shape};

    fn a100() -> &'static Geometry {
        Geometry::of(GpuModel::A100_40gb)
    }

    /// `busy` from `(compute, memory slices, start)` triples.
    fn busy(g: &Geometry, inst: &[(u8, u8, u8)]) -> Layout {
        inst.iter().fold(Layout::EMPTY, |l, &(c, m, s)| {
            l.with(
                g.spot_id(
                    Shape {
                        compute: c,
                        memory: m,
                    },
                    s,
                )
                .expect("placement"),
            )
        })
    }

    #[test]
    fn adaptive_holds_strictly_for_an_hour_after_a_collision_and_offers_the_room_otherwise() {
        let a: OfferPolicy = "adaptive".parse().unwrap();
        assert_eq!(a.on_gpu(None), OfferRule::NextJob);
        assert_eq!(a.on_gpu(Some(0)), OfferRule::AnyMix);
        assert_eq!(a.on_gpu(Some(COLLISION_MEMORY_S - 1)), OfferRule::AnyMix);
        assert_eq!(a.on_gpu(Some(COLLISION_MEMORY_S)), OfferRule::NextJob);
        let fixed: OfferPolicy = "any-mix".parse().unwrap();
        assert_eq!(fixed.on_gpu(None), OfferRule::AnyMix);
        assert_eq!(fixed.name(), "any-mix");
        let e = "strict".parse::<OfferPolicy>().unwrap_err();
        assert!(e.contains("`strict`") && e.contains("adaptive"), "{e}");
        // Next to 3g@4 a 4-shard job fits: next-job offers it, any-mix not.
        let g = a100();
        let b = busy(g, &[(3, 4, 4)]);
        assert_eq!(g.offer(b, a.on_gpu(None)), 4);
        assert_eq!(g.offer(b, a.on_gpu(Some(60))), 3);
    }

    #[test]
    fn mixes_are_every_multiset_of_the_sum() {
        let mut seen = Vec::new();
        for_each_mix(&[1, 2, 3, 4, 7], 4, &mut |m| seen.push(*m));
        // 4; 3+1; 2+2; 2+1+1; 1+1+1+1.
        assert_eq!(seen.len(), 5, "{seen:?}");
        for m in &seen {
            let sum: u32 = m
                .iter()
                .enumerate()
                .map(|(k, &n)| k as u32 * u32::from(n))
                .sum();
            assert_eq!(sum, 4);
        }
    }

    #[test]
    fn an_empty_gpu_offers_everything() {
        for m in GpuModel::ALL {
            let g = Geometry::of(m);
            for rule in [OfferRule::NextJob, OfferRule::AnyMix] {
                assert_eq!(g.offer(Layout::EMPTY, rule), g.spec.compute_slices, "{m:?}");
            }
        }
    }

    #[test]
    fn two_3g_strand_the_seventh_slice() {
        let g = a100();
        let b = busy(g, &[(3, 4, 0), (3, 4, 4)]);
        for rule in [OfferRule::NextJob, OfferRule::AnyMix] {
            assert_eq!(g.offer(b, rule), 0);
            assert_eq!(g.stranded(b, 1, rule), 1);
        }
    }

    #[test]
    fn one_3g_strands_a_slice_under_both_rules() {
        // 3g@0: slots 4-7 hold a 3g, or 2g+1g, or three 1g (slot 7 takes no
        // 1g); a 4g needs slot 0.
        let g = a100();
        let b = busy(g, &[(3, 4, 0)]);
        assert_eq!(g.offer(b, OfferRule::NextJob), 3);
        assert_eq!(g.offer(b, OfferRule::AnyMix), 3);
        assert_eq!(g.stranded(b, 4, OfferRule::NextJob), 1);
    }

    #[test]
    fn the_rules_differ_where_one_job_fits_but_not_every_mix() {
        let g = a100();
        // 3g@4: a 4g fits at 0, but 3+1 does not.
        let b = busy(g, &[(3, 4, 4)]);
        assert_eq!(g.offer(b, OfferRule::NextJob), 4);
        assert_eq!(g.offer(b, OfferRule::AnyMix), 3);
        // 1g@6 (where smartmigd puts a first 1g): every size fits, but
        // 3+3 and 3+2+1 do not.
        let b = busy(g, &[(1, 1, 6)]);
        assert_eq!(g.offer(b, OfferRule::NextJob), 6);
        assert_eq!(g.offer(b, OfferRule::AnyMix), 5);
    }

    #[test]
    fn a_badly_placed_1g_blocks_the_4g() {
        let g = a100();
        let b = busy(g, &[(1, 1, 0)]);
        assert_eq!(g.offer(b, OfferRule::NextJob), 3);
        assert_eq!(g.offer(b, OfferRule::AnyMix), 3);
    }

    #[test]
    fn any_mix_never_offers_more_than_next_job() {
        for m in GpuModel::ALL {
            let g = Geometry::of(m);
            for &l in g.layouts() {
                let free = g.spec.compute_slices - g.compute_used(l);
                let next = g.offer(l, OfferRule::NextJob);
                let any = g.offer(l, OfferRule::AnyMix);
                assert!(any <= next && next <= free, "{m:?} {l:?}");
                // What is offered is buildable one job at a time.
                for &k in &g.spec.compute_sizes() {
                    if k <= next {
                        assert!(g.buildable(l, &single(k)), "{m:?} {l:?} {k}");
                    }
                }
            }
        }
    }

    /// Spots for one job of compute `k` in free space beside `layout`, in
    /// smartmigd's order (most headroom first, as [`Geometry::best_spot`]).
    fn create_options(g: &Geometry, layout: Layout, k: u8) -> Vec<SpotId> {
        let p = g
            .spec
            .profiles
            .iter()
            .filter(|p| p.shape.compute == k)
            .min_by_key(|p| p.shape.memory)
            .expect("a profile of every compute size");
        let mut ids: Vec<SpotId> = g.candidates(layout, p.shape).collect();
        ids.sort_by_key(|&id| (std::cmp::Reverse(g.headroom(layout.with(id))), id));
        ids
    }

    /// Serves `jobs` one at a time in this order, each told of the ones
    /// still to come when `lookahead`; `true` when every one got a spot.
    fn serve_in_order(g: &Geometry, jobs: &[u8], lookahead: bool) -> bool {
        let mut busy = Layout::EMPTY;
        for (n, &k) in jobs.iter().enumerate() {
            let mates = if lookahead {
                Mix::of(jobs[n + 1..].iter().copied())
            } else {
                Mix::default()
            };
            let options = create_options(g, busy, k);
            match g.choose_spot(busy, &options, &mates, None) {
                Some(id) => busy = busy.with(id),
                None => return false,
            }
        }
        true
    }

    /// Every distinct order of the multiset `jobs`.
    fn orders(jobs: &[u8]) -> Vec<Vec<u8>> {
        if jobs.is_empty() {
            return vec![Vec::new()];
        }
        let mut out = Vec::new();
        let mut firsts = jobs.to_vec();
        firsts.sort_unstable();
        firsts.dedup();
        for k in firsts {
            let mut rest = jobs.to_vec();
            let at = rest.iter().position(|&j| j == k).expect("present");
            rest.remove(at);
            for mut o in orders(&rest) {
                o.insert(0, k);
                out.push(o);
            }
        }
        out
    }

    #[test]
    fn a_burst_that_fits_together_is_served_in_any_order() {
        for m in GpuModel::ALL {
            let g = Geometry::of(m);
            for total in 1..=g.spec.compute_slices {
                for_each_mix(&g.spec.compute_sizes(), total, &mut |mix| {
                    if !g.buildable(Layout::EMPTY, mix) {
                        return;
                    }
                    let jobs: Vec<u8> = (0u8..8)
                        .flat_map(|k| std::iter::repeat_n(k, usize::from(mix[usize::from(k)])))
                        .collect();
                    for order in orders(&jobs) {
                        assert!(serve_in_order(g, &order, true), "{m:?}: {order:?}");
                    }
                });
            }
        }
    }

    #[test]
    fn without_the_mates_a_burst_can_rule_out_its_last_job() {
        // The burst measured on the real Slurm (docs/slurm-integration.md
        // §9): 2, 1, 1 and 3 shards on an empty A100, which fit together.
        let g = a100();
        assert!(g.buildable(Layout::EMPTY, &Mix::of([2, 1, 1, 3]).0));
        assert!(!serve_in_order(g, &[2, 1, 1, 3], false));
        assert!(serve_in_order(g, &[2, 1, 1, 3], true));
    }

    #[test]
    fn a_pass_that_fits_turns_no_one_away() {
        let g = a100();
        assert!(g.turned_away(Layout::EMPTY, &[4, 2, 1]).is_empty());
        assert!(g.turned_away(Layout::EMPTY, &[2, 1, 1, 3]).is_empty());
        assert!(g.turned_away(Layout::EMPTY, &[]).is_empty());
    }

    #[test]
    fn three_three_one_turns_away_the_one_in_any_order() {
        let g = a100();
        assert_eq!(g.turned_away(Layout::EMPTY, &[3, 3, 1]), vec![2]);
        assert_eq!(g.turned_away(Layout::EMPTY, &[1, 3, 3]), vec![0]);
        assert_eq!(g.turned_away(Layout::EMPTY, &[3, 1, 3]), vec![1]);
        // After both 3g are built, the 1g alone is turned away.
        let two = busy(g, &[(3, 4, 0), (3, 4, 4)]);
        assert_eq!(g.turned_away(two, &[1]), vec![0]);
        // Beside one built 3g, the other 3g is kept and the 1 turned away.
        let one = busy(g, &[(3, 4, 4)]);
        assert_eq!(g.turned_away(one, &[3, 1]), vec![1]);
    }

    #[test]
    fn the_most_compute_then_the_most_jobs_are_kept_and_the_latest_go() {
        let g = a100();
        // Beside a busy 1g@6, 3 + 2 + 1 has no layout; 3 + 2 and 2 + 2 + 1
        // keep 5 slices each: the three jobs are kept, the 3 goes.
        let b = busy(g, &[(1, 1, 6)]);
        assert!(!g.buildable(b, &Mix::of([3, 2, 1]).0));
        assert_eq!(g.turned_away(b, &[3, 2, 2, 1]), vec![0]);
        assert!(g.buildable(b, &Mix::of([2, 2, 1]).0));
        // Beside 3g@0 and 2g@4 only a 1g@6 is left: of three equal jobs
        // the first is kept, the later two go.
        let two = busy(g, &[(3, 4, 0), (2, 2, 4)]);
        assert_eq!(g.turned_away(two, &[1, 1, 1]), vec![1, 2]);
    }

    #[test]
    fn mates_that_cannot_all_fit_leave_the_usual_choice() {
        // 3 + 3 + 1 cannot be built at all: the first 3g goes where it
        // would without them.
        let g = a100();
        let options = create_options(g, Layout::EMPTY, 3);
        let with = g.choose_spot(Layout::EMPTY, &options, &Mix::of([3, 1]), None);
        assert_eq!(with, options.first().copied());
        assert_eq!(Mix::of([0]), Mix::default());
        assert!(Mix::of([0, 9]).is_empty());
    }

    #[test]
    fn a_placement_keeps_what_slurm_may_still_send() {
        let g = a100();
        // 1g@6 busy, a second 1g: at slot 4 or 5 it rules out the 3g@4 that
        // next-job still offers; at slot 0-3 it rules out the 4g. Either way
        // the offer drops; the choice keeps the larger one.
        let b = busy(g, &[(1, 1, 6)]);
        let ones: Vec<SpotId> = g
            .candidates(
                b,
                Shape {
                    compute: 1,
                    memory: 1,
                },
            )
            .collect();
        let best = g
            .keeping_offer(b, ones.iter().copied(), OfferRule::AnyMix)
            .unwrap();
        let worst = ones
            .iter()
            .map(|&id| g.offer(b.with(id), OfferRule::AnyMix))
            .min()
            .unwrap();
        assert!(g.offer(b.with(best), OfferRule::AnyMix) > worst);
        assert_eq!(g.keeping_offer(b, [], OfferRule::NextJob), None);
    }

    #[test]
    fn rules_parse_and_print() {
        for r in [OfferRule::NextJob, OfferRule::AnyMix] {
            assert_eq!(r.name().parse::<OfferRule>(), Ok(r));
        }
        assert!("most"
            .parse::<OfferRule>()
            .unwrap_err()
            .contains("next-job"));
    }
}
