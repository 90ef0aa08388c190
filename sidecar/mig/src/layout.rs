//! Spots (a profile at a start slot) and layouts (sets of spots).
//!
//! A [`Spot`] is what NVIDIA calls a GPU instance *placement*
//! (`nvmlGpuInstancePlacement_t`); smartmig keeps the word "placement" for
//! which job goes where (the simulator's and smartmigd's job placement), so
//! the Rust names here say spot. NVML's own calls keep NVIDIA's spelling.
//!
//! A [`Layout`] is a bit set over the spots of one GPU model (at most
//! 18 on the eight-slice models), so layouts are `Copy`, hash cheaply and
//! compare in one instruction: the simulator handles millions of them. A
//! layout only has meaning together with the [`Geometry`](super::Geometry)
//! of the model it was made for.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::models::{ProfileSpec, Shape};

/// Index of a spot in its model's spot table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpotId(pub u8);

/// A profile placed at a start memory slot: one potential MIG GPU instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spot {
    pub profile: &'static ProfileSpec,
    /// First memory slot.
    pub start: u8,
    /// Memory slots covered, one bit per slot.
    pub memory_mask: u16,
}

impl Spot {
    pub fn shape(&self) -> Shape {
        self.profile.shape
    }

    pub fn compute(&self) -> u8 {
        self.profile.shape.compute
    }

    /// The instance as it appears in configs, logs and JSON.
    pub fn describe(&self) -> InstanceDesc {
        InstanceDesc {
            profile: self.profile.name(),
            compute: self.profile.shape.compute,
            memory_slices: self.profile.shape.memory,
            start: self.start,
        }
    }
}

/// Serializable description of one placed instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceDesc {
    pub profile: String,
    pub compute: u8,
    pub memory_slices: u8,
    pub start: u8,
}

impl fmt::Display for InstanceDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.profile, self.start)
    }
}

/// A set of spots of one model (valid or not: see [`Geometry::is_valid`](super::Geometry::is_valid)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Layout(pub u32);

impl Layout {
    /// No instances: the GPU is in MIG mode with nothing created.
    pub const EMPTY: Layout = Layout(0);

    pub fn single(id: SpotId) -> Layout {
        Layout(1 << id.0)
    }

    pub fn contains(self, id: SpotId) -> bool {
        self.0 & (1 << id.0) != 0
    }

    /// Every spot of `other` is also in `self`.
    pub fn contains_all(self, other: Layout) -> bool {
        self.0 & other.0 == other.0
    }

    pub fn with(self, id: SpotId) -> Layout {
        Layout(self.0 | (1 << id.0))
    }

    pub fn without(self, id: SpotId) -> Layout {
        Layout(self.0 & !(1 << id.0))
    }

    pub fn union(self, other: Layout) -> Layout {
        Layout(self.0 | other.0)
    }

    pub fn intersection(self, other: Layout) -> Layout {
        Layout(self.0 & other.0)
    }

    /// Spots in `self` but not in `other`.
    pub fn minus(self, other: Layout) -> Layout {
        Layout(self.0 & !other.0)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// Spot ids in ascending order.
    pub fn iter(self) -> impl Iterator<Item = SpotId> {
        let mut bits = self.0;
        std::iter::from_fn(move || {
            if bits == 0 {
                return None;
            }
            let i = bits.trailing_zeros();
            bits &= bits - 1;
            Some(SpotId(i as u8))
        })
    }
}

impl FromIterator<SpotId> for Layout {
    fn from_iter<I: IntoIterator<Item = SpotId>>(iter: I) -> Self {
        iter.into_iter().fold(Layout::EMPTY, Layout::with)
    }
}
