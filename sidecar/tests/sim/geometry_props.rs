//! Property tests of the MIG geometry against an independent re-statement of
//! the two hardware rules (no shared memory slot, compute budget).

use proptest::prelude::*;
use smartmig::mig::{select_profile, Geometry, GpuModel, Layout, Shape};

fn model() -> impl Strategy<Value = GpuModel> {
    prop::sample::select(GpuModel::ALL.to_vec())
}

/// The rules written out again, slot by slot, without the geometry's masks.
fn obeys_hardware_rules(g: &Geometry, layout: Layout) -> bool {
    let mut slots = vec![0u8; g.spec.memory_slices as usize];
    let mut compute = 0u32;
    for id in layout.iter() {
        let p = g.spot(id);
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

/// NVIDIA's placement tables (MIG User Guide, "A100 MIG profiles" and
/// "A30"), typed in again: (compute slices, memory slots, allowed starts).
const EIGHT_SLICE: &[(u8, u8, &[u8])] = &[
    (1, 1, &[0, 1, 2, 3, 4, 5, 6]),
    (1, 2, &[0, 2, 4, 6]),
    (2, 2, &[0, 2, 4]),
    (3, 4, &[0, 4]),
    (4, 4, &[0]),
    (7, 8, &[0]),
];
const A30: &[(u8, u8, &[u8])] = &[(1, 1, &[0, 1, 2, 3]), (2, 2, &[0, 2]), (4, 4, &[0])];
/// RTX PRO 5000 Blackwell: two slices (MIG User Guide, R610 edition; the
/// starts are inferred, docs/mig-geometry.md).
const TWO_SLICE: &[(u8, u8, &[u8])] = &[(1, 1, &[0, 1]), (2, 2, &[0])];

/// Exhaustive, both ways, on every model: each of the 2^n subsets of the
/// placements in the tables above (2^18 on the eight-slice models) is
/// valid for the crate exactly when it keeps the two rules (no memory slot
/// used twice, compute within the budget), written here with plain counts.
/// The valid, maximal and catalog counts come out of the same loop.
#[test]
fn every_placement_subset_is_valid_iff_the_restated_rules_hold() {
    for m in GpuModel::ALL {
        let g = Geometry::of(m);
        // The four-slice table is the A30's and the RTX PRO 6000's.
        let (table, slots, budget) = match (g.spec.memory_slices, g.spec.compute_slices) {
            (4, 4) => (A30, 4usize, 4u32),
            (2, 2) => (TWO_SLICE, 2, 2),
            (8, 7) => (EIGHT_SLICE, 8, 7),
            other => panic!("{m}: no restated table for (memory, compute) slices {other:?}"),
        };
        let places: Vec<(u8, u8, u8)> = table
            .iter()
            .flat_map(|&(c, mem, starts)| starts.iter().map(move |&s| (c, mem, s)))
            .collect();
        assert_eq!(places.len(), g.ids().count(), "{m}: placement count");
        let ids: Vec<_> = places
            .iter()
            .map(|&(c, mem, s)| {
                g.spot_id(Shape::new(c, mem), s)
                    .unwrap_or_else(|| panic!("{m}: no placement {c}g/{mem} at {s}"))
            })
            .collect();
        let keeps_rules = |bits: u32| {
            let mut used = vec![0u32; slots];
            let mut compute = 0u32;
            for (k, &(c, mem, s)) in places.iter().enumerate() {
                if bits & (1 << k) != 0 {
                    compute += u32::from(c);
                    for slot in s..s + mem {
                        used[usize::from(slot)] += 1;
                    }
                }
            }
            used.iter().all(|&n| n <= 1) && compute <= budget
        };
        let n = places.len();
        let all = (1u32 << n) - 1;
        // The catalog leaves out the two-slot 1g profile.
        let catalog_mask: u32 = (0..n)
            .filter(|&k| places[k].0 != 1 || places[k].1 == 1)
            .fold(0, |acc, k| acc | 1 << k);
        let maximal_within = |bits: u32, mask: u32| {
            (0..n).all(|k| {
                bits & (1 << k) != 0 || mask & (1 << k) == 0 || !keeps_rules(bits | 1 << k)
            })
        };
        let (mut valid, mut maximal, mut catalog) = (0, 0, 0);
        for bits in 0..=all {
            let ok = keeps_rules(bits);
            let layout = ids
                .iter()
                .enumerate()
                .filter(|&(k, _)| bits & (1 << k) != 0)
                .fold(Layout::EMPTY, |l, (_, &id)| l.with(id));
            assert_eq!(g.is_valid(layout), ok, "{m}: {}", g.picture(layout));
            if ok {
                valid += 1;
                maximal += usize::from(maximal_within(bits, all));
                if bits & !catalog_mask == 0 {
                    catalog += usize::from(maximal_within(bits, catalog_mask));
                }
            }
        }
        assert_eq!(valid, g.layouts().len(), "{m}: valid layouts");
        assert_eq!(maximal, g.maximal().len(), "{m}: maximal layouts");
        assert_eq!(catalog, g.catalog().len(), "{m}: catalog layouts");
        // The regression counts of geometry.rs's own test, derived here.
        let want = match g.spec.compute_slices {
            4 => (26, 5, 5),
            // {}, 1g@0, 1g@1, 1g@0+1g@1, 2g@0; maximal and catalog: 1|1, 22.
            2 => (5, 2, 2),
            _ => (723, 78, 19),
        };
        assert_eq!((valid, maximal, catalog), want, "{m}");
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
            let shape = g.spot(id).shape();
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
        match g.best_spot(current, shape) {
            Some(id) => {
                prop_assert!(g.fits(current, id));
                prop_assert_eq!(g.spot(id).shape(), shape);
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

/// The H200 table against what a real driver said: `nvidia-smi mig -lgip`
/// and `-lgipp` on an H200 with driver 580.159.04 (MIG mode off: the driver
/// still lists profiles and placements), recorded 2026-11-27 in
/// `tests/data/nvidia-smi_h200_driver580_mig_off.txt`. Every profile of the
/// table must appear with the table's id and exactly the table's
/// placements; the driver's only extra profile must be a `+me` variant,
/// which the table leaves out on purpose (docs/mig-geometry.md).
#[test]
fn h200_table_matches_the_recorded_driver() {
    let text = include_str!("../data/nvidia-smi_h200_driver580_mig_off.txt");
    // "GPU  0 Profile ID 15 Placements: {0,2,4,6}:2"
    let mut driver: std::collections::BTreeMap<u32, Vec<(u8, u8)>> = Default::default();
    for line in text.lines().filter(|l| l.contains("Profile ID")) {
        let rest = line.split("Profile ID").nth(1).expect("Profile ID line");
        let (id, places) = rest.split_once("Placement").expect("placements");
        let id: u32 = id.trim().parse().expect("profile id");
        let places = places.split_once(':').expect("colon").1.trim();
        let (starts, size) = places.rsplit_once(':').expect("size");
        let size: u8 = size.parse().expect("size number");
        let starts = starts.trim_matches(|c| c == '{' || c == '}');
        driver.insert(
            id,
            starts
                .split(',')
                .map(|s| (s.parse().expect("start"), size))
                .collect(),
        );
    }
    // "|   0  MIG 1g.18gb         19     7/7        16.00  ..."
    let mut names: std::collections::BTreeMap<u32, String> = Default::default();
    for line in text.lines().filter(|l| l.contains(" MIG ")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "MIG").expect("MIG");
        names.insert(words[at + 2].parse().expect("id"), words[at + 1].into());
    }
    assert_eq!(driver.len(), 7, "{driver:?}");
    assert_eq!(names.len(), 7, "{names:?}");

    let g = Geometry::of(GpuModel::H200_141gb);
    for spec in GpuModel::H200_141gb.spec().profiles {
        let want: Vec<(u8, u8)> = g
            .ids()
            .map(|id| g.spot(id))
            .filter(|p| p.shape() == spec.shape)
            .map(|p| (p.start, p.shape().memory))
            .collect();
        assert_eq!(
            driver.remove(&spec.smi_id).as_deref(),
            Some(&want[..]),
            "{}",
            spec.name()
        );
        assert_eq!(
            names.get(&spec.smi_id).map(String::as_str),
            Some(spec.name().as_str())
        );
    }
    let extra: Vec<&String> = driver.keys().map(|id| &names[id]).collect();
    assert_eq!(extra, ["1g.18gb+me"], "driver profiles not in the table");
}

/// The same H200 through NVML's versioned profile call at every profile
/// index (`data/nvml-profiles_h200_driver580_mig_off.txt`): the matcher the
/// NVML backend runs at start agrees with the table, names come without
/// `MIG `, and the one variant is the `+me` at index 7.
#[test]
fn h200_nvml_record_matches_the_table_by_id_and_slices() {
    use smartmig::mig::driver::driver_name;
    use smartmig::mig::{match_driver, DriverProfile};
    let text = include_str!("../data/nvml-profiles_h200_driver580_mig_off.txt");
    let num = |line: &str, key: &str| -> u64 {
        let rest = line.split(&format!(" {key} ")).nth(1).expect(key);
        rest.split_whitespace().next().unwrap().parse().expect(key)
    };
    let mut driver = Vec::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with(" idx ") && !l.contains(" rc "))
    {
        let name = line
            .split("name b'")
            .nth(1)
            .unwrap()
            .split('\'')
            .next()
            .unwrap();
        let pl = line.split(" pl [").nth(1).unwrap().trim_end_matches(']');
        let placements = pl
            .split("), (")
            .map(|p| {
                let (s, n) = p
                    .trim_matches(|c| c == '(' || c == ')')
                    .split_once(", ")
                    .unwrap();
                (s.parse().unwrap(), n.parse().unwrap())
            })
            .collect();
        driver.push(DriverProfile {
            index: num(line, "idx") as u32,
            id: num(line, "id") as u32,
            slices: num(line, "slices") as u32,
            memory_mib: num(line, "MiB"),
            instance_count: num(line, "inst") as u32,
            name: Some(driver_name(name)),
            placements: Ok(placements),
        });
    }
    assert_eq!(driver.len(), 7);
    let m = match_driver(GpuModel::H200_141gb, &driver);
    assert!(m.agrees(), "{}", m.differences_text());
    assert!(m.notes.is_empty(), "{:?}", m.notes);
    assert!(m.profiles.iter().all(|p| !p.renamed()));
    assert_eq!(m.variants.len(), 1);
    assert_eq!(m.variants[0].driver.label(), "1g.18gb+me");
    assert_eq!(m.variants[0].driver.index, 7);
}
