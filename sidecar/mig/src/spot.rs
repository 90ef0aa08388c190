//! Spot queries shared by the daemon and the simulator: where a profile
//! can go, which spot fragments the GPU least, which layouts are reachable
//! without touching busy instances, and how to get from one layout to another.

use super::geometry::Geometry;
use super::layout::{Layout, SpotId};
use super::models::Shape;

/// The changes that take one layout to another: destroy first, then create.
///
/// Applying `destroy` before `create` is always possible: what remains after
/// the destroys is a subset of the target, and every subset of a valid layout
/// is valid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transition {
    pub destroy: Layout,
    pub create: Layout,
}

impl Transition {
    pub fn is_noop(&self) -> bool {
        self.destroy.is_empty() && self.create.is_empty()
    }

    /// Whether the transition would destroy one of the `busy` instances.
    pub fn touches(&self, busy: Layout) -> bool {
        !self.destroy.intersection(busy).is_empty()
    }

    /// Memory slots whose instances change (they run nothing while the
    /// reconfiguration is in progress).
    pub fn affected_memory(&self, geometry: &Geometry) -> u16 {
        geometry.memory_mask(self.destroy) | geometry.memory_mask(self.create)
    }
}

impl Geometry {
    /// Spots of `shape` that fit next to every instance of `layout`.
    ///
    /// Pass the current layout to ask "where can it go in free space", or
    /// only the busy instances to ask "where could it go if the idle ones
    /// were re-shaped".
    pub fn candidates(&self, layout: Layout, shape: Shape) -> impl Iterator<Item = SpotId> + '_ {
        self.ids()
            .filter(move |&id| self.spot(id).shape() == shape && self.fits(layout, id))
    }

    /// The fragmentation-aware choice among [`Geometry::candidates`].
    ///
    /// It picks the spot that leaves the most [`Headroom`](super::geometry::Headroom):
    /// first the ability to add the largest profiles, then the number of
    /// valid layouts still reachable by only adding instances. On an empty
    /// A100 a 1g instance goes to slot 6 (the one slot no 2g can use), which
    /// keeps the 4g and a 3g at slot 0 and all three 2g spots possible; at
    /// slot 0 it would rule out every 3g, 4g and 7g on the left half. Ties go
    /// to the lowest spot id, so the choice is deterministic.
    pub fn best_spot(&self, layout: Layout, shape: Shape) -> Option<SpotId> {
        self.candidates(layout, shape)
            .max_by_key(|&id| (self.headroom(layout.with(id)), std::cmp::Reverse(id)))
    }

    /// Layouts among `targets` reachable from any layout whose busy instances
    /// are `busy`: exactly those that keep every busy instance where it is.
    pub fn reachable<'a>(
        &'a self,
        busy: Layout,
        targets: &'a [Layout],
    ) -> impl Iterator<Item = Layout> + 'a {
        targets
            .iter()
            .copied()
            .filter(move |t| t.contains_all(busy))
    }

    /// The destroy/create steps from `from` to `to`.
    pub fn transition(&self, from: Layout, to: Layout) -> Transition {
        Transition {
            destroy: from.minus(to),
            create: to.minus(from),
        }
    }

    /// Makes room for `shape` by destroying idle instances of `current`
    /// (never one in `busy`), destroying as few as possible and, among equal
    /// choices, leaving the most room. Returns the new spot and the
    /// transition (which includes creating it), or `None` when even
    /// destroying every idle instance would not make room.
    pub fn reshape_for(
        &self,
        current: Layout,
        busy: Layout,
        shape: Shape,
    ) -> Option<(SpotId, Transition)> {
        self.reshapes_for(current, busy, shape).into_iter().next()
    }

    /// Every spot [`Geometry::reshape_for`] could make room at, each with
    /// its transition, best first (fewest destroyed, then most room, then
    /// the lowest spot id): the choices an allocate weighs when the best
    /// one alone would rule out jobs placed beside it.
    pub fn reshapes_for(
        &self,
        current: Layout,
        busy: Layout,
        shape: Shape,
    ) -> Vec<(SpotId, Transition)> {
        debug_assert!(current.contains_all(busy));
        let budget = self.spec.compute_slices;
        self.candidates(busy, shape)
            .map(|id| {
                let p = self.spot(id);
                let idle = current.minus(busy);
                // Idle instances in the way in memory must go.
                let mut kept = current.minus(Layout(
                    idle.iter()
                        .filter(|&o| self.spot(o).memory_mask & p.memory_mask != 0)
                        .fold(0, |m, o| m | (1 << o.0)),
                ));
                // Then the smallest idle ones, until the compute budget fits.
                let mut rest: Vec<SpotId> = kept.minus(busy).iter().collect();
                rest.sort_by_key(|&o| (self.spot(o).compute(), std::cmp::Reverse(o)));
                let mut rest = rest.into_iter();
                while self.compute_used(kept) + p.compute() > budget {
                    match rest.next() {
                        Some(o) => kept = kept.without(o),
                        None => break,
                    }
                }
                let target = kept.with(id);
                (id, self.transition(current, target))
            })
            .filter(|(_, t)| self.is_valid(current.minus(t.destroy).union(t.create)))
            .map(|(id, t)| {
                let target = current.minus(t.destroy).union(t.create);
                let key = (
                    t.destroy.len(),
                    std::cmp::Reverse(self.headroom(target)),
                    id,
                );
                (key, (id, t))
            })
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_values()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GpuModel;

    fn a100() -> &'static Geometry {
        Geometry::of(GpuModel::A100_40gb)
    }

    #[test]
    fn one_g_goes_where_it_fragments_least() {
        let g = a100();
        let id = g.best_spot(Layout::EMPTY, Shape::new(1, 1)).unwrap();
        assert_eq!(g.spot(id).start, 6);
        // With 4g@0 in place, a 2g goes to slot 4 and leaves 1g@6 possible.
        let four = g.layout_from(&[(Shape::new(4, 4), 0)]).unwrap();
        let id = g.best_spot(four, Shape::new(2, 2)).unwrap();
        assert_eq!(g.spot(id).start, 4);
    }

    #[test]
    fn no_candidate_when_full() {
        let g = a100();
        assert!(g.best_spot(g.whole_gpu(), Shape::new(1, 1)).is_none());
    }

    #[test]
    fn transition_destroys_then_creates() {
        let g = a100();
        let a = g
            .layout_from(&[(Shape::new(4, 4), 0), (Shape::new(3, 4), 4)])
            .unwrap();
        let b = g
            .layout_from(&[
                (Shape::new(4, 4), 0),
                (Shape::new(2, 2), 4),
                (Shape::new(1, 1), 6),
            ])
            .unwrap();
        let t = g.transition(a, b);
        assert_eq!(g.name(t.destroy), "3g.20gb");
        assert_eq!(g.name(t.create), "2g.10gb+1g.5gb");
        assert!(!t.touches(g.layout_from(&[(Shape::new(4, 4), 0)]).unwrap()));
        assert_eq!(t.affected_memory(g), 0b1111_0000);
    }

    #[test]
    fn reshape_destroys_fewest_idle_instances() {
        let g = a100();
        // 1g x7, the one at slot 0 busy: a 3g fits at slot 4 by destroying 3 idle 1g.
        let ones: Vec<_> = (0..7).map(|s| (Shape::new(1, 1), s)).collect();
        let current = g.layout_from(&ones).unwrap();
        let busy = g.layout_from(&[(Shape::new(1, 1), 0)]).unwrap();
        let (id, t) = g.reshape_for(current, busy, Shape::new(3, 4)).unwrap();
        assert_eq!(g.spot(id).start, 4);
        assert_eq!(t.destroy.len(), 3);
        assert!(!t.touches(busy));
        // Everything busy: nothing can be made.
        assert!(g.reshape_for(current, current, Shape::new(3, 4)).is_none());
    }
}
