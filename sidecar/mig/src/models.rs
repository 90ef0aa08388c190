//! The one table of GPU models and their MIG profiles.
//!
//! Everything the rest of the code knows about MIG hardware comes from
//! [`MODELS`]; a correction is one edit here. Profiles are identified by their
//! slice counts ([`Shape`]), never by name strings, because names drift between
//! drivers (`3g.39gb` vs `3g.40gb`).
//!
//! Sources (checked by hand, see also `docs/mig-geometry.md`):
//! - NVIDIA MIG User Guide, "Supported MIG Profiles" (A30, A100-40GB,
//!   A100-80GB, H100-80GB, H100-94GB NVL, H200-141GB tables: profile names,
//!   slice counts, instances per GPU, placements and `nvidia-smi mig -lgip`
//!   profile ids).
//! - NVML API reference, `NVML_GPU_INSTANCE_PROFILE_*` constants (the profile
//!   index passed to `nvmlDeviceGetGpuInstanceProfileInfo`).
//!
//! On real hardware the daemon queries ids and placements through NVML and
//! compares them with this table, so a drift is reported, not silently used.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A MIG profile's identity: how many compute and memory slices it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Shape {
    /// Compute slices (the `Ng` in `Ng.Mgb`).
    pub compute: u8,
    /// Memory slices (of 8, or 4 on the A30).
    pub memory: u8,
}

impl Shape {
    pub const fn new(compute: u8, memory: u8) -> Self {
        Shape { compute, memory }
    }
}

/// One MIG GPU-instance profile of one GPU model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfileSpec {
    pub shape: Shape,
    /// Memory in GB as printed in NVIDIA's profile name (`3g.20gb` -> 20).
    /// This is what users ask for with `--mig-mem`; the usable memory NVML
    /// reports is a little lower (e.g. 19968 MiB for `3g.20gb`).
    pub memory_gb: u32,
    /// `NVML_GPU_INSTANCE_PROFILE_*` index (argument of
    /// `nvmlDeviceGetGpuInstanceProfileInfo`).
    pub nvml_profile: u32,
    /// Profile id as listed by `nvidia-smi mig -lgip` (`nvmlGpuInstanceProfileInfo_t.id`).
    pub smi_id: u32,
    /// Allowed start memory slots of this profile.
    pub starts: &'static [u8],
}

impl ProfileSpec {
    /// NVIDIA's canonical name, e.g. `3g.20gb`.
    pub fn name(&self) -> String {
        format!("{}g.{}gb", self.shape.compute, self.memory_gb)
    }
}

/// A MIG-capable GPU model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum GpuModel {
    #[serde(rename = "a30-24gb")]
    A30_24gb,
    #[serde(rename = "a100-40gb")]
    A100_40gb,
    #[serde(rename = "a100-80gb")]
    A100_80gb,
    #[serde(rename = "h100-80gb")]
    H100_80gb,
    #[serde(rename = "h100-94gb")]
    H100_94gb,
    #[serde(rename = "h200-141gb")]
    H200_141gb,
}

/// Static description of one GPU model.
#[derive(Debug)]
pub struct ModelSpec {
    pub model: GpuModel,
    /// Stable identifier used in configs and on the command line.
    pub id: &'static str,
    /// Human-readable name.
    pub display: &'static str,
    /// Memory slices of the whole GPU (8, or 4 on the A30).
    pub memory_slices: u8,
    /// Compute slices of the whole GPU (7, or 4 on the A30).
    pub compute_slices: u8,
    /// Framebuffer of the whole GPU in GB (the full profile's name).
    pub memory_gb: u32,
    /// Substrings of NVML device names (`nvmlDeviceGetName`) that identify the model.
    pub nvml_names: &'static [&'static str],
    /// MIG profiles, media-extension (`+me`) variants left out (the scheduler ignores them).
    pub profiles: &'static [ProfileSpec],
}

/// Most MIG profiles any model has (`ModelSpec::profiles`): the width of
/// per-profile tables such as the policy's waiting-job counts.
pub const MAX_PROFILES: usize = 8;

const fn p(
    compute: u8,
    memory: u8,
    memory_gb: u32,
    nvml_profile: u32,
    smi_id: u32,
    starts: &'static [u8],
) -> ProfileSpec {
    ProfileSpec {
        shape: Shape::new(compute, memory),
        memory_gb,
        nvml_profile,
        smi_id,
        starts,
    }
}

// NVML profile indices (nvml.h): 1_SLICE=0, 2_SLICE=1, 3_SLICE=2, 4_SLICE=3,
// 7_SLICE=4, 1_SLICE_REV2=9 (one compute slice with two memory slices).
const NVML_1: u32 = 0;
const NVML_2: u32 = 1;
const NVML_3: u32 = 2;
const NVML_4: u32 = 3;
const NVML_7: u32 = 4;
const NVML_1_REV2: u32 = 9;

const S1: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const S1_WIDE: &[u8] = &[0, 2, 4, 6];
const S2: &[u8] = &[0, 2, 4];
const S3: &[u8] = &[0, 4];
const S0: &[u8] = &[0];

/// The eight-memory-slice family (A100, H100, H200) differs only in memory sizes.
const fn eight_slice(mem: [u32; 6]) -> [ProfileSpec; 6] {
    [
        p(1, 1, mem[0], NVML_1, 19, S1),
        p(1, 2, mem[1], NVML_1_REV2, 15, S1_WIDE),
        p(2, 2, mem[2], NVML_2, 14, S2),
        p(3, 4, mem[3], NVML_3, 9, S3),
        p(4, 4, mem[4], NVML_4, 5, S0),
        p(7, 8, mem[5], NVML_7, 0, S0),
    ]
}

const A100_40: [ProfileSpec; 6] = eight_slice([5, 10, 10, 20, 20, 40]);
const A100_80: [ProfileSpec; 6] = eight_slice([10, 20, 20, 40, 40, 80]);
const H100_94: [ProfileSpec; 6] = eight_slice([12, 24, 24, 47, 47, 94]);
const H200_141: [ProfileSpec; 6] = eight_slice([18, 35, 35, 71, 71, 141]);
const A30_24: [ProfileSpec; 3] = [
    p(1, 1, 6, NVML_1, 14, &[0, 1, 2, 3]),
    p(2, 2, 12, NVML_2, 5, &[0, 2]),
    p(4, 4, 24, NVML_4, 0, S0),
];

/// All supported models. H100-80GB shares A100-80GB's profile sizes.
pub static MODELS: [ModelSpec; 6] = [
    ModelSpec {
        model: GpuModel::A30_24gb,
        id: "a30-24gb",
        display: "A30-24GB",
        memory_slices: 4,
        compute_slices: 4,
        memory_gb: 24,
        nvml_names: &["A30"],
        profiles: &A30_24,
    },
    ModelSpec {
        model: GpuModel::A100_40gb,
        id: "a100-40gb",
        display: "A100-40GB",
        memory_slices: 8,
        compute_slices: 7,
        memory_gb: 40,
        nvml_names: &["A100-SXM4-40GB", "A100-PCIE-40GB", "A100 40GB"],
        profiles: &A100_40,
    },
    ModelSpec {
        model: GpuModel::A100_80gb,
        id: "a100-80gb",
        display: "A100-80GB",
        memory_slices: 8,
        compute_slices: 7,
        memory_gb: 80,
        nvml_names: &["A100-SXM4-80GB", "A100 80GB", "A100-PCIE-80GB", "A800"],
        profiles: &A100_80,
    },
    ModelSpec {
        model: GpuModel::H100_80gb,
        id: "h100-80gb",
        display: "H100-80GB",
        memory_slices: 8,
        compute_slices: 7,
        memory_gb: 80,
        nvml_names: &["H100 80GB", "H100 PCIe", "H100-SXM5-80GB", "H800"],
        profiles: &A100_80,
    },
    ModelSpec {
        model: GpuModel::H100_94gb,
        id: "h100-94gb",
        display: "H100-94GB (NVL)",
        memory_slices: 8,
        compute_slices: 7,
        memory_gb: 94,
        nvml_names: &["H100 NVL", "H100 94GB"],
        profiles: &H100_94,
    },
    ModelSpec {
        model: GpuModel::H200_141gb,
        id: "h200-141gb",
        display: "H200-141GB",
        memory_slices: 8,
        compute_slices: 7,
        memory_gb: 141,
        nvml_names: &["H200"],
        profiles: &H200_141,
    },
];

impl GpuModel {
    /// Every supported model, in table order.
    pub const ALL: [GpuModel; 6] = [
        GpuModel::A30_24gb,
        GpuModel::A100_40gb,
        GpuModel::A100_80gb,
        GpuModel::H100_80gb,
        GpuModel::H100_94gb,
        GpuModel::H200_141gb,
    ];

    /// The models of `cluster` (one per GPU), each once, in model order.
    pub fn distinct(cluster: &[GpuModel]) -> Vec<GpuModel> {
        let mut models = cluster.to_vec();
        models.sort();
        models.dedup();
        models
    }

    /// The model's row in [`MODELS`].
    pub fn spec(self) -> &'static ModelSpec {
        &MODELS[self as usize]
    }

    /// Stable identifier, e.g. `a100-40gb`.
    pub fn id(self) -> &'static str {
        self.spec().id
    }

    /// Recognises an NVML device name such as `NVIDIA A100-SXM4-40GB`.
    pub fn from_nvml_name(name: &str) -> Option<GpuModel> {
        let upper = name.to_ascii_uppercase();
        MODELS.iter().find_map(|m| {
            m.nvml_names
                .iter()
                .any(|n| upper.contains(&n.to_ascii_uppercase()))
                .then_some(m.model)
        })
    }
}

impl fmt::Display for GpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// Error for an unknown GPU model name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown GPU model `{given}` (known: {known})")]
pub struct UnknownModel {
    pub given: String,
    pub known: String,
}

impl FromStr for GpuModel {
    type Err = UnknownModel;

    /// Accepts the ids (`a100-40gb`), case-insensitively, with `_` for `-`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_lowercase().replace('_', "-");
        MODELS
            .iter()
            .find(|m| m.id == norm)
            .map(|m| m.model)
            .ok_or_else(|| UnknownModel {
                given: s.to_string(),
                known: MODELS.iter().map(|m| m.id).collect::<Vec<_>>().join(", "),
            })
    }
}

impl ModelSpec {
    /// The profile with this shape, if the model has it.
    pub fn profile(&self, shape: Shape) -> Option<&'static ProfileSpec> {
        self.profiles.iter().find(|p| p.shape == shape)
    }

    /// The whole-GPU profile (`7g.40gb`, `4g.24gb` on the A30).
    pub fn full_profile(&self) -> &'static ProfileSpec {
        self.profiles
            .iter()
            .max_by_key(|p| p.shape)
            .expect("every model has profiles")
    }

    /// Compute-slice sizes that exist as profiles, ascending (1,2,3,4,7).
    pub fn compute_sizes(&self) -> Vec<u8> {
        let mut sizes: Vec<u8> = self.profiles.iter().map(|p| p.shape.compute).collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_model_has_more_profiles_than_the_tables_hold() {
        for m in &MODELS {
            assert!(
                m.profiles.len() <= MAX_PROFILES,
                "{} has {} profiles",
                m.id,
                m.profiles.len()
            );
        }
    }

    #[test]
    fn table_rows_match_their_enum() {
        for (i, m) in MODELS.iter().enumerate() {
            assert_eq!(m.model as usize, i, "{} is out of order", m.id);
            assert_eq!(m.model.id().parse::<GpuModel>().unwrap(), m.model);
        }
    }

    #[test]
    fn starts_keep_profiles_inside_the_gpu() {
        for m in &MODELS {
            for p in m.profiles {
                for &s in p.starts {
                    assert!(
                        s + p.shape.memory <= m.memory_slices,
                        "{} {}",
                        m.id,
                        p.name()
                    );
                    assert_eq!(
                        s % p.shape.memory.min(4),
                        0,
                        "{} {} misaligned",
                        m.id,
                        p.name()
                    );
                }
                assert!(p.shape.compute <= m.compute_slices);
            }
            assert_eq!(m.full_profile().memory_gb, m.memory_gb);
        }
    }

    #[test]
    fn nvml_names_resolve() {
        assert_eq!(
            GpuModel::from_nvml_name("NVIDIA A100-SXM4-40GB"),
            Some(GpuModel::A100_40gb)
        );
        assert_eq!(
            GpuModel::from_nvml_name("NVIDIA H100 80GB HBM3"),
            Some(GpuModel::H100_80gb)
        );
        assert_eq!(
            GpuModel::from_nvml_name("NVIDIA H100 NVL"),
            Some(GpuModel::H100_94gb)
        );
        assert_eq!(
            GpuModel::from_nvml_name("NVIDIA A30"),
            Some(GpuModel::A30_24gb)
        );
        assert_eq!(GpuModel::from_nvml_name("Tesla V100"), None);
    }

    #[test]
    fn unknown_model_names_the_known_ones() {
        let err = "v100".parse::<GpuModel>().unwrap_err();
        assert!(err.to_string().contains("a100-40gb"));
    }
}
