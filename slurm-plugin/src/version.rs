//! The Slurm version check at `init`: the plugin refuses to work on a
//! Slurm release it was not built for.
//!
//! Slurm's own loader (`plugin_load_from_file` in `src/common/plugin.c`)
//! compares a SPANK plugin's `plugin_version` with its own
//! `SLURM_VERSION_NUMBER` on major.minor only (mask `0xffff00`): micro
//! releases of one series keep the plugin ABI. This module applies the
//! same rule to the version the running process reports
//! (`spank_get_item(S_SLURM_VERSION)`, valid in every context) and words
//! the refusal so that the admin knows what to install. Pure: the FFI part
//! is in `lib.rs` (`slurm_spank_init`).

use std::fmt;

/// A Slurm release: major.minor.micro (22.05.8 is 22, 5, 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlurmVersion {
    pub major: u32,
    pub minor: u32,
    pub micro: u32,
}

impl SlurmVersion {
    /// From `SLURM_VERSION_NUMBER` (`0x160508` is 22.05.8).
    pub const fn from_number(n: u32) -> Self {
        SlurmVersion {
            major: (n >> 16) & 0xff,
            minor: (n >> 8) & 0xff,
            micro: n & 0xff,
        }
    }

    /// Parses what `S_SLURM_VERSION` returns: "22.05.8", also with a
    /// pre-release suffix ("23.02.0-0rc1", "24.05.0pre1"); the micro part
    /// may be missing ("23.11"). `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().splitn(3, '.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let micro = match parts.next() {
            None => 0,
            Some(rest) => {
                let end = rest
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(rest.len());
                rest[..end].parse().ok()?
            }
        };
        Some(SlurmVersion {
            major,
            minor,
            micro,
        })
    }

    /// Whether an `srun` of this release that makes its own allocation asks
    /// its step for the GRES it was given (`--gres=gpu:1`) rather than for
    /// the ones slurmctld billed the job (job_submit.lua's `shard:7`):
    /// Slurm before 23.02 (`launch_common_create_job_step` takes
    /// `opt->gres`; from 23.02 srun replaces it with the allocation's
    /// `tres_per_node`). The step is then refused ("Step requested GRES
    /// (gpu:(null)) not found in the job").
    pub fn srun_step_asks_given_gres(self) -> bool {
        (self.major, self.minor) < (23, 2)
    }

    /// Whether a plugin built for `self` may run in `running`: the same
    /// major.minor, as Slurm's loader requires of SPANK plugins.
    pub fn compatible_with(self, running: SlurmVersion) -> bool {
        (self.major, self.minor) == (running.major, running.minor)
    }
}

impl fmt::Display for SlurmVersion {
    /// Slurm's own spelling: two-digit minor ("22.05.8").
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:02}.{}", self.major, self.minor, self.micro)
    }
}

/// The plugin runs on a Slurm release it was not built for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "built for Slurm {built} but this is Slurm {running}: \
     install the smartmig-spank package built for this Slurm"
)]
pub struct VersionMismatch {
    pub built: SlurmVersion,
    pub running: String,
}

/// Checks the running Slurm (`running`, as `S_SLURM_VERSION` spells it)
/// against the one the plugin was built for. A version that cannot be read
/// or parsed is accepted (Slurm's loader has already compared major.minor
/// before `init` runs); a different micro release is accepted, like
/// Slurm's loader does.
pub fn check(built: SlurmVersion, running: Option<&str>) -> Result<(), VersionMismatch> {
    let Some(text) = running else { return Ok(()) };
    match SlurmVersion::parse(text) {
        Some(v) if !built.compatible_with(v) => Err(VersionMismatch {
            built,
            running: text.trim().to_string(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUILT: SlurmVersion = SlurmVersion::from_number(0x160508);

    #[test]
    fn number_and_display() {
        assert_eq!(
            BUILT,
            SlurmVersion {
                major: 22,
                minor: 5,
                micro: 8
            }
        );
        assert_eq!(BUILT.to_string(), "22.05.8");
        assert_eq!(SlurmVersion::from_number(0x170b0a).to_string(), "23.11.10");
    }

    #[test]
    fn only_srun_before_23_02_asks_its_step_for_the_given_gres() {
        assert!(BUILT.srun_step_asks_given_gres());
        for (n, asks) in [
            (0x170100, true),
            (0x170200, false),
            (0x180b05, false),
            (0x1a0505, false),
        ] {
            assert_eq!(
                SlurmVersion::from_number(n).srun_step_asks_given_gres(),
                asks,
                "{}",
                SlurmVersion::from_number(n)
            );
        }
    }

    #[test]
    fn parses_slurm_spellings() {
        assert_eq!(SlurmVersion::parse("22.05.8"), Some(BUILT));
        assert_eq!(
            SlurmVersion::parse("23.02.0-0rc1").map(|v| v.to_string()),
            Some("23.02.0".into())
        );
        assert_eq!(
            SlurmVersion::parse("24.05.0pre1").map(|v| v.to_string()),
            Some("24.05.0".into())
        );
        assert_eq!(
            SlurmVersion::parse(" 23.11 ").map(|v| v.to_string()),
            Some("23.11.0".into())
        );
        for bad in ["", "22", "x.05.8", "22.x.8", "22.05.x"] {
            assert_eq!(SlurmVersion::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn same_series_is_accepted_micro_included() {
        assert_eq!(check(BUILT, Some("22.05.8")), Ok(()));
        assert_eq!(check(BUILT, Some("22.05.11")), Ok(()));
        assert_eq!(check(BUILT, Some("22.05.0")), Ok(()));
    }

    #[test]
    fn other_series_is_refused_with_the_message() {
        let err = check(BUILT, Some("23.02.1")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "built for Slurm 22.05.8 but this is Slurm 23.02.1: \
             install the smartmig-spank package built for this Slurm"
        );
        assert!(check(BUILT, Some("21.08.8")).is_err());
        assert!(check(BUILT, Some("22.06.0")).is_err());
    }

    #[test]
    fn unknown_version_is_accepted() {
        assert_eq!(check(BUILT, None), Ok(()));
        assert_eq!(check(BUILT, Some("unknown")), Ok(()));
    }
}
