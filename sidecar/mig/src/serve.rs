//! How one request is served on one GPU, on demand: the rule smartmigd's
//! allocate runs and both simulators model, written once (issue 54).
//!
//! In smartmigd's order of preference (brief §2), four tiers:
//! 1. reuse an idle instance of the request's room with the least memory
//!    that suffices;
//! 2. lend an idle *bigger* instance, the smallest first ([`GpuNow::lend`],
//!    issue 55): the job starts at once, as it would under a fixed MIG
//!    layout, and the holds keep Slurm off the shards it does not pay for;
//! 3. create the profile in free space (the spot that leaves the most
//!    [`Headroom`](crate::Headroom) first);
//! 4. re-shape idle instances for it ([`Geometry::reshapes_for`], fewest
//!    destroyed first); never a busy one.
//!
//! The first tier with a way that leaves room for the jobs placed beside
//! the request wins (else the first tier with any way); within it,
//! [`Geometry::choose_spot`] keeps Slurm's offer largest under holds. A
//! cheaper tier is never traded for a larger offer: each build is a
//! reconfiguration that delays its job, and building where an instance
//! stood idle made the deployed loop reshape 27 times per GPU per day
//! (docs/evaluation.md §6f). Pure: the daemon maps the chosen [`Way`] onto
//! its instances' uuids, the simulators onto their GPU state.

use super::geometry::Geometry;
use super::layout::{Layout, SpotId};
use super::models::ProfileSpec;
use super::offer::{Mix, OfferRule};

/// What a GPU offers a request right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuNow {
    /// Every instance that exists or is being built.
    pub layout: Layout,
    /// Instances no way may touch: busy, reserved, or being built.
    pub taken: Layout,
    /// Idle instances that may be handed out as they are (ready and
    /// healthy).
    pub reusable: Layout,
    /// Whether instances may be created or destroyed now (no other
    /// reconfiguration of this GPU in the way): `false` leaves only reuse.
    pub may_build: bool,
    /// Whether an idle instance bigger than the request may be handed out
    /// (lent) when none of its own room is idle. The job runs on more
    /// slices than it is billed; the holds keep Slurm off the shards it
    /// takes beyond them ([`Geometry::stranded`]), so [`Geometry::serve`]
    /// lends only with holds.
    pub lend: bool,
}

/// One way to serve a request at a spot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// Hand out the idle instance at the spot.
    Reuse,
    /// Hand out the idle instance at the spot, bigger than the request.
    Lend,
    /// Create the instance at the spot in free space.
    Create,
    /// Destroy these idle instances, then create at the spot.
    Reshape { destroy: Layout },
}

impl Way {
    /// This way's tier, in smartmigd's order of preference (module docs):
    /// reuse, lend, create, re-shape.
    fn tier(self) -> u8 {
        match self {
            Way::Reuse => 0,
            Way::Lend => 1,
            Way::Create => 2,
            Way::Reshape { .. } => 3,
        }
    }

    /// Instances this way destroys.
    pub fn destroyed(self) -> Layout {
        match self {
            Way::Reshape { destroy } => destroy,
            Way::Reuse | Way::Lend | Way::Create => Layout::EMPTY,
        }
    }
}

impl Geometry {
    /// Every way to serve `profile` with at least `want_gb` of memory on a
    /// GPU in state `now`, best first (module docs).
    pub fn ways_to_serve(
        &self,
        now: GpuNow,
        profile: &ProfileSpec,
        want_gb: f64,
    ) -> Vec<(SpotId, Way)> {
        let mut reuse: Vec<SpotId> = now
            .reusable
            .minus(now.taken)
            .iter()
            .filter(|&id| {
                // The same room, not only the same compute: an idle
                // `1g.10gb` blocks two shards and a `shard:1` job is
                // billed one (`ModelSpec::room_profile`, issue 55).
                let p = self.spot(id).profile;
                p.shape.compute == profile.shape.compute
                    && self.spec.room_shards(p) == self.spec.room_shards(profile)
                    && f64::from(p.memory_gb) >= want_gb
            })
            .collect();
        reuse.sort_by_key(|&id| (self.spot(id).profile.memory_gb, self.spot(id).start, id));
        let mut ways: Vec<(SpotId, Way)> = reuse.into_iter().map(|id| (id, Way::Reuse)).collect();
        if now.lend {
            ways.extend(
                self.lendable(now, profile, want_gb)
                    .map(|id| (id, Way::Lend)),
            );
        }
        if !now.may_build {
            return ways;
        }
        let mut create: Vec<SpotId> = self.candidates(now.layout, profile.shape).collect();
        create.sort_by_key(|&id| (std::cmp::Reverse(self.headroom(now.layout.with(id))), id));
        ways.extend(create.into_iter().map(|id| (id, Way::Create)));
        // A spot free space offers is created, not re-shaped.
        ways.extend(
            self.reshapes_for(now.layout, now.taken, profile.shape)
                .into_iter()
                .filter(|(_, t)| !t.destroy.is_empty())
                .map(|(id, t)| (id, Way::Reshape { destroy: t.destroy })),
        );
        ways
    }

    /// Idle instances bigger than `profile`'s room with at least `want_gb`,
    /// the smallest room first, then the least memory.
    fn lendable(
        &self,
        now: GpuNow,
        profile: &ProfileSpec,
        want_gb: f64,
    ) -> impl Iterator<Item = SpotId> {
        let asked = self.spec.room_shards(profile);
        let mut lend: Vec<(u8, u32, SpotId)> = now
            .reusable
            .minus(now.taken)
            .iter()
            .filter_map(|id| {
                let p = self.spot(id).profile;
                let room = self.spec.room_shards(p);
                let bigger = room > asked && p.shape.compute >= profile.shape.compute;
                (bigger && f64::from(p.memory_gb) >= want_gb).then_some((room, p.memory_gb, id))
            })
            .collect();
        lend.sort_by_key(|&(room, mem, id)| (room, mem, self.spot(id).start, id));
        lend.into_iter().map(|(_, _, id)| id)
    }

    /// The way smartmigd takes: among [`Geometry::ways_to_serve`], the one
    /// [`Geometry::choose_spot`] picks for the `mates` placed beside the
    /// request and the offer rule `holds`. `None`: no room now.
    pub fn serve(
        &self,
        now: GpuNow,
        profile: &ProfileSpec,
        want_gb: f64,
        mates: &Mix,
        holds: Option<OfferRule>,
    ) -> Option<(SpotId, Way)> {
        // Lent shards are kept from Slurm only by the holds.
        let now = GpuNow {
            lend: now.lend && holds.is_some(),
            ..now
        };
        let ways = self.ways_to_serve(now, profile, want_gb);
        // The ways come tier by tier: the first that leaves room for the
        // mates names the tier, else the first way at all.
        let tier = ways
            .iter()
            .find(|w| self.leaves_room(now.taken, w.0, mates))
            .or(ways.first())?
            .1
            .tier();
        let pool: Vec<SpotId> = ways
            .iter()
            .filter(|w| w.1.tier() == tier)
            .map(|w| w.0)
            .collect();
        let chosen = self.choose_spot(now.taken, &pool, mates, holds)?;
        ways.into_iter()
            .find(|w| w.0 == chosen && w.1.tier() == tier)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OfferRule;
    use crate::{GpuModel, Shape};

    fn a100() -> &'static Geometry {
        Geometry::of(GpuModel::A100_40gb)
    }

    fn spot(g: &Geometry, compute: u8, memory: u8, start: u8) -> SpotId {
        g.ids()
            .find(|&id| {
                let s = g.spot(id);
                s.shape() == Shape { compute, memory } && s.start == start
            })
            .expect("a real A100 spot")
    }

    fn profile(g: &Geometry, compute: u8) -> &'static ProfileSpec {
        g.spec
            .profiles
            .iter()
            .find(|p| p.shape.compute == compute)
            .expect("profile")
    }

    #[test]
    fn an_idle_memory_variant_is_not_reused_for_a_job_billed_less() {
        let g = a100();
        let ten = g
            .spec
            .profiles
            .iter()
            .find(|p| p.name() == "1g.10gb")
            .expect("1g.10gb");
        let idle = g
            .ids()
            .find(|&id| g.spot(id).profile.name() == "1g.10gb" && g.spot(id).start == 0)
            .expect("1g.10gb@0");
        let now = GpuNow {
            layout: Layout::single(idle),
            taken: Layout::EMPTY,
            reusable: Layout::single(idle),
            may_build: true,
            lend: false,
        };
        // A shard:1 job (1g.5gb) does not take the idle 1g.10gb (two
        // shards of room); the job that asked for 1g.10gb does.
        let (_, way) = g
            .serve(now, profile(g, 1), 0.0, &Mix::default(), None)
            .unwrap();
        assert_ne!(way, Way::Reuse);
        let (id, way) = g.serve(now, ten, 0.0, &Mix::default(), None).unwrap();
        assert_eq!((id, way), (idle, Way::Reuse));
    }

    #[test]
    fn reuse_beats_create_beats_reshape_and_busy_instances_are_never_destroyed() {
        let g = a100();
        let one = profile(g, 1);
        // Idle 1g@0, busy 3g@4: the 1g is reused.
        let (i1, b3) = (spot(g, 1, 1, 0), spot(g, 3, 4, 4));
        let layout = Layout::single(i1).with(b3);
        let now = GpuNow {
            layout,
            taken: Layout::single(b3),
            reusable: layout,
            may_build: true,
            lend: false,
        };
        let (id, way) = g.serve(now, one, 0.0, &Mix::default(), None).unwrap();
        assert_eq!((id, way), (i1, Way::Reuse));
        // Not reusable (unhealthy, say): created in free space instead.
        let now = GpuNow {
            reusable: Layout::EMPTY,
            ..now
        };
        let (id, way) = g.serve(now, one, 0.0, &Mix::default(), None).unwrap();
        assert_eq!(way, Way::Create);
        assert_ne!(id, i1);
        // A 4g needs the idle 1g's memory: a reshape destroys it, not the 3g.
        let (id, way) = g
            .serve(now, profile(g, 4), 0.0, &Mix::default(), None)
            .unwrap();
        assert_eq!(g.spot(id).compute(), 4);
        assert_eq!(
            way,
            Way::Reshape {
                destroy: Layout::single(i1)
            }
        );
        // Nothing may be built: only reuse is left, and there is none.
        let frozen = GpuNow {
            may_build: false,
            ..now
        };
        assert_eq!(g.serve(frozen, one, 0.0, &Mix::default(), None), None);
        // Lending adds no way where nothing bigger is idle.
        let lending = GpuNow { lend: true, ..now };
        assert_eq!(
            g.serve(
                lending,
                profile(g, 4),
                0.0,
                &Mix::default(),
                Some(OfferRule::AnyMix)
            )
            .map(|w| w.1),
            Some(Way::Reshape {
                destroy: Layout::single(i1)
            })
        );
        // A whole GPU next to a busy 3g: no way at all.
        assert_eq!(
            g.serve(now, profile(g, 7), 0.0, &Mix::default(), None),
            None
        );
    }

    #[test]
    fn an_idle_bigger_instance_is_lent_before_anything_is_built_and_held_beyond_the_bill() {
        let g = a100();
        let two = profile(g, 2);
        let i3 = spot(g, 3, 4, 4);
        let now = GpuNow {
            layout: Layout::single(i3),
            taken: Layout::EMPTY,
            reusable: Layout::single(i3),
            may_build: true,
            lend: false,
        };
        let holds = Some(OfferRule::AnyMix);
        // Without lending a 2g is built in the free half.
        let (id, way) = g.serve(now, two, 0.0, &Mix::default(), holds).unwrap();
        assert_eq!((g.spot(id).compute(), way), (2, Way::Create));
        // Lent, the job starts at once on the idle 3g: nothing is built.
        let lending = GpuNow { lend: true, ..now };
        let (id, way) = g.serve(lending, two, 0.0, &Mix::default(), holds).unwrap();
        assert_eq!((id, way), (i3, Way::Lend));
        // Without holds nothing would keep Slurm off the unbilled slice.
        let (_, way) = g.serve(lending, two, 0.0, &Mix::default(), None).unwrap();
        assert_eq!(way, Way::Create);
        // Slurm billed 2 of the 3 slices: the holds keep the third from
        // it, beside what a 3-shard job there would strand.
        let busy = Layout::single(i3);
        let total = g.spec.compute_slices;
        assert_eq!(
            g.stranded(busy, total - 2, OfferRule::AnyMix),
            g.stranded(busy, total - 3, OfferRule::AnyMix) + 1
        );
        // An idle instance of the job's own room still comes first, and a
        // bigger one is never lent when the memory asked for exceeds it.
        let i2 = spot(g, 2, 2, 0);
        let both = Layout::single(i3).with(i2);
        let lending = GpuNow {
            layout: both,
            reusable: both,
            ..lending
        };
        let (id, way) = g.serve(lending, two, 0.0, &Mix::default(), holds).unwrap();
        assert_eq!((id, way), (i2, Way::Reuse));
        let one = profile(g, 1);
        let (id, way) = g.serve(lending, one, 0.0, &Mix::default(), holds).unwrap();
        assert_eq!(
            (id, way),
            (i2, Way::Lend),
            "the smallest bigger room is lent"
        );
        let (id, way) = g.serve(lending, one, 12.0, &Mix::default(), holds).unwrap();
        assert_eq!((id, way), (i3, Way::Lend), "only the 3g has 12 GB");
    }
}
