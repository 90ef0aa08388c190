//! How one request is served on one GPU, on demand: the rule smartmigd's
//! allocate runs and both simulators model, written once (issue 54).
//!
//! In smartmigd's order of preference (brief §2): reuse an idle instance of
//! the request's compute size with the least memory that suffices, else
//! create the profile in free space (the spot that leaves the most
//! [`Headroom`](crate::Headroom) first), else re-shape idle instances for it
//! ([`Geometry::reshapes_for`], fewest destroyed first); never a busy one.
//! Among these ways, [`Geometry::choose_spot`] picks the first that leaves
//! room for the jobs placed beside the request and, with holds, keeps
//! Slurm's offer largest. Pure: the daemon maps the chosen [`Way`] onto its
//! instances' uuids, the simulators onto their GPU state.

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
}

/// One way to serve a request at a spot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// Hand out the idle instance at the spot.
    Reuse,
    /// Create the instance at the spot in free space.
    Create,
    /// Destroy these idle instances, then create at the spot.
    Reshape { destroy: Layout },
}

impl Way {
    /// Instances this way destroys.
    pub fn destroyed(self) -> Layout {
        match self {
            Way::Reshape { destroy } => destroy,
            Way::Reuse | Way::Create => Layout::EMPTY,
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
        let ways = self.ways_to_serve(now, profile, want_gb);
        let spots: Vec<SpotId> = ways.iter().map(|w| w.0).collect();
        let chosen = self.choose_spot(now.taken, &spots, mates, holds)?;
        ways.into_iter().find(|w| w.0 == chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        // A whole GPU next to a busy 3g: no way at all.
        assert_eq!(
            g.serve(now, profile(g, 7), 0.0, &Mix::default(), None),
            None
        );
    }
}
