//! Property tests of the MIG geometry against an independent re-statement of
//! the two hardware rules (no shared memory slot, compute budget).

use proptest::prelude::*;
use smartmig::mig::{select_profile, Geometry, GpuModel, Layout};

fn model() -> impl Strategy<Value = GpuModel> {
    prop::sample::select(GpuModel::ALL.to_vec())
}

/// The rules written out again, slot by slot, without the geometry's masks.
fn obeys_hardware_rules(g: &Geometry, layout: Layout) -> bool {
    let mut slots = vec![0u8; g.spec.memory_slices as usize];
    let mut compute = 0u32;
    for id in layout.iter() {
        let p = g.placement(id);
        if !p.profile.starts.contains(&p.start) {
            return false;
        }
        compute += u32::from(p.shape().compute);
        for s in p.start..p.start + p.shape().memory {
            match slots.get_mut(s as usize) {
                Some(slot) => *slot += 1,
                None => return false,
            }
        }
    }
    slots.iter().all(|&n| n <= 1) && compute <= u32::from(g.spec.compute_slices)
}

#[test]
fn every_enumerated_layout_obeys_the_rules_and_no_other_does() {
    for m in GpuModel::ALL {
        let g = Geometry::of(m);
        for &l in g.layouts() {
            assert!(obeys_hardware_rules(g, l), "{m}: {}", g.picture(l));
        }
        // Completeness: every subset of placements obeying the rules is listed
        // (checked exhaustively on the A30, whose 7 placements give 128 subsets).
        if m == GpuModel::A30_24gb {
            let n = g.ids().count();
            let listed = (0u32..1 << n)
                .filter(|&bits| obeys_hardware_rules(g, Layout(bits)))
                .count();
            assert_eq!(listed, g.layouts().len());
        }
    }
}

#[test]
fn nothing_can_be_added_to_a_maximal_layout() {
    for m in GpuModel::ALL {
        let g = Geometry::of(m);
        for &l in g.maximal() {
            assert!(g.is_valid(l));
            for id in g.ids().filter(|&id| !l.contains(id)) {
                assert!(
                    !obeys_hardware_rules(g, l.with(id)),
                    "{m}: {} + {id:?}",
                    g.picture(l)
                );
            }
        }
        // Catalog layouts are maximal among the catalog's own profiles (one
        // per compute size, the one with the fewest memory slots).
        let is_catalog_shape = |id| {
            let shape = g.placement(id).shape();
            g.spec
                .profiles
                .iter()
                .filter(|p| p.shape.compute == shape.compute)
                .all(|p| p.shape.memory >= shape.memory)
        };
        for &l in g.catalog() {
            assert!(g.is_valid(l));
            assert!(l.iter().all(is_catalog_shape));
            for id in g
                .ids()
                .filter(|&id| !l.contains(id) && is_catalog_shape(id))
            {
                assert!(
                    !obeys_hardware_rules(g, l.with(id)),
                    "{m}: {} + {id:?}",
                    g.picture(l)
                );
            }
        }
    }
}

proptest! {
    #[test]
    fn random_layouts_are_valid_iff_rules_hold(m in model(), bits in any::<u32>()) {
        let g = Geometry::of(m);
        let n = g.ids().count() as u32;
        let l = Layout(bits & ((1u64 << n) - 1) as u32);
        prop_assert_eq!(g.is_valid(l), obeys_hardware_rules(g, l));
    }

    #[test]
    fn transitions_to_reachable_layouts_never_touch_busy_instances(
        m in model(), pick in any::<prop::sample::Index>(), seed in any::<u64>()
    ) {
        let g = Geometry::of(m);
        let current = g.layouts()[pick.index(g.layouts().len())];
        let busy = Layout(current.0 & (seed as u32));
        for target in g.reachable(busy, g.layouts()) {
            let t = g.transition(current, target);
            prop_assert!(!t.touches(busy));
            // Destroy first, then create: every intermediate state is valid.
            let mut state = current.minus(t.destroy);
            prop_assert!(g.is_valid(state));
            for id in t.create.iter() {
                prop_assert!(g.fits(state, id));
                state = state.with(id);
            }
            prop_assert_eq!(state, target);
        }
        // And reachable() misses nothing: any valid superset of busy is listed.
        let listed = g.reachable(busy, g.layouts()).count();
        let supersets = g.layouts().iter().filter(|l| l.contains_all(busy)).count();
        prop_assert_eq!(listed, supersets);
    }

    #[test]
    fn best_placement_fits_and_leaves_most_room(m in model(), pick in any::<prop::sample::Index>(), shape_pick in any::<prop::sample::Index>()) {
        let g = Geometry::of(m);
        let current = g.layouts()[pick.index(g.layouts().len())];
        let shape = g.spec.profiles[shape_pick.index(g.spec.profiles.len())].shape;
        match g.best_placement(current, shape) {
            Some(id) => {
                prop_assert!(g.fits(current, id));
                prop_assert_eq!(g.placement(id).shape(), shape);
                let best = g.headroom(current.with(id));
                for other in g.candidates(current, shape) {
                    prop_assert!(g.headroom(current.with(other)) <= best);
                }
            }
            None => prop_assert_eq!(g.candidates(current, shape).count(), 0),
        }
    }

    #[test]
    fn reshape_keeps_busy_instances(m in model(), pick in any::<prop::sample::Index>(), mask in any::<u32>(), shape_pick in any::<prop::sample::Index>()) {
        let g = Geometry::of(m);
        let current = g.layouts()[pick.index(g.layouts().len())];
        let busy = Layout(current.0 & mask);
        let shape = g.spec.profiles[shape_pick.index(g.spec.profiles.len())].shape;
        match g.reshape_for(current, busy, shape) {
            Some((id, t)) => {
                prop_assert!(!t.touches(busy));
                let target = current.minus(t.destroy).union(t.create);
                prop_assert!(g.is_valid(target));
                prop_assert!(target.contains(id));
                prop_assert!(target.contains_all(busy));
            }
            // Only impossible when the busy instances alone leave no spot.
            None => prop_assert_eq!(g.candidates(busy, shape).count(), 0),
        }
    }

    #[test]
    fn selected_profile_is_the_smallest_that_fits(m in model(), k in 1u8..=7, mem in prop::option::of(0.0f64..150.0)) {
        let spec = m.spec();
        match select_profile(spec, k, mem) {
            Ok(p) => {
                prop_assert!(p.shape.compute >= k);
                prop_assert!(f64::from(p.memory_gb) >= mem.unwrap_or(0.0));
                for q in spec.profiles {
                    let fits = q.shape.compute >= k && f64::from(q.memory_gb) >= mem.unwrap_or(0.0);
                    if fits {
                        prop_assert!((p.shape.compute, p.shape.memory) <= (q.shape.compute, q.shape.memory));
                    }
                }
            }
            Err(_) => {
                let any_fits = spec.profiles.iter().any(|q| q.shape.compute >= k && f64::from(q.memory_gb) >= mem.unwrap_or(0.0));
                prop_assert!(!any_fits);
            }
        }
    }
}
