//! The one table of GPU models and their MIG profiles.
//!
//! Everything the rest of the code knows about MIG hardware comes from
//! [`MODELS`]; a correction is one edit here. Profiles are identified by their
//! slice counts ([`Shape`]), never by name strings, because names drift between
//! drivers (`3g.39gb` vs `3g.40gb`, GB300's `3g.139gb` vs `3g.126gb`).
//!
//! Every row says where its figures come from ([`Sources`]): NVIDIA's MIG
//! User Guide ("Supported MIG Profiles", R580 and R610 editions) where it has
//! a table for the model, else NVIDIA's own `mig-parted` default config or
//! second-hand listings, else an inference from the other models, each
//! marked as such (docs/mig-geometry.md cites them per model).
//!
//! On real hardware the NVML backend reads every profile the driver offers
//! (ids, slice counts, memory, placements) and matches it with this table
//! ([`super::driver`]): a difference is a refusal to manage the GPU, never a
//! guess, so an entry marked unconfirmed here cannot silently do harm.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A MIG profile's identity: how many compute and memory slices it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Shape {
    /// Compute slices (the `Ng` in `Ng.Mgb`).
    pub compute: u8,
    /// Memory slices (of 8, 4 on the A30 and RTX PRO 6000, 2 on the RTX PRO 5000).
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

/// A non-default variant of a profile: the same slices with other engines.
/// smartmig never creates one for a shard job (docs/user-guide.md,
/// "Profile variants"); the table lists them so that names parse, the
/// driver's list can be matched, and doctor can name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum VariantKind {
    /// `+me`: with media extensions (a decoder, JPEG and OFA engine).
    Me,
    /// `-me`: without any media engine (pure compute).
    NoMe,
    /// `+gfx`: with graphics APIs (GB20X: RTX PRO).
    Gfx,
    /// `+me.all`: every media engine of the GPU (no graphics).
    MeAll,
}

impl VariantKind {
    pub const ALL: [VariantKind; 4] = [
        VariantKind::Me,
        VariantKind::NoMe,
        VariantKind::Gfx,
        VariantKind::MeAll,
    ];

    /// The suffix NVIDIA's names carry: `+me`, `-me`, `+gfx`, `+me.all`.
    pub fn suffix(self) -> &'static str {
        match self {
            VariantKind::Me => "+me",
            VariantKind::NoMe => "-me",
            VariantKind::Gfx => "+gfx",
            VariantKind::MeAll => "+me.all",
        }
    }

    /// The variant a name's tail names (`1g.24gb+me.all` -> `MeAll`).
    pub fn of_name(name: &str) -> Option<VariantKind> {
        let lower = name.trim().to_ascii_lowercase();
        // Longest suffix first: `+me.all` also ends like nothing else.
        [
            VariantKind::MeAll,
            VariantKind::Gfx,
            VariantKind::NoMe,
            VariantKind::Me,
        ]
        .into_iter()
        .find(|k| lower.ends_with(k.suffix()))
    }
}

/// One variant profile of one model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VariantSpec {
    /// The default profile it varies (same slices, same placements).
    pub base: Shape,
    pub kind: VariantKind,
    /// `NVML_GPU_INSTANCE_PROFILE_*` index (nvml.h: `1_SLICE_REV1` is 1g
    /// `+me`, `2_SLICE_REV1` 2g `+me`, `*_GFX`, `*_NO_ME`, `*_ALL_ME`).
    pub nvml_profile: u32,
    /// The driver's profile id where a source lists it.
    pub smi_id: Option<u32>,
    /// Instances of it one GPU holds (the guide's "Number of Instances").
    pub max_instances: u8,
}

/// Where a group of figures of the table comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provenance {
    /// Printed on NVIDIA's own pages (the MIG User Guide), or read from the
    /// driver on a real GPU.
    Nvidia(&'static str),
    /// From a source other than NVIDIA's documentation (NVIDIA's mig-parted
    /// config, vendors' and users' listings): not confirmed by NVIDIA's pages.
    SecondHand(&'static str),
    /// Not printed anywhere we found: inferred from the other models.
    Inferred(&'static str),
}

impl Provenance {
    /// Whether NVIDIA's own pages (or a real driver) confirm it.
    pub fn confirmed(self) -> bool {
        matches!(self, Provenance::Nvidia(_))
    }

    /// The source text.
    pub fn text(self) -> &'static str {
        match self {
            Provenance::Nvidia(t) | Provenance::SecondHand(t) | Provenance::Inferred(t) => t,
        }
    }

    /// `NVIDIA`, `second-hand` or `inferred`.
    pub fn label(self) -> &'static str {
        match self {
            Provenance::Nvidia(_) => "NVIDIA",
            Provenance::SecondHand(_) => "second-hand (not confirmed by NVIDIA's pages)",
            Provenance::Inferred(_) => "inferred (not confirmed by NVIDIA's pages)",
        }
    }
}

/// The sources of one row of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sources {
    /// Profile names, memory sizes, slice fractions, instances per GPU.
    pub profiles: Provenance,
    /// The driver's profile ids (`nvidia-smi mig -lgip`).
    pub ids: Provenance,
    /// The allowed start slots (`nvidia-smi mig -lgipp`).
    pub placements: Provenance,
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
    #[serde(rename = "b200-180gb")]
    B200_180gb,
    #[serde(rename = "gb200-186gb")]
    Gb200_186gb,
    #[serde(rename = "b300-288gb")]
    B300_288gb,
    #[serde(rename = "gb300-288gb")]
    Gb300_288gb,
    #[serde(rename = "rtx-pro-6000-96gb")]
    RtxPro6000_96gb,
    #[serde(rename = "rtx-pro-5000-48gb")]
    RtxPro5000_48gb,
}

/// Static description of one GPU model.
#[derive(Debug)]
pub struct ModelSpec {
    pub model: GpuModel,
    /// Stable identifier used in configs and on the command line.
    pub id: &'static str,
    /// Human-readable name.
    pub display: &'static str,
    /// Memory slices of the whole GPU (8; 4 on the A30 and RTX PRO 6000; 2
    /// on the RTX PRO 5000).
    pub memory_slices: u8,
    /// Compute slices of the whole GPU: the shards Slurm sells per GPU (7,
    /// 4 or 2).
    pub compute_slices: u8,
    /// Framebuffer of the whole GPU in GB (the full profile's name).
    pub memory_gb: u32,
    /// Substrings of NVML device names (`nvmlDeviceGetName`) that identify
    /// the model; the longest match wins (`GB200` over `B200`).
    pub nvml_names: &'static [&'static str],
    /// The default MIG profiles: what smartmig schedules.
    pub profiles: &'static [ProfileSpec],
    /// The non-default variants (`+me`, `-me`, `+gfx`, `+me.all`).
    pub variants: &'static [VariantSpec],
    /// Where the figures come from.
    pub sources: Sources,
    /// Whether switching MIG mode needs a GPU reset (A100, A30) or not
    /// (Hopper and later); smartmig never switches it either way.
    pub mig_mode_needs_reset: bool,
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

const fn v(
    base: Shape,
    kind: VariantKind,
    nvml_profile: u32,
    smi_id: Option<u32>,
    max_instances: u8,
) -> VariantSpec {
    VariantSpec {
        base,
        kind,
        nvml_profile,
        smi_id,
        max_instances,
    }
}

// NVML profile indices (nvml.h): 1_SLICE=0, 2_SLICE=1, 3_SLICE=2, 4_SLICE=3,
// 7_SLICE=4, 1_SLICE_REV1=7 (1g +me), 2_SLICE_REV1=8 (2g +me),
// 1_SLICE_REV2=9 (one compute slice with two memory slices), 1/2/4_SLICE_GFX
// = 10/11/12, 1/2_SLICE_NO_ME = 13/14, 1/2_SLICE_ALL_ME = 15/16.
pub const NVML_1: u32 = 0;
pub const NVML_2: u32 = 1;
pub const NVML_3: u32 = 2;
pub const NVML_4: u32 = 3;
pub const NVML_7: u32 = 4;
pub const NVML_1_REV1: u32 = 7;
pub const NVML_2_REV1: u32 = 8;
pub const NVML_1_REV2: u32 = 9;
pub const NVML_1_GFX: u32 = 10;
pub const NVML_2_GFX: u32 = 11;
pub const NVML_4_GFX: u32 = 12;
pub const NVML_1_NO_ME: u32 = 13;
pub const NVML_2_NO_ME: u32 = 14;
pub const NVML_1_ALL_ME: u32 = 15;
pub const NVML_2_ALL_ME: u32 = 16;
/// `NVML_GPU_INSTANCE_PROFILE_COUNT`: the indices a driver can answer.
pub const NVML_PROFILE_COUNT: u32 = 17;
/// The indices of default (non-variant) profiles: a driver profile at one
/// of these that the table lacks is a difference in the geometry.
pub const NVML_DEFAULT_INDICES: [u32; 8] = [0, 1, 2, 3, 4, 5, 6, NVML_1_REV2];

const S1: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const S1_WIDE: &[u8] = &[0, 2, 4, 6];
const S2: &[u8] = &[0, 2, 4];
const S3: &[u8] = &[0, 4];
const S0: &[u8] = &[0];
const S1_FOUR: &[u8] = &[0, 1, 2, 3];
const S2_FOUR: &[u8] = &[0, 2];
const S1_TWO: &[u8] = &[0, 1];

/// The eight-memory-slice family (A100, H100, H200, B200, GB200, B300,
/// GB300) differs only in memory sizes: 1g, wide 1g, 2g, 3g, 4g, 7g.
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

/// The one `+me` variant of the eight-slice models: a 1g with media
/// extensions, one per GPU, profile id 20 (read on an H200; the guide's
/// `nvidia-smi mig -lgipp` example shows id 20 on an A100).
const EIGHT_SLICE_ME: [VariantSpec; 1] = [v(
    Shape::new(1, 1),
    VariantKind::Me,
    NVML_1_REV1,
    Some(20),
    1,
)];

const A100_40: [ProfileSpec; 6] = eight_slice([5, 10, 10, 20, 20, 40]);
const A100_80: [ProfileSpec; 6] = eight_slice([10, 20, 20, 40, 40, 80]);
const H100_94: [ProfileSpec; 6] = eight_slice([12, 24, 24, 47, 47, 94]);
const H200_141: [ProfileSpec; 6] = eight_slice([18, 35, 35, 71, 71, 141]);
const B200_180: [ProfileSpec; 6] = eight_slice([23, 45, 45, 90, 90, 180]);
const GB200_186: [ProfileSpec; 6] = eight_slice([23, 47, 47, 93, 93, 186]);
const B300_288: [ProfileSpec; 6] = eight_slice([34, 67, 67, 135, 135, 269]);
const GB300_288: [ProfileSpec; 6] = eight_slice([35, 70, 70, 139, 139, 278]);

/// The four-slice family (A30, RTX PRO 6000): 1g, 2g, 4g.
const fn four_slice(mem: [u32; 3]) -> [ProfileSpec; 3] {
    [
        p(1, 1, mem[0], NVML_1, 14, S1_FOUR),
        p(2, 2, mem[1], NVML_2, 5, S2_FOUR),
        p(4, 4, mem[2], NVML_4, 0, S0),
    ]
}

const A30_24: [ProfileSpec; 3] = four_slice([6, 12, 24]);
const A30_VARIANTS: [VariantSpec; 2] = [
    v(Shape::new(1, 1), VariantKind::Me, NVML_1_REV1, None, 1),
    v(Shape::new(2, 2), VariantKind::Me, NVML_2_REV1, None, 1),
];
const RTX_PRO_6000_96: [ProfileSpec; 3] = four_slice([24, 48, 96]);
const RTX_PRO_6000_VARIANTS: [VariantSpec; 8] = [
    v(Shape::new(1, 1), VariantKind::Me, NVML_1_REV1, Some(21), 1),
    v(Shape::new(1, 1), VariantKind::Gfx, NVML_1_GFX, Some(47), 4),
    v(
        Shape::new(1, 1),
        VariantKind::MeAll,
        NVML_1_ALL_ME,
        Some(65),
        1,
    ),
    v(
        Shape::new(1, 1),
        VariantKind::NoMe,
        NVML_1_NO_ME,
        Some(67),
        4,
    ),
    v(Shape::new(2, 2), VariantKind::Gfx, NVML_2_GFX, Some(35), 2),
    v(
        Shape::new(2, 2),
        VariantKind::MeAll,
        NVML_2_ALL_ME,
        Some(64),
        1,
    ),
    v(
        Shape::new(2, 2),
        VariantKind::NoMe,
        NVML_2_NO_ME,
        Some(66),
        2,
    ),
    v(Shape::new(4, 4), VariantKind::Gfx, NVML_4_GFX, Some(32), 1),
];

/// The two-slice RTX PRO 5000 (R610 edition of the guide): 1g, 2g. The
/// profile ids follow the other models' memory-fraction pattern (half the
/// memory: 5, all of it: 0); no source lists them.
const RTX_PRO_5000_48: [ProfileSpec; 2] =
    [p(1, 1, 24, NVML_1, 5, S1_TWO), p(2, 2, 48, NVML_2, 0, S0)];
const RTX_PRO_5000_VARIANTS: [VariantSpec; 5] = [
    v(Shape::new(1, 1), VariantKind::Me, NVML_1_REV1, None, 1),
    v(Shape::new(1, 1), VariantKind::Gfx, NVML_1_GFX, None, 2),
    v(Shape::new(1, 1), VariantKind::MeAll, NVML_1_ALL_ME, None, 1),
    v(Shape::new(1, 1), VariantKind::NoMe, NVML_1_NO_ME, None, 2),
    v(Shape::new(2, 2), VariantKind::Gfx, NVML_2_GFX, None, 1),
];

const GUIDE: &str = "NVIDIA MIG User Guide, \"Supported MIG Profiles\"";
const GUIDE_IDS: &str = "NVIDIA MIG User Guide (`nvidia-smi mig -lgip` examples: 19/15/14/9/5/0; 14/5/0 on the A30); H200 read on hardware (driver 580.159.04)";
const GUIDE_PLACEMENTS: &str = "NVIDIA MIG User Guide (placement figures and `nvidia-smi mig -lgipp` example); H200 read on hardware (driver 580.159.04)";
const HOPPER_IDS: &str = "Hopper's ids (19/15/14/9/5/0) assumed: NVIDIA's go-nvml mock and mig-parted use the same NVML profile indices; no NVIDIA page lists this model's ids";
const HOPPER_PLACEMENTS: &str = "Hopper's starts, from the guide's memory fractions and instances per GPU (the guide's placement figure is an image)";

const NVIDIA_SOURCES: Sources = Sources {
    profiles: Provenance::Nvidia(GUIDE),
    ids: Provenance::Nvidia(GUIDE_IDS),
    placements: Provenance::Nvidia(GUIDE_PLACEMENTS),
};

/// All supported models, in [`GpuModel`] order.
pub static MODELS: [ModelSpec; 12] = [
    ModelSpec {
        model: GpuModel::A30_24gb,
        id: "a30-24gb",
        display: "A30-24GB",
        memory_slices: 4,
        compute_slices: 4,
        memory_gb: 24,
        nvml_names: &["A30"],
        profiles: &A30_24,
        variants: &A30_VARIANTS,
        sources: NVIDIA_SOURCES,
        mig_mode_needs_reset: true,
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
        variants: &EIGHT_SLICE_ME,
        sources: NVIDIA_SOURCES,
        mig_mode_needs_reset: true,
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
        variants: &EIGHT_SLICE_ME,
        sources: NVIDIA_SOURCES,
        mig_mode_needs_reset: true,
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
        variants: &EIGHT_SLICE_ME,
        sources: NVIDIA_SOURCES,
        mig_mode_needs_reset: false,
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
        variants: &EIGHT_SLICE_ME,
        sources: NVIDIA_SOURCES,
        mig_mode_needs_reset: false,
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
        variants: &EIGHT_SLICE_ME,
        sources: NVIDIA_SOURCES,
        mig_mode_needs_reset: false,
    },
    ModelSpec {
        model: GpuModel::B200_180gb,
        id: "b200-180gb",
        display: "B200-180GB",
        memory_slices: 8,
        compute_slices: 7,
        memory_gb: 180,
        nvml_names: &["B200"],
        profiles: &B200_180,
        variants: &EIGHT_SLICE_ME,
        sources: Sources {
            profiles: Provenance::Nvidia("NVIDIA MIG User Guide, \"B200 MIG Profiles\" (B200 180 GB: 1g.23gb x7, 1g.23gb+me x1, 1g.45gb x4, 2g.45gb x3, 3g.90gb x2, 4g.90gb x1, 7g.180gb x1)"),
            ids: Provenance::Inferred(HOPPER_IDS),
            placements: Provenance::Inferred(HOPPER_PLACEMENTS),
        },
        mig_mode_needs_reset: false,
    },
    ModelSpec {
        model: GpuModel::Gb200_186gb,
        id: "gb200-186gb",
        display: "GB200-186GB",
        memory_slices: 8,
        compute_slices: 7,
        memory_gb: 186,
        nvml_names: &["GB200"],
        profiles: &GB200_186,
        variants: &EIGHT_SLICE_ME,
        sources: Sources {
            profiles: Provenance::SecondHand("NVIDIA mig-parted `deployments/systemd/config-default.yaml`, \"GB200 HGX\" (PCI device 0x2941), corrected in Aug 2025 to the production boards' 1g.23gb, 1g.47gb, 2g.47gb, 3g.93gb, 4g.93gb, 7g.186gb; the MIG User Guide lists GB200 (186 GB, 7 instances) under \"Supported GPUs\" but has no profile table for it"),
            ids: Provenance::Inferred(HOPPER_IDS),
            placements: Provenance::Inferred("Hopper's starts, from mig-parted's instances per GPU (7, 4, 3, 2, 1, 1)"),
        },
        mig_mode_needs_reset: false,
    },
    ModelSpec {
        model: GpuModel::B300_288gb,
        id: "b300-288gb",
        display: "B300-288GB",
        memory_slices: 8,
        compute_slices: 7,
        memory_gb: 269,
        nvml_names: &["B300"],
        profiles: &B300_288,
        variants: &EIGHT_SLICE_ME,
        sources: Sources {
            profiles: Provenance::SecondHand("NVIDIA mig-parted config (PCI device 0x3182, added in mig-parted v0.13.0): 1g.34gb x7, 1g.34gb+me x1, 1g.67gb x4, 2g.67gb x3, 3g.135gb x2, 4g.135gb x1, 7g.269gb x1; not in the MIG User Guide"),
            ids: Provenance::Inferred(HOPPER_IDS),
            placements: Provenance::Inferred("Hopper's starts, from mig-parted's instances per GPU (7, 4, 3, 2, 1, 1)"),
        },
        mig_mode_needs_reset: false,
    },
    ModelSpec {
        model: GpuModel::Gb300_288gb,
        id: "gb300-288gb",
        display: "GB300-288GB",
        memory_slices: 8,
        compute_slices: 7,
        memory_gb: 278,
        nvml_names: &["GB300"],
        profiles: &GB300_288,
        variants: &EIGHT_SLICE_ME,
        sources: Sources {
            profiles: Provenance::SecondHand("NVIDIA mig-parted config (PCI device 0x31C2, added in v0.13.0): 1g.35gb x7, 1g.70gb x4, 2g.70gb x3, 3g.139gb x2, 4g.139gb x1, 7g.278gb x1; a DGX Station GB300 guide names the same ids 1g.31gb, 3g.126gb, 4g.126gb, 7g.251gb on R61x drivers; not in the MIG User Guide"),
            ids: Provenance::SecondHand("a DGX Station GB300 guide's `nvidia-smi mig -lgip` listing: 19, 20 (+me), 15, 14, 9, 5, 0"),
            placements: Provenance::Inferred("Hopper's starts, from mig-parted's instances per GPU (7, 4, 3, 2, 1, 1)"),
        },
        mig_mode_needs_reset: false,
    },
    ModelSpec {
        model: GpuModel::RtxPro6000_96gb,
        id: "rtx-pro-6000-96gb",
        display: "RTX PRO 6000 Blackwell (96GB)",
        memory_slices: 4,
        compute_slices: 4,
        memory_gb: 96,
        nvml_names: &["RTX PRO 6000 Blackwell"],
        profiles: &RTX_PRO_6000_96,
        variants: &RTX_PRO_6000_VARIANTS,
        sources: Sources {
            profiles: Provenance::Nvidia("NVIDIA MIG User Guide, \"RTX PRO 6000 Blackwell MIG Profiles\" (Workstation, Max-Q Workstation and Server Edition, 96 GB: 1g.24gb x4, 2g.48gb x2, 4g.96gb x1, with +me, +gfx, +me.all, -me variants)"),
            ids: Provenance::SecondHand("an `nvidia-smi mig -lgip` listing published for the RTX PRO 6000 Blackwell: 14, 5, 0 (variants 21, 47, 65, 67, 35, 64, 66, 32)"),
            placements: Provenance::Inferred("the A30's four-slice starts, from the guide's fractions (1/4, 1/2, full) and instances per GPU (4, 2, 1)"),
        },
        mig_mode_needs_reset: false,
    },
    ModelSpec {
        model: GpuModel::RtxPro5000_48gb,
        id: "rtx-pro-5000-48gb",
        display: "RTX PRO 5000 Blackwell (48GB)",
        memory_slices: 2,
        compute_slices: 2,
        memory_gb: 48,
        nvml_names: &["RTX PRO 5000 Blackwell"],
        profiles: &RTX_PRO_5000_48,
        variants: &RTX_PRO_5000_VARIANTS,
        sources: Sources {
            profiles: Provenance::Nvidia("NVIDIA MIG User Guide, R610 edition, \"RTX PRO 5000 Blackwell MIG Profiles\" (48 GB: 1g.24gb x2, 2g.48gb x1, with +me, +gfx, +me.all, -me variants; \"Supported GPUs\": 2 instances); the R580 edition printed a four-slice table instead (1g.12gb ... 4g.48gb)"),
            ids: Provenance::Inferred("5 and 0, the memory-fraction pattern of the other models (half the memory: 5, all: 0); no source lists them"),
            placements: Provenance::Inferred("1g at slots 0 and 1, 2g at 0, from the guide's fractions (1/2, full) and instances per GPU (2, 1)"),
        },
        mig_mode_needs_reset: false,
    },
];

/// NVML device names that contain a supported model's pattern but are
/// another product: a GH200's name contains `H200`, yet its H100 (96 or
/// 144 GB) has other profile sizes.
const NOT_SUPPORTED_NAMES: &[&str] = &["GH200"];

impl GpuModel {
    /// Every supported model, in table order.
    pub const ALL: [GpuModel; 12] = [
        GpuModel::A30_24gb,
        GpuModel::A100_40gb,
        GpuModel::A100_80gb,
        GpuModel::H100_80gb,
        GpuModel::H100_94gb,
        GpuModel::H200_141gb,
        GpuModel::B200_180gb,
        GpuModel::Gb200_186gb,
        GpuModel::B300_288gb,
        GpuModel::Gb300_288gb,
        GpuModel::RtxPro6000_96gb,
        GpuModel::RtxPro5000_48gb,
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

    /// Recognises an NVML device name such as `NVIDIA A100-SXM4-40GB`: the
    /// model with the longest pattern the name contains (`NVIDIA GB200`
    /// contains both `B200` and `GB200`). The name only picks the row; the
    /// NVML backend then matches the driver's profiles with it.
    pub fn from_nvml_name(name: &str) -> Option<GpuModel> {
        let upper = name.to_ascii_uppercase();
        if NOT_SUPPORTED_NAMES.iter().any(|n| upper.contains(n)) {
            return None;
        }
        MODELS
            .iter()
            .flat_map(|m| m.nvml_names.iter().map(move |n| (n.len(), m.model, n)))
            .filter(|(_, _, n)| upper.contains(&n.to_ascii_uppercase()))
            .max_by_key(|&(len, _, _)| len)
            .map(|(_, model, _)| model)
    }

    /// The id without its memory size: `b200` for `b200-180gb`, accepted on
    /// the command line when it names one model.
    pub fn family(self) -> &'static str {
        let id = self.id();
        match id.rsplit_once('-') {
            Some((family, size)) if size.ends_with("gb") => family,
            _ => id,
        }
    }
}

impl fmt::Display for GpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// Error for an unknown GPU model name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown GPU model `{given}` (say one of: {known})")]
pub struct UnknownModel {
    pub given: String,
    pub known: String,
}

impl FromStr for GpuModel {
    type Err = UnknownModel;

    /// Accepts the ids (`a100-40gb`), case-insensitively, with `_` for `-`,
    /// and a family without its size when it names one model (`b200`,
    /// `rtx-pro-6000`; not `a100`, which has two).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_lowercase().replace('_', "-");
        if let Some(m) = MODELS.iter().find(|m| m.id == norm) {
            return Ok(m.model);
        }
        let family: Vec<GpuModel> = GpuModel::ALL
            .into_iter()
            .filter(|m| m.family() == norm)
            .collect();
        let known: Vec<&str> = match family.as_slice() {
            [one] => return Ok(*one),
            [] => MODELS.iter().map(|m| m.id).collect(),
            several => several.iter().map(|m| m.id()).collect(),
        };
        Err(UnknownModel {
            given: s.to_string(),
            known: known.join(", "),
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

    /// The profile a job whose memory needs `profile` is built and billed
    /// (issue 55): the smallest-memory profile of the smallest compute
    /// size, at least `profile`'s, whose memory slices hold `profile`'s.
    /// Slurm counts compute shards, so a memory variant (`1g.10gb` on an
    /// A100-40GB: one compute slice, two memory slices) would let Slurm
    /// offer a shard whose memory is gone; billed and built as the
    /// default profile of the room it takes (`2g.10gb`), every instance
    /// blocks exactly the shards it is billed and the holds' offer
    /// ([`crate::Geometry::offer`]) stays true. A default profile is its
    /// own room.
    pub fn room_profile(&self, profile: &'static ProfileSpec) -> &'static ProfileSpec {
        self.room_of(profile).unwrap_or(profile)
    }

    /// The shards `profile` blocks: its [`ModelSpec::room_profile`]'s
    /// compute slices (`1g.10gb` on an A100-40GB: 2).
    pub fn room_shards(&self, profile: &ProfileSpec) -> u8 {
        self.room_of(profile)
            .map_or(profile.shape.compute, |q| q.shape.compute)
    }

    /// The default profile whose room `profile` takes ([`ModelSpec::room_profile`]);
    /// `None` only for a profile of another model.
    fn room_of(&self, profile: &ProfileSpec) -> Option<&'static ProfileSpec> {
        self.profiles
            .iter()
            .filter(|q| q.shape.compute >= profile.shape.compute)
            .filter(|q| q.shape.memory >= profile.shape.memory)
            .filter(|q| self.is_default(q))
            .min_by_key(|q| (q.shape.compute, q.shape.memory))
    }

    /// Whether `p` is the smallest-memory profile of its compute size (the
    /// one `--gres=shard:K` alone gets).
    pub fn is_default(&self, p: &ProfileSpec) -> bool {
        self.profiles
            .iter()
            .filter(|q| q.shape.compute == p.shape.compute)
            .all(|q| q.shape.memory >= p.shape.memory)
    }

    /// The variant `kind` of the profile with shape `base`, if the model has it.
    pub fn variant(&self, base: Shape, kind: VariantKind) -> Option<&'static VariantSpec> {
        self.variants
            .iter()
            .find(|v| v.base == base && v.kind == kind)
    }

    /// A variant's name, e.g. `1g.24gb+gfx`.
    pub fn variant_name(&self, v: &VariantSpec) -> String {
        let base = self
            .profile(v.base)
            .map_or_else(|| format!("{}g", v.base.compute), ProfileSpec::name);
        format!("{base}{}", v.kind.suffix())
    }

    /// Whether every figure of the row is confirmed by NVIDIA's pages.
    pub fn confirmed(&self) -> bool {
        let s = self.sources;
        s.profiles.confirmed() && s.ids.confirmed() && s.placements.confirmed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_variant_is_billed_and_built_as_the_default_profile_of_its_room() {
        let a100 = GpuModel::A100_40gb.spec();
        let by = |n: &str| a100.profiles.iter().find(|p| p.name() == n).unwrap();
        assert_eq!(a100.room_profile(by("1g.10gb")).name(), "2g.10gb");
        assert_eq!(a100.room_shards(by("1g.10gb")), 2);
        for n in ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"] {
            assert_eq!(a100.room_profile(by(n)).name(), n);
        }
        // On every model: a default profile is its own room; a variant's
        // room has at least its compute and memory, and the variant can
        // start wherever its room can (so the holds' offer, counted in
        // default profiles, covers it).
        for m in GpuModel::ALL {
            let spec = m.spec();
            for p in spec.profiles {
                let r = spec.room_profile(p);
                assert!(spec.is_default(r), "{m:?} {}", p.name());
                if spec.is_default(p) {
                    assert_eq!(r.shape, p.shape, "{m:?}");
                    continue;
                }
                assert!(r.shape.compute >= p.shape.compute && r.shape.memory >= p.shape.memory);
                for s in r.starts {
                    assert!(
                        p.starts.contains(s),
                        "{m:?}: {} cannot start at {s} where {} can",
                        p.name(),
                        r.name()
                    );
                }
            }
        }
    }

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
            assert_eq!(GpuModel::ALL[i], m.model);
            assert_eq!(m.model.id().parse::<GpuModel>().unwrap(), m.model);
            let json = serde_json::to_string(&m.model).unwrap();
            assert_eq!(json, format!("\"{}\"", m.id));
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
                assert!(
                    p.starts.windows(2).all(|w| w[0] < w[1]),
                    "{} {}: starts must ascend (the NVML match compares sorted lists)",
                    m.id,
                    p.name()
                );
            }
            assert_eq!(m.full_profile().memory_gb, m.memory_gb);
            assert_eq!(
                m.full_profile().shape,
                Shape::new(m.compute_slices, m.memory_slices),
                "{}",
                m.id
            );
        }
    }

    /// Ids and NVML indices are unique per model, default profiles and
    /// variants together, and every variant varies a profile of its model.
    #[test]
    fn ids_and_indices_are_unique_and_variants_have_a_base() {
        for m in &MODELS {
            let mut indices: Vec<u32> = m.profiles.iter().map(|p| p.nvml_profile).collect();
            indices.extend(m.variants.iter().map(|v| v.nvml_profile));
            let mut ids: Vec<u32> = m.profiles.iter().map(|p| p.smi_id).collect();
            ids.extend(m.variants.iter().filter_map(|v| v.smi_id));
            for list in [&mut indices, &mut ids] {
                let n = list.len();
                list.sort_unstable();
                list.dedup();
                assert_eq!(list.len(), n, "{}: a repeated id or index", m.id);
            }
            for p in m.profiles {
                assert!(NVML_DEFAULT_INDICES.contains(&p.nvml_profile), "{}", m.id);
            }
            for v in m.variants {
                assert!(
                    m.profile(v.base).is_some(),
                    "{} variant of {:?}",
                    m.id,
                    v.base
                );
                assert!(!NVML_DEFAULT_INDICES.contains(&v.nvml_profile));
                assert!(v.nvml_profile < NVML_PROFILE_COUNT);
                assert!(v.max_instances >= 1);
            }
        }
    }

    #[test]
    fn shards_per_gpu_are_seven_four_or_two() {
        let shards: Vec<(&str, u8)> = MODELS.iter().map(|m| (m.id, m.compute_slices)).collect();
        for (id, n) in &shards {
            assert!([7, 4, 2].contains(n), "{id}: {n}");
        }
        assert_eq!(GpuModel::B200_180gb.spec().compute_slices, 7);
        assert_eq!(GpuModel::RtxPro6000_96gb.spec().compute_slices, 4);
        assert_eq!(GpuModel::RtxPro5000_48gb.spec().compute_slices, 2);
    }

    #[test]
    fn nvml_names_resolve() {
        let cases = [
            ("NVIDIA A100-SXM4-40GB", Some(GpuModel::A100_40gb)),
            ("NVIDIA H100 80GB HBM3", Some(GpuModel::H100_80gb)),
            ("NVIDIA H100 NVL", Some(GpuModel::H100_94gb)),
            ("NVIDIA A30", Some(GpuModel::A30_24gb)),
            ("NVIDIA H200", Some(GpuModel::H200_141gb)),
            ("NVIDIA B200", Some(GpuModel::B200_180gb)),
            ("NVIDIA GB200", Some(GpuModel::Gb200_186gb)),
            ("NVIDIA B300 SXM6 AC", Some(GpuModel::B300_288gb)),
            ("NVIDIA GB300", Some(GpuModel::Gb300_288gb)),
            (
                "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                Some(GpuModel::RtxPro6000_96gb),
            ),
            (
                "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
                Some(GpuModel::RtxPro6000_96gb),
            ),
            (
                "NVIDIA RTX PRO 5000 Blackwell",
                Some(GpuModel::RtxPro5000_48gb),
            ),
            // Not ours: the GH200's H100 has other sizes; Ada has no MIG.
            ("NVIDIA GH200 480GB", None),
            ("NVIDIA RTX 6000 Ada Generation", None),
            ("Tesla V100", None),
        ];
        for (name, want) in cases {
            assert_eq!(GpuModel::from_nvml_name(name), want, "{name}");
        }
    }

    #[test]
    fn families_name_one_model_or_none() {
        for (given, want) in [
            ("b200", Some(GpuModel::B200_180gb)),
            ("GB300", Some(GpuModel::Gb300_288gb)),
            ("rtx-pro-6000", Some(GpuModel::RtxPro6000_96gb)),
            ("rtx_pro_5000", Some(GpuModel::RtxPro5000_48gb)),
            ("h200", Some(GpuModel::H200_141gb)),
            ("a30", Some(GpuModel::A30_24gb)),
            ("a100", None),
            ("h100", None),
        ] {
            assert_eq!(given.parse::<GpuModel>().ok(), want, "{given}");
        }
    }

    #[test]
    fn unknown_model_names_the_known_ones() {
        let err = "v100".parse::<GpuModel>().unwrap_err();
        assert!(err.to_string().contains("a100-40gb"));
        assert!(err.to_string().contains("rtx-pro-6000-96gb"));
    }

    #[test]
    fn variant_names_and_suffixes() {
        let rtx = GpuModel::RtxPro6000_96gb.spec();
        let names: Vec<String> = rtx.variants.iter().map(|v| rtx.variant_name(v)).collect();
        assert!(names.contains(&"1g.24gb+me.all".to_string()), "{names:?}");
        assert!(names.contains(&"4g.96gb+gfx".to_string()), "{names:?}");
        assert_eq!(
            VariantKind::of_name("1g.24gb+me.all"),
            Some(VariantKind::MeAll)
        );
        assert_eq!(
            VariantKind::of_name("MIG 1g.24gb-me"),
            Some(VariantKind::NoMe)
        );
        assert_eq!(VariantKind::of_name("1g.10gb+me"), Some(VariantKind::Me));
        assert_eq!(VariantKind::of_name("2g.48gb+gfx"), Some(VariantKind::Gfx));
        assert_eq!(VariantKind::of_name("3g.40gb"), None);
    }

    /// The six models checked before Blackwell are confirmed; every newer
    /// row marks what NVIDIA's pages do not say.
    #[test]
    fn unconfirmed_rows_say_so() {
        for m in &MODELS[..6] {
            assert!(m.confirmed(), "{}", m.id);
        }
        for m in &MODELS[6..] {
            assert!(!m.confirmed(), "{}", m.id);
            for p in [m.sources.profiles, m.sources.ids, m.sources.placements] {
                assert!(!p.text().is_empty());
            }
        }
    }
}
