//! The job options the plugin adds to sbatch/srun/salloc: `--mig-mem=SIZE`
//! and `--mig-profile=NAME`.
//!
//! Both are validated at submit (the allocator context, where a bad value
//! makes sbatch refuse the job with the message below). The GPU model is not
//! known there, so `--mig-profile` is only checked for being a profile of
//! *some* known model; on the node the plugin passes the name in the
//! allocate request and smartmigd resolves it on the GPU's model
//! (`smartmig_mig::requested_profile`), refusing a profile the model lacks
//! or billed other shards than it blocks (its compute slices; a memory
//! variant's room: `1g.10gb` on an A100-40GB needs shard:2, issue 55).

use smartmig_mig::{
    parse_profile, profile_size, ProfileParseError, RequestedProfileError, VariantKind, MODELS,
};

/// The accepted forms, repeated in every `--mig-mem` refusal.
const MIG_MEM_HINT: &str = "expected a size such as 10G, 15GB, 20480M or 40 (GB)";

/// Why a `--mig-mem` value is refused (`value` as the user wrote it).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum MigMemError {
    #[error("--mig-mem needs a value ({MIG_MEM_HINT})")]
    Empty,
    #[error("--mig-mem={value}: not a size ({MIG_MEM_HINT})")]
    NotASize { value: String },
    #[error("--mig-mem={value}: unknown unit ({MIG_MEM_HINT})")]
    UnknownUnit { value: String },
    #[error("--mig-mem={value}: must be more than 0 ({MIG_MEM_HINT})")]
    NotPositive { value: String },
    #[error("--mig-mem={value}: {gb:.0} GB is more than any MIG-capable GPU has")]
    TooLarge { value: String, gb: f64 },
}

/// Why a `--mig-profile` value is refused at submit (on the node smartmigd
/// checks it: `smartmig_mig::RequestedProfileError`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MigProfileError {
    /// Not a profile name.
    #[error("--mig-profile={name}: {source}")]
    Parse {
        name: String,
        source: ProfileParseError,
    },
    /// Well-formed, but no known GPU model has it (submit).
    #[error(
        "--mig-profile={name}: no MIG-capable GPU model has this profile \
         (e.g. A100-40GB: 1g.5gb 1g.10gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb)"
    )]
    NoModelHasIt { name: String },
    /// This build knows no GPU model at all.
    #[error("--mig-profile={name}: no GPU models known")]
    NoModels { name: String },
    /// A `+me`, `-me`, `+gfx` or `+me.all` variant: smartmig creates only
    /// the default profiles.
    #[error(transparent)]
    Variant(RequestedProfileError),
}

/// Largest `--mig-mem` accepted (GB): more than any MIG-capable GPU has, so
/// a typo such as `--mig-mem=20000G` is refused at submit instead of failing
/// later with "no profile fits".
pub const MAX_MIG_MEM_GB: f64 = 1024.0;

/// Parses a `--mig-mem` value into GB (decimal, as in MIG profile names:
/// `3g.20gb` holds `--mig-mem=20G`).
///
/// Accepted: a positive number with an optional unit `K`, `M`, `G` or `T`
/// (optionally followed by `B`, `iB`), case-insensitive; a bare number means
/// GB, because GPU memory is always discussed in GB (unlike `--mem`, whose
/// default unit is MB). `M` is 1/1024 GB, like Slurm's `--mem` units.
pub fn parse_mig_mem(value: &str) -> Result<f64, MigMemError> {
    let v = value.trim();
    if v.is_empty() {
        return Err(MigMemError::Empty);
    }
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let value = value.to_string();
    let Ok(n) = number.parse::<f64>() else {
        return Err(MigMemError::NotASize { value });
    };
    let unit = unit.to_ascii_lowercase();
    let unit = unit
        .strip_suffix("ib")
        .or_else(|| unit.strip_suffix('b'))
        .unwrap_or(&unit);
    let factor = match unit {
        "" | "g" => 1.0,
        "k" => 1.0 / (1024.0 * 1024.0),
        "m" => 1.0 / 1024.0,
        "t" => 1024.0,
        _ => return Err(MigMemError::UnknownUnit { value }),
    };
    let gb = n * factor;
    if !gb.is_finite() || gb <= 0.0 {
        return Err(MigMemError::NotPositive { value });
    }
    if gb > MAX_MIG_MEM_GB {
        return Err(MigMemError::TooLarge { value, gb });
    }
    Ok(gb)
}

/// Checks a `--mig-profile` value without knowing the GPU model (submit
/// time): it must name a profile of at least one known model. Returns its
/// compute-slice count.
pub fn check_profile_syntax(name: &str) -> Result<u8, MigProfileError> {
    let mut last_err = None;
    for model in &MODELS {
        match parse_profile(model, name) {
            Ok(p) => {
                return match VariantKind::of_name(name) {
                    // The base as the user wrote it (`1g.5gb+me` ->
                    // `1g.5gb`): the node's model is unknown here, and
                    // another model's nearest profile (the A30's 1g.6gb)
                    // would be no advice for an A100 user.
                    Some(kind) => Err(MigProfileError::Variant(RequestedProfileError::Variant {
                        name: name.to_string(),
                        kind,
                        base: profile_size(name)
                            .map_or_else(|| p.name(), |(c, gb)| format!("{c}g.{gb}gb")),
                    })),
                    None => Ok(p.shape.compute),
                };
            }
            Err(e @ (ProfileParseError::Empty | ProfileParseError::NoProfile(_))) => {
                return Err(MigProfileError::Parse {
                    name: name.to_string(),
                    source: e,
                })
            }
            Err(e) => last_err = Some(e),
        }
    }
    let name = name.to_string();
    Err(match last_err {
        Some(_) => MigProfileError::NoModelHasIt { name },
        None => MigProfileError::NoModels { name },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_mem_units() {
        assert_eq!(parse_mig_mem("15G").unwrap(), 15.0);
        assert_eq!(parse_mig_mem("15gb").unwrap(), 15.0);
        assert_eq!(parse_mig_mem("15GiB").unwrap(), 15.0);
        assert_eq!(parse_mig_mem("40").unwrap(), 40.0);
        assert_eq!(parse_mig_mem("20480M").unwrap(), 20.0);
        assert_eq!(parse_mig_mem("1T").unwrap(), 1024.0);
        assert_eq!(parse_mig_mem("9.5G").unwrap(), 9.5);
    }

    #[test]
    fn mig_mem_refusals_say_why() {
        for (v, needle) in [
            ("", "needs a value"),
            ("lots", "not a size"),
            ("15Q", "unknown unit"),
            ("0G", "more than 0"),
            ("-5G", "not a size"),
            ("5000G", "more than any MIG-capable GPU"),
            ("1.2.3G", "not a size"),
        ] {
            let err = parse_mig_mem(v).unwrap_err().to_string();
            assert!(err.contains(needle), "{v:?}: {err}");
        }
    }

    #[test]
    fn profile_syntax_at_submit() {
        assert_eq!(check_profile_syntax("3g.40gb").unwrap(), 3);
        assert_eq!(check_profile_syntax("3g.20gb").unwrap(), 3);
        let e = check_profile_syntax("1g.24gb+gfx").unwrap_err().to_string();
        assert!(
            e.starts_with("--mig-profile=1g.24gb+gfx is a `+gfx` variant"),
            "{e}"
        );
        // The hint is the base the user wrote, not another model's profile.
        let e = check_profile_syntax("1g.5gb+me").unwrap_err().to_string();
        assert!(e.contains("ask for --mig-profile=1g.5gb "), "{e}");
        assert!(!e.contains("1g.6gb"), "{e}");
        assert_eq!(check_profile_syntax("nvidia_a100_1g.5gb").unwrap(), 1);
        assert!(check_profile_syntax("three")
            .unwrap_err()
            .to_string()
            .contains("<N>g.<M>gb"));
        assert_eq!(
            check_profile_syntax("5g.30gb"),
            Err(MigProfileError::NoModelHasIt {
                name: "5g.30gb".into()
            })
        );
    }
}
