//! What a driver says about a GPU's profiles, matched with the table.
//!
//! The NVML backend (and `smartmig doctor`) ask the driver, for every
//! `NVML_GPU_INSTANCE_PROFILE_*` index, the profile it has there: its id,
//! compute slices, memory and name (`nvmlDeviceGetGpuInstanceProfileInfoV`)
//! and its possible placements. [`match_driver`] compares that list with
//! the model's row of [`super::models::MODELS`] by index, id and slices,
//! never by name:
//!
//! - a default profile of the table must be at its index with the table's
//!   id, compute slices and placements (start and memory slices): anything
//!   else is a [`Difference`], and a GPU with a difference is not managed;
//! - the name and memory are the driver's: a driver that renames a profile
//!   (GB300's `3g.139gb` is `3g.126gb` on R61x drivers) matches, and the
//!   name shown is the driver's;
//! - profiles at variant indices (`+me`, `-me`, `+gfx`, `+me.all`) are
//!   listed, never scheduled; a default index the table lacks is a
//!   difference (the geometry is not the one the table describes).
//!
//! Pure: the callers do the NVML calls.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::models::{GpuModel, ProfileSpec, VariantSpec, NVML_DEFAULT_INDICES, NVML_PROFILE_COUNT};

/// One GPU-instance profile as the driver reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverProfile {
    /// The `NVML_GPU_INSTANCE_PROFILE_*` index it was asked at.
    pub index: u32,
    /// `nvmlGpuInstanceProfileInfo_t.id` (`nvidia-smi mig -lgip`).
    pub id: u32,
    /// `sliceCount`: compute slices.
    pub slices: u32,
    /// `memorySizeMB` (MiB).
    pub memory_mib: u64,
    /// `instanceCount`: how many instances of it one GPU holds.
    pub instance_count: u32,
    /// The driver's name without `MIG ` (`1g.10gb`), when the driver has
    /// the versioned call that returns it.
    pub name: Option<String>,
    /// Possible placements as (start, memory slices), in the driver's
    /// order; `Err`: why the driver could not be asked.
    pub placements: Result<Vec<(u32, u32)>, String>,
}

impl DriverProfile {
    /// The name NVML gives, or `index N` when it gave none.
    pub fn label(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("profile index {}", self.index))
    }
}

/// Strips NVML's `MIG ` prefix from a profile name (`MIG 1g.10gb` -> `1g.10gb`).
pub fn driver_name(raw: &str) -> String {
    let t = raw.trim();
    t.strip_prefix("MIG ").unwrap_or(t).trim().to_string()
}

/// A way the driver's profiles differ from the table: the GPU is not
/// managed while one exists.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Difference {
    /// The table's profile is not offered at its index.
    Missing { profile: String, index: u32 },
    /// Another profile id at the table profile's index.
    Id {
        profile: String,
        table: u32,
        driver: u32,
    },
    /// Another number of compute slices.
    Slices {
        profile: String,
        table: u8,
        driver: u32,
    },
    /// Other possible placements (start + memory slices).
    Placements {
        profile: String,
        table: Vec<(u32, u32)>,
        driver: Vec<(u32, u32)>,
    },
    /// The driver would not say where the profile can go.
    Unreadable { profile: String, reason: String },
    /// A default profile the table does not have.
    Extra {
        index: u32,
        id: u32,
        slices: u32,
        name: String,
    },
}

fn places(list: &[(u32, u32)]) -> String {
    let items: Vec<String> = list.iter().map(|(s, n)| format!("{s}+{n}")).collect();
    format!("[{}]", items.join(" "))
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Difference::Missing { profile, index } => {
                write!(f, "{profile}: the driver offers no profile at NVML index {index}")
            }
            Difference::Id {
                profile,
                table,
                driver,
            } => write!(f, "{profile}: driver id {driver}, table id {table}"),
            Difference::Slices {
                profile,
                table,
                driver,
            } => write!(
                f,
                "{profile}: driver {driver} compute slices, table {table}"
            ),
            Difference::Placements {
                profile,
                table,
                driver,
            } => write!(
                f,
                "{profile}: driver placements {}, table {}",
                places(driver),
                places(table)
            ),
            Difference::Unreadable { profile, reason } => {
                write!(f, "{profile}: placements not readable ({reason})")
            }
            Difference::Extra {
                index,
                id,
                slices,
                name,
            } => write!(
                f,
                "{name} (id {id}, {slices} compute slices, NVML index {index}): a profile the table lacks"
            ),
        }
    }
}

/// A table profile the driver has, as the driver has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matched {
    pub spec: &'static ProfileSpec,
    pub driver: DriverProfile,
}

impl Matched {
    /// The name to show: the driver's, else the table's.
    pub fn name(&self) -> String {
        self.driver.name.clone().unwrap_or_else(|| self.spec.name())
    }

    /// Whether the driver names it otherwise than the table.
    pub fn renamed(&self) -> bool {
        self.driver
            .name
            .as_ref()
            .is_some_and(|n| !n.eq_ignore_ascii_case(&self.spec.name()))
    }
}

/// A driver profile at a variant index: listed, never scheduled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverVariant {
    pub driver: DriverProfile,
    /// The table's entry for it, if the table has one.
    pub spec: Option<&'static VariantSpec>,
}

/// The driver's profiles against the table, for one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverMatch {
    pub model: GpuModel,
    /// The table's default profiles the driver has as the table says.
    pub profiles: Vec<Matched>,
    pub variants: Vec<DriverVariant>,
    pub differences: Vec<Difference>,
    /// Facts worth reporting that do not stop smartmig (a renamed profile,
    /// a variant id the table lists otherwise).
    pub notes: Vec<String>,
}

impl DriverMatch {
    /// Whether the GPU may be managed: no difference.
    pub fn agrees(&self) -> bool {
        self.differences.is_empty()
    }

    /// The matched profile of `spec`.
    pub fn matched(&self, spec: &ProfileSpec) -> Option<&Matched> {
        self.profiles.iter().find(|m| m.spec.shape == spec.shape)
    }

    /// The differences as one line.
    pub fn differences_text(&self) -> String {
        let items: Vec<String> = self.differences.iter().map(ToString::to_string).collect();
        items.join("; ")
    }
}

/// The table's placements of `p`: (start, memory slices), in start order.
pub fn table_placements(p: &ProfileSpec) -> Vec<(u32, u32)> {
    p.starts
        .iter()
        .map(|&s| (u32::from(s), u32::from(p.shape.memory)))
        .collect()
}

/// One table profile against the driver's entry at its index.
fn match_profile(
    spec: &'static ProfileSpec,
    driver: Option<&DriverProfile>,
) -> Result<Matched, Difference> {
    let profile = spec.name();
    let d = driver.ok_or_else(|| Difference::Missing {
        profile: profile.clone(),
        index: spec.nvml_profile,
    })?;
    if d.id != spec.smi_id {
        return Err(Difference::Id {
            profile,
            table: spec.smi_id,
            driver: d.id,
        });
    }
    if d.slices != u32::from(spec.shape.compute) {
        return Err(Difference::Slices {
            profile,
            table: spec.shape.compute,
            driver: d.slices,
        });
    }
    let driver_places = match &d.placements {
        Ok(list) => {
            let mut sorted = list.clone();
            sorted.sort_unstable();
            sorted
        }
        Err(reason) => {
            return Err(Difference::Unreadable {
                profile,
                reason: reason.clone(),
            })
        }
    };
    let table = table_placements(spec);
    if driver_places != table {
        return Err(Difference::Placements {
            profile,
            table,
            driver: driver_places,
        });
    }
    Ok(Matched {
        spec,
        driver: d.clone(),
    })
}

/// Matches the driver's profiles (`driver`, any order, one per index it
/// answered) with `model`'s row of the table. See the module docs.
pub fn match_driver(model: GpuModel, driver: &[DriverProfile]) -> DriverMatch {
    let spec = model.spec();
    let at = |index: u32| driver.iter().find(|d| d.index == index);
    let mut out = DriverMatch {
        model,
        profiles: Vec::new(),
        variants: Vec::new(),
        differences: Vec::new(),
        notes: Vec::new(),
    };
    for p in spec.profiles {
        match match_profile(p, at(p.nvml_profile)) {
            Ok(m) => {
                if m.renamed() {
                    out.notes.push(format!(
                        "{} (id {}) is named {} by this driver ({:.2} GiB); smartmig shows the driver's name",
                        p.name(),
                        p.smi_id,
                        m.name(),
                        m.driver.memory_mib as f64 / 1024.0
                    ));
                }
                out.profiles.push(m);
            }
            Err(d) => out.differences.push(d),
        }
    }
    let mut rest: Vec<&DriverProfile> = driver
        .iter()
        .filter(|d| d.index < NVML_PROFILE_COUNT)
        .filter(|d| !spec.profiles.iter().any(|p| p.nvml_profile == d.index))
        .collect();
    rest.sort_by_key(|d| d.index);
    for d in rest {
        if NVML_DEFAULT_INDICES.contains(&d.index) {
            out.differences.push(Difference::Extra {
                index: d.index,
                id: d.id,
                slices: d.slices,
                name: d.label(),
            });
            continue;
        }
        let known = spec.variants.iter().find(|v| v.nvml_profile == d.index);
        if let Some(v) = known {
            if v.smi_id.is_some_and(|id| id != d.id) {
                out.notes.push(format!(
                    "{}: driver id {}, table id {} (a variant: never scheduled)",
                    spec.variant_name(v),
                    d.id,
                    v.smi_id.unwrap_or_default()
                ));
            }
        } else {
            out.notes.push(format!(
                "{} (id {}, NVML index {}): a variant the table does not list (never scheduled)",
                d.label(),
                d.id,
                d.index
            ));
        }
        out.variants.push(DriverVariant {
            driver: d.clone(),
            spec: known,
        });
    }
    out
}

/// What a driver that agrees with the table reports for `model`: one entry
/// per default profile and per variant whose id the table knows, with the
/// table's names and `memory_mib(p)` as memory. The NVML emulator serves
/// this list (then changes it where a test asks), and tests compare with it.
pub fn table_driver_profiles(
    model: GpuModel,
    memory_mib: impl Fn(u32) -> u64,
) -> Vec<DriverProfile> {
    let spec = model.spec();
    let mut out: Vec<DriverProfile> = spec
        .profiles
        .iter()
        .map(|p| DriverProfile {
            index: p.nvml_profile,
            id: p.smi_id,
            slices: u32::from(p.shape.compute),
            memory_mib: memory_mib(p.memory_gb),
            instance_count: p.starts.len() as u32,
            name: Some(p.name()),
            placements: Ok(table_placements(p)),
        })
        .collect();
    for v in spec.variants {
        let (Some(id), Some(base)) = (v.smi_id, spec.profile(v.base)) else {
            continue;
        };
        out.push(DriverProfile {
            index: v.nvml_profile,
            id,
            slices: u32::from(base.shape.compute),
            memory_mib: memory_mib(base.memory_gb),
            instance_count: u32::from(v.max_instances),
            name: Some(spec.variant_name(v)),
            placements: Ok(table_placements(base)),
        });
    }
    out.sort_by_key(|d| d.index);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::NVML_1_GFX;

    fn mib(gb: u32) -> u64 {
        u64::from(gb) * 1000
    }

    #[test]
    fn the_table_matches_itself_for_every_model() {
        for model in GpuModel::ALL {
            let m = match_driver(model, &table_driver_profiles(model, mib));
            assert!(m.agrees(), "{model}: {}", m.differences_text());
            assert_eq!(m.profiles.len(), model.spec().profiles.len());
            assert!(m.notes.is_empty(), "{model}: {:?}", m.notes);
            assert!(m.profiles.iter().all(|p| !p.renamed()));
        }
    }

    /// GB300 on an R61x driver: the same ids and slices under other names
    /// and sizes still match; the driver's name is the one shown.
    #[test]
    fn a_renamed_profile_matches_by_id_and_slices() {
        let model = GpuModel::Gb300_288gb;
        let mut driver = table_driver_profiles(model, mib);
        let three = driver.iter_mut().find(|d| d.id == 9).unwrap();
        three.name = Some("3g.126gb".into());
        three.memory_mib = 126 * 1024;
        let m = match_driver(model, &driver);
        assert!(m.agrees(), "{}", m.differences_text());
        let spec = model
            .spec()
            .profiles
            .iter()
            .find(|p| p.smi_id == 9)
            .unwrap();
        let got = m.matched(spec).unwrap();
        assert!(got.renamed());
        assert_eq!(got.name(), "3g.126gb");
        assert_eq!(spec.name(), "3g.139gb");
        assert!(
            m.notes[0].contains("3g.139gb (id 9) is named 3g.126gb"),
            "{:?}",
            m.notes
        );
    }

    #[test]
    fn every_kind_of_difference_is_named() {
        let model = GpuModel::B200_180gb;
        let base = table_driver_profiles(model, mib);
        let with = |f: &dyn Fn(&mut Vec<DriverProfile>)| {
            let mut d = base.clone();
            f(&mut d);
            let m = match_driver(model, &d);
            assert!(!m.agrees());
            m.differences_text()
        };
        let t = with(&|d| d.retain(|p| p.id != 5));
        assert!(
            t.contains("4g.90gb: the driver offers no profile at NVML index 3"),
            "{t}"
        );
        let t = with(&|d| d.iter_mut().find(|p| p.id == 9).unwrap().id = 10);
        assert!(t.contains("3g.90gb: driver id 10, table id 9"), "{t}");
        let t = with(&|d| d.iter_mut().find(|p| p.id == 14).unwrap().slices = 3);
        assert!(
            t.contains("2g.45gb: driver 3 compute slices, table 2"),
            "{t}"
        );
        let t = with(&|d| {
            d.iter_mut().find(|p| p.id == 9).unwrap().placements = Ok(vec![(0, 4)]);
        });
        assert!(
            t.contains("3g.90gb: driver placements [0+4], table [0+4 4+4]"),
            "{t}"
        );
        let t = with(&|d| {
            d.iter_mut().find(|p| p.id == 0).unwrap().placements = Err("NOT_SUPPORTED".into());
        });
        assert!(
            t.contains("7g.180gb: placements not readable (NOT_SUPPORTED)"),
            "{t}"
        );
        // An 8-slice profile (NVML index 5) is a geometry the table lacks.
        let t = with(&|d| {
            d.push(DriverProfile {
                index: 5,
                id: 50,
                slices: 8,
                memory_mib: 1,
                instance_count: 1,
                name: Some("8g.180gb".into()),
                placements: Ok(vec![(0, 8)]),
            });
        });
        assert!(
            t.contains("8g.180gb (id 50, 8 compute slices, NVML index 5)"),
            "{t}"
        );
    }

    #[test]
    fn variants_are_listed_and_unknown_ones_noted() {
        let model = GpuModel::RtxPro6000_96gb;
        let driver = table_driver_profiles(model, mib);
        let m = match_driver(model, &driver);
        assert!(m.agrees());
        assert_eq!(m.variants.len(), 8);
        // A B200 whose driver also offers a +gfx 1g: noted, not a difference.
        let mut b200 = table_driver_profiles(GpuModel::B200_180gb, mib);
        b200.push(DriverProfile {
            index: NVML_1_GFX,
            id: 47,
            slices: 1,
            memory_mib: 1,
            instance_count: 4,
            name: Some("1g.23gb+gfx".into()),
            placements: Ok(vec![(0, 1)]),
        });
        let m = match_driver(GpuModel::B200_180gb, &b200);
        assert!(m.agrees());
        assert!(
            m.notes[0].contains("1g.23gb+gfx (id 47, NVML index 10)"),
            "{:?}",
            m.notes
        );
    }

    #[test]
    fn names_lose_the_mig_prefix() {
        assert_eq!(driver_name("MIG 1g.10gb"), "1g.10gb");
        assert_eq!(driver_name(" 3g.126gb "), "3g.126gb");
    }
}
