//! Profile names in, profiles out: parsing the names drivers and Slurm print,
//! and choosing the profile for a request of K compute slices and M GB.
//!
//! Names drift (`3g.40gb` on one driver is `3g.39gb` on another, Slurm
//! prefixes them with the GPU name: `nvidia_a100_3g.20gb`), so a name is only
//! a way to find a [`Shape`]; the rest of the code keys on shapes.

use super::models::{ModelSpec, ProfileSpec, VariantKind};

/// Why a profile name could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileParseError {
    #[error("empty profile name")]
    Empty,
    #[error("`{0}` does not contain a MIG profile of the form `<N>g.<M>gb` (e.g. `3g.20gb`)")]
    NoProfile(String),
    #[error(
        "`{given}`: {model} has no profile with {compute} compute slices (it has {available})"
    )]
    UnknownCompute {
        given: String,
        model: &'static str,
        compute: u8,
        available: String,
    },
    #[error("`{given}`: {model} has no {compute}g profile with about {memory_gb} GB (it has {available})")]
    UnknownMemory {
        given: String,
        model: &'static str,
        compute: u8,
        memory_gb: u32,
        available: String,
    },
}

/// Why no profile can serve a request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SelectError {
    #[error("a request needs at least one compute slice")]
    ZeroSlices,
    #[error("{requested} compute slices requested but a {model} has only {available}")]
    TooManySlices {
        requested: u8,
        available: u8,
        model: &'static str,
    },
    #[error("{memory_gb} GB of GPU memory requested with {requested} compute slices, but the largest {model} profile with at least that many slices has {largest_gb} GB")]
    MemoryTooLarge {
        requested: u8,
        memory_gb: f64,
        largest_gb: u32,
        model: &'static str,
    },
    #[error("memory need must be a finite, non-negative number of GB (got {0})")]
    BadMemory(f64),
}

/// Why a job's exact profile (`--mig-profile`) cannot be served on a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestedProfileError {
    #[error("--mig-profile={name}: {reason}")]
    Unknown {
        name: String,
        reason: ProfileParseError,
    },
    #[error(
        "--mig-profile={name} has {compute} compute slices but the job asked for \
         --gres=shard:{shards}; use --gres=shard:{billed}{}",
        room_text(name, room, *compute, *billed)
    )]
    ShardMismatch {
        name: String,
        compute: u8,
        shards: u8,
        /// The shards the profile is billed: its room's compute slices.
        billed: u8,
        /// The default profile whose room it takes (its own name when it
        /// is a default profile).
        room: String,
    },
    #[error(
        "--mig-profile={name} is a `{}` variant ({}); smartmig creates only the default \
         profiles: ask for --mig-profile={base} (docs/user-guide.md, \"Profile variants\")",
        kind.suffix(),
        variant_meaning(*kind)
    )]
    Variant {
        name: String,
        kind: VariantKind,
        base: String,
    },
}

/// Why a memory variant is billed more shards than its compute slices, or
/// nothing for a default profile (its room is itself).
fn room_text(name: &str, room: &str, compute: u8, billed: u8) -> String {
    if billed == compute {
        return String::new();
    }
    format!(
        " ({name}'s memory takes the room of a {room}, so it is billed shard:{billed}; \
         the job gets {name})"
    )
}

/// What a variant adds or removes, in a few words (the user guide has more).
pub fn variant_meaning(kind: VariantKind) -> &'static str {
    match kind {
        VariantKind::Me => "with media extensions: a video decoder, JPEG and OFA engine",
        VariantKind::NoMe => "without any media engine",
        VariantKind::Gfx => "with graphics APIs (OpenGL, Vulkan)",
        VariantKind::MeAll => "with every media engine of the GPU",
    }
}

/// The profile a job asked for by name (`--mig-profile`), on `model`, for a
/// job billed `shards` compute slices: the name must be one of the model's
/// default profiles (a `+me`, `-me`, `+gfx` or `+me.all` variant is
/// refused: smartmig never creates one) and the shards must be those it
/// blocks, its room's compute slices ([`ModelSpec::room_shards`]: Slurm
/// bills the shards, MIG builds the profile, issue 55). So `1g.10gb` on an
/// A100-40GB needs `--gres=shard:2` (job_submit.lua bills that), and a
/// step asking for it inside a `shard:1` allocation is refused: its memory
/// would take a shard Slurm still counts as free.
pub fn requested_profile(
    model: &'static ModelSpec,
    name: &str,
    shards: u8,
) -> Result<&'static ProfileSpec, RequestedProfileError> {
    let profile = parse_profile(model, name).map_err(|reason| RequestedProfileError::Unknown {
        name: name.to_string(),
        reason,
    })?;
    if let Some(kind) = VariantKind::of_name(name) {
        return Err(RequestedProfileError::Variant {
            name: name.to_string(),
            kind,
            base: profile.name(),
        });
    }
    let billed = model.room_shards(profile);
    if billed != shards {
        return Err(RequestedProfileError::ShardMismatch {
            name: name.to_string(),
            compute: profile.shape.compute,
            shards,
            billed,
            room: model.room_profile(profile).name(),
        });
    }
    Ok(profile)
}

/// Pulls `(compute slices, memory GB)` out of a name such as
/// `nvidia_a100_3g.20gb`, `MIG 1g.10gb+me`, `1g.24gb+me.all` or `3g.39gb`
/// (`None` when it names no profile): what `--mig-profile`, Slurm's typed
/// GRES and NVML names say, before the model is known. A variant's size is
/// its base profile's (`-me` falls off with the `-` separator).
pub fn profile_size(name: &str) -> Option<(u8, u32)> {
    let lower = name.trim().to_ascii_lowercase();
    lower
        .split(|c: char| c == '_' || c == ':' || c == '/' || c == '-' || c.is_whitespace())
        .rev()
        .find_map(|token| {
            let token = VariantKind::ALL
                .iter()
                .find_map(|k| token.strip_suffix(k.suffix()))
                .unwrap_or(token);
            let (c, m) = token.split_once("g.")?;
            let m = m.strip_suffix("gb")?;
            Some((c.parse().ok()?, m.parse().ok()?))
        })
}

/// Finds the profile a name refers to on `model`.
///
/// The memory part may differ from NVIDIA's nominal value by up to 10 % (at
/// least 1 GB), which covers the known driver variants (`3g.39gb`, `1g.9gb`,
/// GB300's `3g.126gb` for `3g.139gb`). Variants (`+me`, `-me`, `+gfx`,
/// `+me.all`) map to their base profile: same slices, same placements (what
/// advise mode needs for a site's existing instances); a job's
/// `--mig-profile` refuses them ([`requested_profile`]).
pub fn parse_profile(
    model: &'static ModelSpec,
    name: &str,
) -> Result<&'static ProfileSpec, ProfileParseError> {
    if name.trim().is_empty() {
        return Err(ProfileParseError::Empty);
    }
    let (compute, memory_gb) =
        profile_size(name).ok_or_else(|| ProfileParseError::NoProfile(name.to_string()))?;
    let list = |ps: &mut dyn Iterator<Item = &ProfileSpec>| {
        ps.map(ProfileSpec::name).collect::<Vec<_>>().join(", ")
    };
    let same_compute: Vec<&'static ProfileSpec> = model
        .profiles
        .iter()
        .filter(|p| p.shape.compute == compute)
        .collect();
    if same_compute.is_empty() {
        return Err(ProfileParseError::UnknownCompute {
            given: name.to_string(),
            model: model.id,
            compute,
            available: list(&mut model.profiles.iter()),
        });
    }
    same_compute
        .iter()
        .copied()
        .min_by_key(|p| p.memory_gb.abs_diff(memory_gb))
        .filter(|p| {
            let tolerance = (p.memory_gb / 10).max(1);
            p.memory_gb.abs_diff(memory_gb) <= tolerance
        })
        .ok_or_else(|| ProfileParseError::UnknownMemory {
            given: name.to_string(),
            model: model.id,
            compute,
            memory_gb,
            available: list(&mut same_compute.iter().copied()),
        })
}

/// The profile a request of `slices` compute slices and `memory_gb` GB gets:
/// the smallest profile (by compute, then memory) with at least that many
/// compute slices and at least that much memory.
///
/// So K that is not a profile size rounds up (5 and 6 get 7g), and a memory
/// need larger than the K-slice profiles offer moves to a bigger profile
/// (`2g.10gb` cannot hold 15 GB, `3g.20gb` can).
///
/// When this picks a memory variant (`1g.10gb` for 1 slice and 8 GB), the
/// job is billed and built as the variant's room instead (issue 55):
/// job_submit.lua raises K to [`ModelSpec::room_shards`], and for that K
/// this returns the room itself (`2g.10gb` for 2 slices and 8 GB; the test
/// `a_raised_request_selects_its_room` checks every model).
pub fn select_profile(
    model: &'static ModelSpec,
    slices: u8,
    memory_gb: Option<f64>,
) -> Result<&'static ProfileSpec, SelectError> {
    if slices == 0 {
        return Err(SelectError::ZeroSlices);
    }
    if slices > model.compute_slices {
        return Err(SelectError::TooManySlices {
            requested: slices,
            available: model.compute_slices,
            model: model.id,
        });
    }
    let need = memory_gb.unwrap_or(0.0);
    if !need.is_finite() || need < 0.0 {
        return Err(SelectError::BadMemory(need));
    }
    let mut candidates: Vec<&'static ProfileSpec> = model
        .profiles
        .iter()
        .filter(|p| p.shape.compute >= slices)
        .collect();
    candidates.sort_by_key(|p| (p.shape.compute, p.shape.memory));
    candidates
        .iter()
        .copied()
        .find(|p| f64::from(p.memory_gb) >= need)
        .ok_or(SelectError::MemoryTooLarge {
            requested: slices,
            memory_gb: need,
            largest_gb: model.memory_gb,
            model: model.id,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_names_state_their_size() {
        assert_eq!(profile_size("3g.20gb"), Some((3, 20)));
        assert_eq!(profile_size("1g.5gb+me"), Some((1, 5)));
        assert_eq!(profile_size("MIG 1g.24gb+me.all"), Some((1, 24)));
        assert_eq!(profile_size("2g.48gb+gfx"), Some((2, 48)));
        assert_eq!(profile_size("2g.48gb-me"), Some((2, 48)));
        assert_eq!(profile_size("a100"), None);
    }

    #[test]
    fn a_requested_profile_must_exist_and_match_the_shards() {
        let a100 = crate::GpuModel::A100_40gb.spec();
        assert_eq!(
            requested_profile(a100, "3g.20gb", 3).unwrap().name(),
            "3g.20gb"
        );
        // A memory variant is billed its room (issue 55): 1g.10gb blocks a
        // 2g.10gb's shards, so it is served at shard:2 and refused at 1.
        assert_eq!(
            requested_profile(a100, "nvidia_a100_1g.10gb", 2)
                .unwrap()
                .name(),
            "1g.10gb"
        );
        let e = requested_profile(a100, "1g.10gb", 1)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "--mig-profile=1g.10gb has 1 compute slices but the job asked for --gres=shard:1; \
             use --gres=shard:2 (1g.10gb's memory takes the room of a 2g.10gb, so it is \
             billed shard:2; the job gets 1g.10gb)"
        );
        let e = requested_profile(a100, "1g.10gb", 3)
            .unwrap_err()
            .to_string();
        assert!(e.contains("use --gres=shard:2"), "{e}");
        let h100 = crate::GpuModel::H100_80gb.spec();
        assert!(requested_profile(h100, "1g.20gb", 2).is_ok());
        assert!(requested_profile(h100, "1g.20gb", 1).is_err());
        let e = requested_profile(a100, "3g.40gb", 3)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--mig-profile=3g.40gb: "), "{e}");
        let e = requested_profile(a100, "3g.20gb", 2)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("use --gres=shard:3") && !e.contains("room"),
            "{e}"
        );
        let e = requested_profile(a100, "1g.5gb+me", 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`+me` variant") && e.contains("ask for --mig-profile=1g.5gb"),
            "{e}"
        );
        let rtx = crate::GpuModel::RtxPro6000_96gb.spec();
        for (name, suffix) in [
            ("1g.24gb+gfx", "+gfx"),
            ("2g.48gb-me", "-me"),
            ("1g.24gb+me.all", "+me.all"),
        ] {
            let e = requested_profile(rtx, name, name[..1].parse().unwrap())
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("`{suffix}` variant")), "{e}");
        }
        assert_eq!(
            requested_profile(rtx, "2g.48gb", 2).unwrap().name(),
            "2g.48gb"
        );
    }
    use crate::GpuModel;

    fn name_on(model: GpuModel, s: &str) -> Result<String, ProfileParseError> {
        parse_profile(model.spec(), s).map(super::super::models::ProfileSpec::name)
    }

    #[test]
    fn parses_driver_and_slurm_variants() {
        let a80 = GpuModel::A100_80gb;
        assert_eq!(name_on(a80, "3g.40gb").unwrap(), "3g.40gb");
        assert_eq!(name_on(a80, "3g.39gb").unwrap(), "3g.40gb");
        assert_eq!(
            name_on(a80, "nvidia_a100-sxm4-80gb_3g.40gb").unwrap(),
            "3g.40gb"
        );
        assert_eq!(name_on(a80, "MIG 1g.10gb+me").unwrap(), "1g.10gb");
        assert_eq!(name_on(a80, "1G.20GB").unwrap(), "1g.20gb");
        let a40 = GpuModel::A100_40gb;
        assert_eq!(name_on(a40, "nvidia_a100_3g.20gb").unwrap(), "3g.20gb");
        assert_eq!(name_on(a40, "1g.5gb").unwrap(), "1g.5gb");
        assert_eq!(name_on(a40, "1g.10gb").unwrap(), "1g.10gb");
    }

    #[test]
    fn says_what_it_could_not_parse() {
        let a40 = GpuModel::A100_40gb;
        assert_eq!(name_on(a40, " "), Err(ProfileParseError::Empty));
        assert!(matches!(
            name_on(a40, "threeg"),
            Err(ProfileParseError::NoProfile(_))
        ));
        let err = name_on(a40, "5g.30gb").unwrap_err();
        assert!(
            err.to_string().contains("no profile with 5 compute slices"),
            "{err}"
        );
        let err = name_on(a40, "3g.40gb").unwrap_err();
        assert!(err.to_string().contains("it has 3g.20gb"), "{err}");
    }

    /// job_submit.lua bills a request whose profile is a memory variant as
    /// the variant's room; smartmigd then sees K = the room's slices and the
    /// same memory, and must build exactly that room (issue 55).
    #[test]
    fn a_raised_request_selects_its_room() {
        for m in GpuModel::ALL {
            let spec = m.spec();
            for k in 1..=spec.compute_slices {
                for gb in spec.profiles.iter().map(|p| f64::from(p.memory_gb)) {
                    let Ok(p) = select_profile(spec, k, Some(gb)) else {
                        continue;
                    };
                    let room = spec.room_profile(p);
                    let again = select_profile(spec, spec.room_shards(p), Some(gb)).unwrap();
                    assert_eq!(again.name(), room.name(), "{m:?} K={k} {gb} GB");
                }
            }
        }
        let a40 = GpuModel::A100_40gb.spec();
        let p = select_profile(a40, 1, Some(8.0)).unwrap();
        assert_eq!((p.name(), a40.room_shards(p)), ("1g.10gb".into(), 2));
        assert_eq!(select_profile(a40, 2, Some(8.0)).unwrap().name(), "2g.10gb");
    }

    #[test]
    fn selection_rounds_up_and_respects_memory() {
        let a40 = GpuModel::A100_40gb.spec();
        let pick = |k, m| select_profile(a40, k, m).map(super::super::models::ProfileSpec::name);
        assert_eq!(pick(3, Some(15.0)).unwrap(), "3g.20gb");
        assert_eq!(pick(1, None).unwrap(), "1g.5gb");
        assert_eq!(pick(1, Some(8.0)).unwrap(), "1g.10gb");
        assert_eq!(pick(2, Some(15.0)).unwrap(), "3g.20gb");
        assert_eq!(pick(5, None).unwrap(), "7g.40gb");
        assert_eq!(pick(6, None).unwrap(), "7g.40gb");
        assert!(matches!(
            pick(8, None),
            Err(SelectError::TooManySlices { .. })
        ));
        assert!(matches!(pick(0, None), Err(SelectError::ZeroSlices)));
        assert!(matches!(
            pick(1, Some(41.0)),
            Err(SelectError::MemoryTooLarge { .. })
        ));
        assert!(matches!(
            pick(1, Some(f64::NAN)),
            Err(SelectError::BadMemory(_))
        ));
        let h100 = GpuModel::H100_80gb.spec();
        assert_eq!(
            select_profile(h100, 1, Some(12.0)).unwrap().name(),
            "1g.20gb"
        );
        let a30 = GpuModel::A30_24gb.spec();
        assert_eq!(select_profile(a30, 3, None).unwrap().name(), "4g.24gb");
    }
}

/// The user guide's K-to-profile tables (docs/user-guide.md, section 1)
/// say what [`select_profile`] does, cell by cell.
#[cfg(test)]
mod user_guide {
    use super::*;
    use crate::models::{GpuModel, MODELS};

    const GUIDE: &str = include_str!("../../../docs/user-guide.md");

    /// The models a header cell names (`A100-80GB, H100-80GB`, `RTX PRO 6000`).
    fn models_of(header: &str) -> Vec<GpuModel> {
        header
            .split(", ")
            .map(|name| {
                let name = name.trim();
                MODELS
                    .iter()
                    .find(|m| m.display == name || m.display.starts_with(&format!("{name} ")))
                    .unwrap_or_else(|| panic!("user guide header `{name}` names no model"))
                    .model
            })
            .collect()
    }

    fn expected(model: GpuModel, row: &str) -> String {
        let spec = model.spec();
        let ks: Vec<u8> = match row {
            "1, more memory (`--mig-mem`)" => {
                let wide = spec
                    .profiles
                    .iter()
                    .filter(|p| p.shape.compute == 1)
                    .max_by_key(|p| p.shape.memory)
                    .filter(|p| p.shape.memory > 1);
                // Billed and built as the room its memory takes (issue 55).
                return wide.map_or("-".into(), |p| {
                    let room = spec.room_profile(p);
                    format!("`{}`, billed shard:{}", room.name(), room.shape.compute)
                });
            }
            k => k.split(", ").map(|k| k.parse().unwrap()).collect(),
        };
        let names: Vec<String> = ks
            .iter()
            .map(|&k| match select_profile(spec, k, None) {
                Ok(p) => format!("`{}`", p.name()),
                Err(_) => "not possible".into(),
            })
            .collect();
        assert!(
            names.windows(2).all(|w| w[0] == w[1]),
            "{model} {row}: {names:?}"
        );
        names[0].clone()
    }

    #[test]
    fn user_guide_tables_match_select_profile() {
        let lines: Vec<&str> = GUIDE.lines().collect();
        let mut tables = 0;
        let mut covered = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            if !line.starts_with("| K |") {
                continue;
            }
            tables += 1;
            let headers: Vec<&str> = line.split('|').map(str::trim).collect();
            let columns: Vec<Vec<GpuModel>> = headers[2..headers.len() - 1]
                .iter()
                .map(|h| models_of(h))
                .collect();
            covered.extend(columns.iter().flatten().copied());
            for row in lines[i + 2..].iter().take_while(|l| l.starts_with('|')) {
                let cells: Vec<&str> = row.split('|').map(str::trim).collect();
                for (models, cell) in columns.iter().zip(&cells[2..]) {
                    for &m in models {
                        assert_eq!(*cell, expected(m, cells[1]), "{m}, K = {}", cells[1]);
                    }
                }
            }
        }
        assert_eq!(tables, 2);
        covered.sort();
        covered.dedup();
        assert_eq!(covered, GpuModel::ALL.to_vec(), "every model has a column");
    }
}
