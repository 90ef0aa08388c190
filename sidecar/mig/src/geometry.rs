//! The placement rules of one GPU model, precomputed once.
//!
//! A [`Geometry`] lists every spot (profile × allowed start; NVIDIA: placement) of a model
//! and, from the two hardware rules,
//!
//! 1. instances may not share a memory slot,
//! 2. their compute slices add up to at most the GPU's (7, or 4 on the A30),
//!
//! enumerates every valid layout (298 on the A100-40GB without the 2-slot 1g
//! profile, 723 with it). Everything else (maximal layouts, the catalog,
//! fragmentation scores) derives from that list, so the simulator, the
//! trainer and the daemon cannot disagree about what the hardware accepts.

use std::sync::OnceLock;

use super::layout::{InstanceDesc, Layout, Spot, SpotId};
use super::models::{GpuModel, ModelSpec, Shape};

/// Why a set of instances is not a layout the hardware accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("{model} has no MIG profile with {compute} compute and {memory} memory slices")]
    UnknownProfile {
        model: &'static str,
        compute: u8,
        memory: u8,
    },
    #[error("{profile} cannot start at memory slot {start} on {model} (allowed: {allowed:?})")]
    StartNotAllowed {
        model: &'static str,
        profile: String,
        start: u8,
        allowed: &'static [u8],
    },
    #[error("{a} and {b} overlap in memory slots")]
    Overlap { a: InstanceDesc, b: InstanceDesc },
    #[error("the instances need {used} compute slices but {model} has {budget}")]
    ComputeBudget {
        model: &'static str,
        used: u8,
        budget: u8,
    },
    #[error("the same instance {0} is listed twice")]
    Duplicate(InstanceDesc),
}

/// Room a layout leaves for future requests, compared lexicographically:
/// first how many more instances of each profile could still be added, the
/// largest profile first (a spot that keeps a 4g or 3g possible beats one
/// that keeps three more 1g possible, because big requests are the ones that
/// fragmentation starves), then the number of valid layouts that still
/// contain it (how many ways the GPU can still be filled).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Headroom {
    /// Addable instance counts, 4 bits per profile, largest profile in the high bits.
    pub per_profile: u32,
    /// Valid layouts that are supersets of this one (itself included).
    pub supersets: u32,
}

/// Placement rules and precomputed layout sets of one GPU model.
#[derive(Debug)]
pub struct Geometry {
    pub spec: &'static ModelSpec,
    spots: Vec<Spot>,
    /// Every valid layout, ascending.
    valid: Vec<Layout>,
    /// Fragmentation score of each layout of `valid` (same index), see
    /// [`Geometry::headroom`]. Looked up by binary search in `valid`: the
    /// simulator asks at every decision for every GPU, and a hash map's
    /// SipHash cost more than the search (15 % of a learned-policy run).
    room: Vec<Headroom>,
    maximal: Vec<Layout>,
    catalog: Vec<Layout>,
}

impl Geometry {
    /// The geometry of `model`, built on first use and shared afterwards.
    pub fn of(model: GpuModel) -> &'static Geometry {
        static CACHE: [OnceLock<Geometry>; GpuModel::ALL.len()] =
            [const { OnceLock::new() }; GpuModel::ALL.len()];
        CACHE[model as usize].get_or_init(|| Geometry::build(model.spec()))
    }

    fn build(spec: &'static ModelSpec) -> Geometry {
        let mut spots: Vec<Spot> = spec
            .profiles
            .iter()
            .flat_map(|profile| {
                profile.starts.iter().map(move |&start| Spot {
                    profile,
                    start,
                    memory_mask: ((1u16 << profile.shape.memory) - 1) << start,
                })
            })
            .collect();
        spots.sort_by_key(|p| (p.start, p.profile.shape));
        assert!(spots.len() <= 32, "layout bit set holds 32 spots");

        let mut geometry = Geometry {
            spec,
            spots,
            valid: Vec::new(),
            room: Vec::new(),
            maximal: Vec::new(),
            catalog: Vec::new(),
        };
        let all_ids: Vec<SpotId> = geometry.ids().collect();
        geometry.valid = geometry.enumerate(&all_ids);
        geometry.valid.sort_unstable();
        geometry.room = geometry
            .valid
            .iter()
            .map(|&l| geometry.compute_headroom(l))
            .collect();
        geometry.maximal = geometry.maximal_among(&geometry.valid, &all_ids);

        // The catalog uses one profile per compute size: the one with the
        // fewest memory slices (drops 1g.10gb on the A100-40GB). The wider
        // variants only matter for memory-hungry 1g jobs, which the daemon
        // serves on demand; leaving them out keeps the RL action space small
        // (19 layouts on the eight-slice models, NVIDIA's classic table).
        let catalog_ids: Vec<SpotId> = geometry
            .ids()
            .filter(|&id| {
                let shape = geometry.spot(id).shape();
                spec.profiles
                    .iter()
                    .filter(|p| p.shape.compute == shape.compute)
                    .all(|p| p.shape.memory >= shape.memory)
            })
            .collect();
        let catalog_valid = geometry.enumerate(&catalog_ids);
        let mut catalog = geometry.maximal_among(&catalog_valid, &catalog_ids);
        catalog.sort_by_key(|&l| geometry.catalog_order(l));
        geometry.catalog = catalog;
        geometry
    }

    /// Sort key for the catalog: fewest instances first (7g leads), then by
    /// the sizes of the instances from the largest down, then by placement.
    fn catalog_order(&self, layout: Layout) -> (usize, Vec<std::cmp::Reverse<u8>>, Layout) {
        let mut sizes: Vec<_> = layout
            .iter()
            .map(|id| std::cmp::Reverse(self.spot(id).compute()))
            .collect();
        sizes.sort();
        (layout.len(), sizes, layout)
    }

    /// All valid layouts built from `ids` (backtracking over the rules).
    fn enumerate(&self, ids: &[SpotId]) -> Vec<Layout> {
        fn go(
            g: &Geometry,
            ids: &[SpotId],
            next: usize,
            layout: Layout,
            memory: u16,
            compute: u8,
            out: &mut Vec<Layout>,
        ) {
            out.push(layout);
            for (i, &id) in ids.iter().enumerate().skip(next) {
                let p = g.spot(id);
                if memory & p.memory_mask == 0 && compute + p.compute() <= g.spec.compute_slices {
                    go(
                        g,
                        ids,
                        i + 1,
                        layout.with(id),
                        memory | p.memory_mask,
                        compute + p.compute(),
                        out,
                    );
                }
            }
        }
        let mut out = Vec::new();
        go(self, ids, 0, Layout::EMPTY, 0, 0, &mut out);
        out
    }

    /// The layouts in `set` to which no spot of `ids` can be added.
    fn maximal_among(&self, set: &[Layout], ids: &[SpotId]) -> Vec<Layout> {
        set.iter()
            .copied()
            .filter(|&l| !ids.iter().any(|&id| !l.contains(id) && self.fits(l, id)))
            .collect()
    }

    pub fn model(&self) -> GpuModel {
        self.spec.model
    }

    /// All spot ids of the model.
    pub fn ids(&self) -> impl Iterator<Item = SpotId> + '_ {
        (0..self.spots.len() as u8).map(SpotId)
    }

    pub fn spot(&self, id: SpotId) -> &Spot {
        &self.spots[id.0 as usize]
    }

    /// The spot of `shape` at `start`, if the hardware allows it.
    pub fn spot_id(&self, shape: Shape, start: u8) -> Option<SpotId> {
        self.ids().find(|&id| {
            let p = self.spot(id);
            p.shape() == shape && p.start == start
        })
    }

    /// The GPU-instance id the driver gives spot `id`: the memory
    /// slots numbered as a binary tree (8 slots: size 8 -> 0, size 4 -> 1 +
    /// start/4, size 2 -> 3 + start/2, size 1 -> 7 + start; the A30's 4
    /// slots alike), as on A100 and H100. The real driver's id is read from
    /// NVML; this is the one the simulator and the NVML emulator give.
    pub fn gpu_instance_id(&self, id: SpotId) -> u32 {
        let p = self.spot(id);
        slot_tree_id(
            u32::from(self.spec.memory_slices),
            u32::from(p.start),
            u32::from(p.profile.shape.memory),
        )
    }

    /// The fragmentation of `layout` for a request of `shape`: its free
    /// compute slices (held by no instance) when none of `shape`'s
    /// spots fits in the free space, so that those slices cannot
    /// serve the request without a re-shape; 0 when one fits.
    pub fn stranded_compute(&self, layout: Layout, shape: Shape) -> u8 {
        let fits = self
            .ids()
            .any(|id| self.spot(id).shape() == shape && self.fits(layout, id));
        if fits {
            0
        } else {
            self.spec
                .compute_slices
                .saturating_sub(self.compute_used(layout))
        }
    }

    /// Memory slots used by `layout`.
    pub fn memory_mask(&self, layout: Layout) -> u16 {
        layout.iter().fold(0, |m, id| m | self.spot(id).memory_mask)
    }

    /// Compute slices used by `layout`.
    pub fn compute_used(&self, layout: Layout) -> u8 {
        layout.iter().map(|id| self.spot(id).compute()).sum()
    }

    /// Whether the hardware accepts `layout`.
    pub fn is_valid(&self, layout: Layout) -> bool {
        self.valid.binary_search(&layout).is_ok()
    }

    /// Whether spot `id` can be added to `layout` (free memory slots and
    /// enough compute slices left).
    pub fn fits(&self, layout: Layout, id: SpotId) -> bool {
        let p = self.spot(id);
        !layout.contains(id)
            && self.memory_mask(layout) & p.memory_mask == 0
            && self.compute_used(layout) + p.compute() <= self.spec.compute_slices
    }

    /// Every valid layout, ascending by bit set.
    pub fn layouts(&self) -> &[Layout] {
        &self.valid
    }

    /// Valid layouts to which no instance of any profile can be added.
    pub fn maximal(&self) -> &[Layout] {
        &self.maximal
    }

    /// The curated action space of the repartitioning policies: the maximal
    /// layouts over one profile per compute size (the smallest-memory one),
    /// ordered with the whole-GPU layout first.
    pub fn catalog(&self) -> &[Layout] {
        &self.catalog
    }

    /// Index of `layout` in the catalog.
    pub fn catalog_index(&self, layout: Layout) -> Option<usize> {
        self.catalog.iter().position(|&l| l == layout)
    }

    /// The layout with the whole-GPU instance only (MIG "off" in effect).
    pub fn whole_gpu(&self) -> Layout {
        let full = self.spec.full_profile().shape;
        self.spot_id(full, 0)
            .map(Layout::single)
            .expect("every model has a whole-GPU spot at slot 0")
    }

    /// How much room `layout` leaves for future requests (the fragmentation
    /// score behind [`Geometry::best_spot`](super::Geometry::best_spot)).
    /// The lowest score for invalid layouts.
    pub fn headroom(&self, layout: Layout) -> Headroom {
        self.valid
            .binary_search(&layout)
            .map_or_else(|_| Headroom::default(), |i| self.room[i])
    }

    fn compute_headroom(&self, layout: Layout) -> Headroom {
        let used_memory = self.memory_mask(layout);
        let free_compute = self.spec.compute_slices - self.compute_used(layout);
        let mut profiles: Vec<_> = self.spec.profiles.iter().collect();
        profiles.sort_by_key(|p| std::cmp::Reverse(p.shape));
        // Spots of one profile never overlap each other, so the number
        // of extra instances of it is bounded by free spots and free compute.
        let per_profile = profiles.iter().fold(0u32, |acc, p| {
            let spots = self
                .ids()
                .filter(|&id| {
                    let q = self.spot(id);
                    q.shape() == p.shape && q.memory_mask & used_memory == 0
                })
                .count() as u32;
            let n = spots.min(u32::from(free_compute / p.shape.compute));
            (acc << 4) | n.min(15)
        });
        let supersets = self.valid.iter().filter(|v| v.contains_all(layout)).count() as u32;
        Headroom {
            per_profile,
            supersets,
        }
    }

    /// Builds a layout from (shape, start) pairs, saying which rule fails.
    pub fn layout_from(&self, instances: &[(Shape, u8)]) -> Result<Layout, LayoutError> {
        let mut layout = Layout::EMPTY;
        for &(shape, start) in instances {
            let profile = self
                .spec
                .profile(shape)
                .ok_or(LayoutError::UnknownProfile {
                    model: self.spec.id,
                    compute: shape.compute,
                    memory: shape.memory,
                })?;
            let id = self
                .spot_id(shape, start)
                .ok_or_else(|| LayoutError::StartNotAllowed {
                    model: self.spec.id,
                    profile: profile.name(),
                    start,
                    allowed: profile.starts,
                })?;
            if layout.contains(id) {
                return Err(LayoutError::Duplicate(self.spot(id).describe()));
            }
            let p = self.spot(id);
            if let Some(other) = layout
                .iter()
                .find(|&o| self.spot(o).memory_mask & p.memory_mask != 0)
            {
                return Err(LayoutError::Overlap {
                    a: self.spot(other).describe(),
                    b: p.describe(),
                });
            }
            layout = layout.with(id);
        }
        let used: u32 = layout
            .iter()
            .map(|id| u32::from(self.spot(id).compute()))
            .sum();
        if used > u32::from(self.spec.compute_slices) {
            return Err(LayoutError::ComputeBudget {
                model: self.spec.id,
                used: used.min(255) as u8,
                budget: self.spec.compute_slices,
            });
        }
        debug_assert!(self.is_valid(layout));
        Ok(layout)
    }

    /// The instances of `layout`, by start slot.
    pub fn describe(&self, layout: Layout) -> Vec<InstanceDesc> {
        layout.iter().map(|id| self.spot(id).describe()).collect()
    }

    /// A compact picture of the memory slots: each slot shows the compute
    /// size of the instance covering it, `|` separates instances, `.` is a
    /// free slot. `4g + 2g + 1g` on an A100 is `4444|22|1|.`.
    pub fn picture(&self, layout: Layout) -> String {
        let mut owner: Vec<Option<SpotId>> = vec![None; self.spec.memory_slices as usize];
        for id in layout.iter() {
            let p = self.spot(id);
            for slot in p.start..p.start + p.shape().memory {
                owner[slot as usize] = Some(id);
            }
        }
        let mut out = String::new();
        for (slot, o) in owner.iter().enumerate() {
            if slot > 0 && (o.is_some() || owner[slot - 1].is_some()) && owner[slot - 1] != *o {
                out.push('|');
            }
            match o {
                Some(id) => {
                    let c = self.spot(*id).compute();
                    out.push(char::from_digit(u32::from(c), 10).unwrap_or('?'));
                }
                None => out.push('.'),
            }
        }
        out
    }

    /// Short name of a layout, e.g. `4g.20gb+2g.10gb+1g.5gb`.
    pub fn name(&self, layout: Layout) -> String {
        if layout.is_empty() {
            return "empty".to_string();
        }
        layout
            .iter()
            .map(|id| self.spot(id).profile.name())
            .collect::<Vec<_>>()
            .join("+")
    }
}

/// The id of the memory-slot run (`start`, `size` slots) of a GPU with
/// `slots` memory slots in the driver's binary-tree numbering (see
/// [`Geometry::gpu_instance_id`]).
pub fn slot_tree_id(slots: u32, start: u32, size: u32) -> u32 {
    slots / size - 1 + start / size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stranded_compute_counts_free_slices_a_request_cannot_use() {
        let g = Geometry::of(GpuModel::A100_40gb);
        let shape = |name: &str| {
            g.ids()
                .map(|id| g.spot(id).profile)
                .find(|p| p.name() == name)
                .unwrap()
                .shape
        };
        let (one, four) = (shape("1g.5gb"), shape("4g.20gb"));
        let empty = Layout::default();
        assert_eq!(g.stranded_compute(empty, four), 0);
        // A 1g at slot 0 blocks the one 4g placement: 6 free slices stranded.
        let l = g.layout_from(&[(one, 0)]).unwrap();
        assert_eq!(g.stranded_compute(l, four), 6);
        assert_eq!(g.stranded_compute(l, one), 0);
        let full = g.layout_from(&[(four, 0), (shape("3g.20gb"), 4)]).unwrap();
        assert_eq!(
            g.stranded_compute(full, one),
            0,
            "nothing free, nothing stranded"
        );
    }

    /// Exact counts, checked by hand against NVIDIA's MIG User Guide tables:
    /// the A100/H100/H200 "supported MIG configurations" figure has 19 rows
    /// (the maximal layouts without the 2-slot 1g profile), the A30 table 5;
    /// the RTX PRO 6000 has the A30's slices, the RTX PRO 5000 two layouts
    /// (1g+1g, 2g).
    #[test]
    fn catalog_sizes_match_nvidia_tables() {
        for model in GpuModel::ALL {
            let g = Geometry::of(model);
            let expected = match model.spec().compute_slices {
                4 => 5,
                2 => 2,
                _ => 19,
            };
            assert_eq!(g.catalog().len(), expected, "{model}");
        }
    }

    /// Counts of all valid and all maximal layouts per model (the
    /// eight-slice models share one set of placement rules), derived
    /// independently by brute force in `sidecar/tests/sim/geometry_props.rs`.
    #[test]
    fn layout_counts_per_model() {
        for model in GpuModel::ALL {
            let g = Geometry::of(model);
            let (valid, maximal) = match model.spec().compute_slices {
                4 => (26, 5),
                // {}, 1g@0, 1g@1, 1g@0+1g@1, 2g@0; maximal: the last two.
                2 => (5, 2),
                _ => (723, 78),
            };
            assert_eq!(g.layouts().len(), valid, "{model} valid");
            assert_eq!(g.maximal().len(), maximal, "{model} maximal");
        }
    }

    #[test]
    fn catalog_starts_with_the_whole_gpu_and_has_known_rows() {
        let g = Geometry::of(GpuModel::A100_40gb);
        assert_eq!(g.catalog()[0], g.whole_gpu());
        let names: Vec<String> = g.catalog().iter().map(|&l| g.picture(l)).collect();
        for row in ["4444|3333", "3333|3333", "4444|22|1|.", "1|1|1|1|1|1|1|."] {
            assert!(
                names.iter().any(|n| n == row),
                "{row} missing from {names:?}"
            );
        }
    }

    #[test]
    fn layout_from_names_the_broken_rule() {
        let g = Geometry::of(GpuModel::A100_40gb);
        let s = |c, m| Shape::new(c, m);
        assert!(g.layout_from(&[(s(4, 4), 0), (s(3, 4), 4)]).is_ok());
        let err = g.layout_from(&[(s(3, 4), 2)]).unwrap_err();
        assert!(matches!(err, LayoutError::StartNotAllowed { .. }), "{err}");
        let err = g.layout_from(&[(s(4, 4), 0), (s(2, 2), 2)]).unwrap_err();
        assert!(matches!(err, LayoutError::Overlap { .. }), "{err}");
        let err = g.layout_from(&[(s(5, 4), 0)]).unwrap_err();
        assert!(matches!(err, LayoutError::UnknownProfile { .. }), "{err}");
        let err = g.layout_from(&[(s(1, 1), 0), (s(1, 1), 0)]).unwrap_err();
        assert!(matches!(err, LayoutError::Duplicate(_)), "{err}");
        // 4g@0 leaves slots 4..8 free, but 4g + 1g*4 would need 8 compute slices.
        let ones: Vec<_> = (4..7).map(|st| (s(1, 1), st)).collect();
        let mut four_ones = vec![(s(4, 4), 0)];
        four_ones.extend(ones);
        assert!(g.layout_from(&four_ones).is_ok());
        let err = g
            .layout_from(&[(s(4, 4), 0), (s(1, 2), 4), (s(1, 2), 6)])
            .map(|l| g.picture(l));
        assert_eq!(err.unwrap(), "4444|11|11");
    }

    #[test]
    fn pictures() {
        let g = Geometry::of(GpuModel::A100_40gb);
        assert_eq!(g.picture(g.whole_gpu()), "77777777");
        assert_eq!(g.picture(Layout::EMPTY), "........");
        let a30 = Geometry::of(GpuModel::A30_24gb);
        assert_eq!(a30.picture(a30.whole_gpu()), "4444");
        let rtx = Geometry::of(GpuModel::RtxPro5000_48gb);
        assert_eq!(rtx.picture(rtx.whole_gpu()), "22");
        let pics: Vec<String> = rtx.catalog().iter().map(|&l| rtx.picture(l)).collect();
        assert_eq!(pics, ["22", "1|1"]);
    }
}
