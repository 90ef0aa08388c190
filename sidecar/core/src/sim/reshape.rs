//! What a reconfiguration of one GPU did, in the words of the MIG
//! literature: merged idle neighbours into a bigger instance (*fusion*),
//! split a big idle instance into smaller ones (*fission*), or anything
//! else (*reshape*).
//!
//! The policies never say which they meant: greedy and the learned policy
//! only name a target layout. The kind is therefore read off the
//! transition alone (what was destroyed, what was created), so the
//! simulator, the event log and its audit all get the same answer from the
//! same pure function ([`classify`]). Destroyed instances are always idle:
//! the simulator refuses a transition that destroys a busy one.

use serde::{Deserialize, Serialize};

use crate::mig::{InstanceDesc, Spot};

/// The kind of one applied reconfiguration of one GPU.
///
/// Let an instance's *space* be its memory slots `[start, start +
/// memory_slices)` and its *size* its compute slices. Then:
///
/// - **fusion**: at least two instances are destroyed, and some created
///   instance `c` holds the whole space of at least two destroyed
///   instances, each of which is smaller than `c` (e.g. A100: `1g.5gb@0` +
///   `1g.5gb@1` -> `2g.10gb@0`). Idle neighbours became one bigger slice.
/// - **fission**: exactly one instance `d` is destroyed, and at least two
///   created instances lie inside `d`'s space, each smaller than `d` (e.g.
///   `7g.40gb@0` -> `3g.20gb@0` + `3g.20gb@4`). A big idle slice became
///   several small ones.
/// - **reshape**: everything else: a same-size swap (`1g.5gb@0` + `1g.5gb@1`
///   -> `1g.10gb@0` merges memory, not compute), a move, a grow into free
///   space, pure creations or destructions.
///
/// Other instances may be destroyed or created in the same reconfiguration
/// (fusion and fission look for the merge or the split, not for a
/// reconfiguration that does nothing else). The two are exclusive by the
/// number destroyed (two or more, exactly one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReconfigKind {
    Fusion,
    Fission,
    #[default]
    Reshape,
}

impl ReconfigKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ReconfigKind::Fusion => "fusion",
            ReconfigKind::Fission => "fission",
            ReconfigKind::Reshape => "reshape",
        }
    }
}

impl std::fmt::Display for ReconfigKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The part of an instance the classification looks at: its size and
/// space. `Copy`, so the simulator builds them on the stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    pub compute: u8,
    pub start: u8,
    pub memory_slices: u8,
}

impl Span {
    /// Whether `other`'s space lies inside this one's.
    fn holds(self, other: Span) -> bool {
        let end = u16::from(self.start) + u16::from(self.memory_slices);
        let other_end = u16::from(other.start) + u16::from(other.memory_slices);
        self.start <= other.start && other_end <= end
    }
}

impl From<&InstanceDesc> for Span {
    fn from(d: &InstanceDesc) -> Self {
        Span {
            compute: d.compute,
            start: d.start,
            memory_slices: d.memory_slices,
        }
    }
}

impl From<&Spot> for Span {
    fn from(p: &Spot) -> Self {
        Span {
            compute: p.compute(),
            start: p.start,
            memory_slices: p.profile.shape.memory,
        }
    }
}

/// Classifies one reconfiguration of one GPU (definitions on
/// [`ReconfigKind`]). Pure; allocates nothing.
pub fn classify(destroyed: &[Span], created: &[Span]) -> ReconfigKind {
    match destroyed {
        [] => ReconfigKind::Reshape,
        [d] => {
            let parts = created
                .iter()
                .filter(|c| c.compute < d.compute && d.holds(**c))
                .count();
            if parts >= 2 {
                ReconfigKind::Fission
            } else {
                ReconfigKind::Reshape
            }
        }
        _ => {
            let fused = created.iter().any(|c| {
                destroyed
                    .iter()
                    .filter(|d| d.compute < c.compute && c.holds(**d))
                    .count()
                    >= 2
            });
            if fused {
                ReconfigKind::Fusion
            } else {
                ReconfigKind::Reshape
            }
        }
    }
}

/// [`classify`] over the event log's instance descriptions (the audit's
/// side; allocates two small vectors).
pub fn classify_descs(destroyed: &[InstanceDesc], created: &[InstanceDesc]) -> ReconfigKind {
    let d: Vec<Span> = destroyed.iter().map(Span::from).collect();
    let c: Vec<Span> = created.iter().map(Span::from).collect();
    classify(&d, &c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::{Geometry, GpuModel, Layout, Shape};

    /// A100-40GB instances by (compute, memory slices, start), through the
    /// real geometry so a typo cannot make an impossible placement.
    fn a100(spec: &[(u8, u8, u8)]) -> Vec<Span> {
        let g = Geometry::of(GpuModel::A100_40gb);
        spec.iter()
            .map(|&(c, m, s)| {
                let id = g
                    .spot_id(Shape::new(c, m), s)
                    .unwrap_or_else(|| panic!("no {c}g/{m} at {s} on an A100"));
                Span::from(g.spot(id))
            })
            .collect()
    }

    const G1: (u8, u8) = (1, 1); // 1g.5gb
    const G1M: (u8, u8) = (1, 2); // 1g.10gb
    const G2: (u8, u8) = (2, 2); // 2g.10gb
    const G3: (u8, u8) = (3, 4); // 3g.20gb
    const G4: (u8, u8) = (4, 4); // 4g.20gb
    const G7: (u8, u8) = (7, 8); // 7g.40gb

    fn at(p: (u8, u8), start: u8) -> (u8, u8, u8) {
        (p.0, p.1, start)
    }

    #[test]
    fn two_idle_1g_into_a_2g_is_fusion() {
        let d = a100(&[at(G1, 0), at(G1, 1)]);
        let c = a100(&[at(G2, 0)]);
        assert_eq!(classify(&d, &c), ReconfigKind::Fusion);
    }

    #[test]
    fn four_1g_into_two_2g_and_all_into_7g_are_fusions() {
        let d = a100(&[at(G1, 0), at(G1, 1), at(G1, 2), at(G1, 3)]);
        let c = a100(&[at(G2, 0), at(G2, 2)]);
        assert_eq!(classify(&d, &c), ReconfigKind::Fusion);
        let d = a100(&[at(G3, 0), at(G2, 4), at(G1, 6)]);
        assert_eq!(classify(&d, &a100(&[at(G7, 0)])), ReconfigKind::Fusion);
    }

    #[test]
    fn the_7g_into_two_3g_is_fission() {
        let d = a100(&[at(G7, 0)]);
        let c = a100(&[at(G3, 0), at(G3, 4)]);
        assert_eq!(classify(&d, &c), ReconfigKind::Fission);
    }

    #[test]
    fn a_3g_into_a_2g_and_a_1g_is_fission() {
        let d = a100(&[at(G3, 0)]);
        let c = a100(&[at(G2, 0), at(G1, 2)]);
        assert_eq!(classify(&d, &c), ReconfigKind::Fission);
        // ... also with more created inside it.
        let c = a100(&[at(G2, 0), at(G1, 2), at(G1, 3)]);
        assert_eq!(classify(&d, &c), ReconfigKind::Fission);
    }

    #[test]
    fn same_size_swaps_moves_and_pure_changes_are_reshapes() {
        // Two 1g.5gb into one 1g.10gb: more memory, not more compute.
        let d = a100(&[at(G1, 0), at(G1, 1)]);
        assert_eq!(classify(&d, &a100(&[at(G1M, 0)])), ReconfigKind::Reshape);
        // 4g -> 3g in the same space: one destroyed, one created.
        let d = a100(&[at(G4, 0)]);
        assert_eq!(classify(&d, &a100(&[at(G3, 0)])), ReconfigKind::Reshape);
        // A 3g split into parts of which only one lies in its space.
        let d = a100(&[at(G3, 0)]);
        let c = a100(&[at(G2, 0), at(G2, 4)]);
        assert_eq!(classify(&d, &c), ReconfigKind::Reshape);
        // Two 1g destroyed, a 2g created elsewhere (holds neither).
        let d = a100(&[at(G1, 0), at(G1, 1)]);
        assert_eq!(classify(&d, &a100(&[at(G2, 4)])), ReconfigKind::Reshape);
        // Pure creation and pure destruction.
        let c = a100(&[at(G1, 0), at(G1, 1)]);
        assert_eq!(classify(&[], &c), ReconfigKind::Reshape);
        assert_eq!(classify(&c, &[]), ReconfigKind::Reshape);
        assert_eq!(classify(&[], &[]), ReconfigKind::Reshape);
    }

    #[test]
    fn descriptions_classify_like_placements() {
        let g = Geometry::of(GpuModel::A100_40gb);
        let whole = g.whole_gpu();
        let mut two = Layout::EMPTY;
        for s in [0, 4] {
            let id = g.spot_id(Shape::new(3, 4), s).expect("3g placement");
            two = two.with(id);
        }
        assert_eq!(
            classify_descs(&g.describe(whole), &g.describe(two)),
            ReconfigKind::Fission
        );
        assert_eq!(
            classify_descs(&g.describe(two), &g.describe(whole)),
            ReconfigKind::Fusion
        );
    }

    #[test]
    fn kinds_serialize_lowercase() {
        let s = serde_json::to_string(&ReconfigKind::Fission).expect("serializes");
        assert_eq!(s, "\"fission\"");
        let k: ReconfigKind = serde_json::from_str("\"fusion\"").expect("parses");
        assert_eq!(k, ReconfigKind::Fusion);
    }
}
