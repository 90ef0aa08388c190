//! The GPU checks: NVML (driver, MIG mode, profile ids, placements,
//! existing instances) on the nvml backend, or one warning on the sim
//! backend. The survey is [`crate::daemon::backend::inventory`]; the
//! verdicts are the pure functions below.

use super::{Check, NodeGpu};
use crate::daemon::backend::inventory::{
    cuda_version_text, survey, GpuInstanceSurvey, GpuSurvey, MigModes, Survey,
};
use crate::daemon::backend::BackendError;
use crate::daemon::config::{BackendKind, Config};
use crate::mig::{Difference, DriverMatch};

/// The GPU checks and, when known, the node's GPUs.
pub fn check(config: Option<&Config>) -> (Vec<Check>, Option<Vec<NodeGpu>>) {
    let Some(config) = config else {
        return (
            vec![Check::skipped(
                "gpus",
                "the config did not load, so the backend is unknown",
                "fix the config first",
            )],
            None,
        );
    };
    match config.backend {
        BackendKind::Sim => sim_checks(config),
        BackendKind::Nvml => {
            let result = survey(&config.nvml);
            let checks = nvml_checks(&config.nvml.library.display().to_string(), &result);
            let gpus = result.ok().map(|s| node_gpus(&s));
            (checks, gpus)
        }
    }
}

fn sim_checks(config: &Config) -> (Vec<Check>, Option<Vec<NodeGpu>>) {
    let Ok(models) = config.sim_gpus() else {
        return (
            vec![Check::skipped(
                "gpus.sim",
                "the [[gpus]] tables do not parse",
                "fix the config",
            )],
            None,
        );
    };
    let list: Vec<String> = models
        .iter()
        .enumerate()
        .map(|(i, m)| format!("GPU {i} {m}"))
        .collect();
    let gpus = models
        .iter()
        .enumerate()
        .map(|(i, &model)| NodeGpu {
            index: i as u32,
            model,
            minor: Some(i as u32),
        })
        .collect();
    (
        vec![Check::warn(
            "gpus.sim",
            format!(
                "backend = \"sim\": smartmigd drives simulated GPUs ({}); the hardware is not checked",
                list.join(", ")
            ),
            "on a GPU node set backend = \"nvml\" in the config and run doctor again",
        )],
        Some(gpus),
    )
}

/// The GPUs of a survey whose model the table knows.
pub fn node_gpus(s: &Survey) -> Vec<NodeGpu> {
    s.gpus
        .iter()
        .filter_map(|g| {
            Some(NodeGpu {
                index: g.index,
                model: g.model?,
                minor: g.minor.as_ref().ok().copied(),
            })
        })
        .collect()
}

/// Every NVML check of a survey (or of its failure).
pub fn nvml_checks(library: &str, result: &Result<Survey, BackendError>) -> Vec<Check> {
    let s = match result {
        Ok(s) => s,
        Err(e) => {
            return vec![Check::fail(
                "nvml.library",
                format!("cannot load {library}: {e}"),
                "install the NVIDIA driver (libnvidia-ml.so.1), or set [nvml] library to its path",
            )]
        }
    };
    let mut out = vec![driver_check(s)];
    if let Some(e) = &s.device_count_error {
        out.push(Check::fail(
            "nvml.gpus",
            format!("NVML cannot count the GPUs: {e}"),
            "check the driver (`nvidia-smi`)",
        ));
        return out;
    }
    if s.gpus.is_empty() {
        out.push(Check::fail(
            "nvml.gpus",
            "NVML sees no GPU",
            "check the driver (`nvidia-smi -L`)",
        ));
    }
    for g in &s.gpus {
        out.extend(gpu_checks(g));
    }
    out
}

fn driver_check(s: &Survey) -> Check {
    let text = |r: &Result<String, BackendError>| r.clone().unwrap_or_else(|_| "unknown".into());
    let cuda = s
        .cuda_driver_version
        .as_ref()
        .map_or_else(|_| "unknown".into(), |v| cuda_version_text(*v));
    let detail = format!(
        "{} loaded: driver {}, NVML {}, CUDA driver {}",
        s.library.display(),
        text(&s.driver_version),
        text(&s.nvml_version),
        cuda
    );
    let failed: Vec<String> = [
        s.driver_version.as_ref().err(),
        s.nvml_version.as_ref().err(),
        s.cuda_driver_version.as_ref().err(),
    ]
    .into_iter()
    .flatten()
    .map(ToString::to_string)
    .collect();
    if failed.is_empty() {
        Check::ok("nvml.library", detail)
    } else {
        Check::warn(
            "nvml.library",
            format!("{detail} ({})", failed.join("; ")),
            "check the driver installation (`nvidia-smi`)",
        )
    }
}

/// The checks of one GPU.
pub fn gpu_checks(g: &GpuSurvey) -> Vec<Check> {
    let i = g.index;
    let mut out = Vec::new();
    let name = match &g.name {
        Ok(n) => n.clone(),
        Err(e) => {
            out.push(Check::fail(
                format!("nvml.gpu{i}.model"),
                format!("cannot read the GPU's name: {e}"),
                "check the driver (`nvidia-smi -L`)",
            ));
            return out;
        }
    };
    let Some(model) = g.model else {
        out.push(Check::fail(
            format!("nvml.gpu{i}.model"),
            format!("GPU {i} is \"{name}\", a model smartmig does not know (smartmigd refuses to start)"),
            "use a MIG-capable GPU smartmig supports (`smartmig layouts --help` lists them)",
        ));
        return out;
    };
    let minor = g.minor.as_ref().map_or_else(
        |e| format!("minor unknown: {e}"),
        |m| format!("/dev/nvidia{m}"),
    );
    out.push(Check::ok(
        format!("nvml.gpu{i}.model"),
        format!("GPU {i} \"{name}\" is {model} ({minor})"),
    ));
    out.push(mig_check(i, &g.mig));
    // With MIG off the driver still describes the profiles; only when it
    // would not say anything are the table checks left undone.
    let mig_on = g.mig_on();
    let skipped = |what: &str| {
        let why = match &g.driver {
            Err(e) => format!("the driver was not asked: {e}"),
            Ok(_) => "the driver describes no MIG profile with MIG mode off".to_string(),
        };
        Check::skipped(
            format!("nvml.gpu{i}.{what}"),
            why,
            format!("enable MIG mode on GPU {i}, then run doctor again"),
        )
    };
    match &g.matched {
        Some(m) => {
            out.push(profiles_check(i, m));
            out.push(placements_check(i, m));
        }
        None => {
            out.push(skipped("profiles"));
            out.push(skipped("placements"));
        }
    }
    out.push(if mig_on {
        instances_check(i, &g.instances)
    } else {
        skipped("instances")
    });
    out
}

/// MIG mode: off now is a failure (smartmigd refuses to start), a
/// pending change a warning.
pub fn mig_check(i: u32, mig: &Result<MigModes, BackendError>) -> Check {
    let name = format!("nvml.gpu{i}.mig");
    let enable = format!(
        "`nvidia-smi -i {i} -mig 1`, then reset the GPU (`nvidia-smi -i {i} -r`, or reboot)"
    );
    match mig {
        Err(e) => Check::fail(
            name,
            format!("cannot read GPU {i}'s MIG mode: {e}"),
            "a GPU without MIG cannot be used by smartmig; check the model and driver",
        ),
        Ok(m) if !m.current => Check::fail(
            name,
            format!(
                "GPU {i}: MIG mode is off{} (smartmigd refuses to start)",
                if m.pending {
                    " (on after the next reset)"
                } else {
                    ""
                }
            ),
            if m.pending {
                format!("reset the GPU (`nvidia-smi -i {i} -r`, or reboot)")
            } else {
                enable
            },
        ),
        Ok(m) if !m.pending => Check::warn(
            name,
            format!("GPU {i}: MIG mode is on, but off after the next GPU reset (pending change)"),
            format!("`nvidia-smi -i {i} -mig 1` to keep it on"),
        ),
        Ok(_) => Check::ok(name, format!("GPU {i}: MIG mode on (also after a reset)")),
    }
}

/// Whether a difference is about placements (the `placements` line) rather
/// than which profiles exist (the `profiles` line).
fn about_placements(d: &Difference) -> bool {
    matches!(
        d,
        Difference::Placements { .. } | Difference::Unreadable { .. }
    )
}

const REFUSED: &str = "smartmigd refuses to manage this GPU while the driver and the table (sidecar/mig/src/models.rs) disagree: report the line (docs/mig-geometry.md, \"Known by NVML\")";

/// The driver's profiles against the table by NVML index, id and compute
/// slices: a difference fails (smartmigd refuses the GPU); a profile the
/// driver names otherwise (same id and slices) warns, since jobs'
/// `--mig-mem` is still compared with the table's sizes.
pub fn profiles_check(i: u32, m: &DriverMatch) -> Check {
    let name = format!("nvml.gpu{i}.profiles");
    let diffs: Vec<String> = m
        .differences
        .iter()
        .filter(|d| !about_placements(d))
        .map(ToString::to_string)
        .collect();
    if !diffs.is_empty() {
        return Check::fail(name, diffs.join("; "), REFUSED);
    }
    let detail = format!(
        "{} profiles of {}: driver ids and compute slices as in the table; instance memory {}{}",
        m.profiles.len(),
        m.model,
        memory_list(m),
        variant_list(m)
    );
    if m.notes.is_empty() {
        Check::ok(name, detail)
    } else {
        Check::warn(
            name,
            format!("{detail}; {}", m.notes.join("; ")),
            "smartmig uses the driver's ids and names; jobs' --mig-mem is compared with the table's sizes, so check a renamed profile's memory above and report it so the table can follow",
        )
    }
}

/// Each profile's memory as the driver reports it (the profile names round
/// up: an H200's 1g.18gb holds 16.0 GiB), so an admin sizing `--mem`-style
/// requests sees what a job really gets.
fn memory_list(m: &DriverMatch) -> String {
    let items: Vec<String> = m
        .profiles
        .iter()
        .map(|p| {
            format!(
                "{} {:.2} GiB",
                p.name(),
                p.driver.memory_mib as f64 / 1024.0
            )
        })
        .collect();
    items.join(", ")
}

/// The variants the driver offers (never scheduled), or nothing.
fn variant_list(m: &DriverMatch) -> String {
    if m.variants.is_empty() {
        return String::new();
    }
    let items: Vec<String> = m
        .variants
        .iter()
        .map(|v| format!("{} (id {})", v.driver.label(), v.driver.id))
        .collect();
    format!(
        "; variants (never created by smartmig): {}",
        items.join(", ")
    )
}

/// NVML's possible placements against the table: any difference fails
/// (smartmig would create where the driver refuses, or never use a place
/// it offers), as does a driver that will not say.
pub fn placements_check(i: u32, m: &DriverMatch) -> Check {
    let name = format!("nvml.gpu{i}.placements");
    let diffs: Vec<String> = m
        .differences
        .iter()
        .filter(|d| about_placements(d))
        .map(ToString::to_string)
        .collect();
    if diffs.is_empty() {
        Check::ok(
            name,
            format!("{} profiles, placements as in the table", m.profiles.len()),
        )
    } else {
        Check::fail(name, diffs.join("; "), REFUSED)
    }
}

/// Existing instances: how many, and GPU instances without a compute
/// instance (a warning: they hold slices nothing can use).
pub fn instances_check(i: u32, instances: &Result<Vec<GpuInstanceSurvey>, BackendError>) -> Check {
    let name = format!("nvml.gpu{i}.instances");
    match instances {
        Err(e) => Check::warn(
            name,
            format!("cannot list GPU {i}'s instances: {e}"),
            format!("check with `nvidia-smi mig -i {i} -lgi`"),
        ),
        Ok(list) => {
            let orphans: Vec<&GpuInstanceSurvey> =
                list.iter().filter(|g| g.mig_uuids.is_empty()).collect();
            if orphans.is_empty() {
                Check::ok(name, format!("{} MIG instance(s)", list.len()))
            } else {
                let ids: Vec<String> = orphans
                    .iter()
                    .map(|g| format!("{} (profile {}, start {})", g.id, g.profile_id, g.start))
                    .collect();
                Check::warn(
                    name,
                    format!(
                        "{} GPU instance(s); without a compute instance: {}",
                        list.len(),
                        ids.join(", ")
                    ),
                    format!(
                        "`nvidia-smi mig -i {i} -gi {} -dgi` (smartmigd also destroys them at start)",
                        orphans
                            .iter()
                            .map(|g| g.id.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::driver::table_driver_profiles;
    use crate::mig::{match_driver, DriverProfile, GpuModel};

    fn survey_of(model: GpuModel) -> Vec<DriverProfile> {
        table_driver_profiles(model, |gb| u64::from(gb) * 1000)
    }

    #[test]
    fn mig_off_fails_and_pending_warns() {
        let off = mig_check(
            1,
            &Ok(MigModes {
                current: false,
                pending: false,
            }),
        );
        assert_eq!(off.status, super::super::Status::Fail);
        assert!(
            off.detail.contains("GPU 1")
                && off
                    .fix
                    .as_deref()
                    .unwrap_or("")
                    .contains("nvidia-smi -i 1 -mig 1"),
            "{off:?}"
        );
        let soon = mig_check(
            0,
            &Ok(MigModes {
                current: false,
                pending: true,
            }),
        );
        assert_eq!(soon.status, super::super::Status::Fail);
        assert!(soon.fix.as_deref().unwrap_or("").contains("-r"), "{soon:?}");
        let leaving = mig_check(
            0,
            &Ok(MigModes {
                current: true,
                pending: false,
            }),
        );
        assert_eq!(leaving.status, super::super::Status::Warn);
        let on = mig_check(
            0,
            &Ok(MigModes {
                current: true,
                pending: true,
            }),
        );
        assert_eq!(on.status, super::super::Status::Ok);
    }

    fn gpu(mig_on: bool, profiles: Vec<DriverProfile>) -> GpuSurvey {
        let model = GpuModel::H200_141gb;
        GpuSurvey {
            index: 0,
            name: Ok("NVIDIA H200".into()),
            model: Some(model),
            minor: Ok(0),
            mig: Ok(MigModes {
                current: mig_on,
                pending: mig_on,
            }),
            matched: (!profiles.is_empty()).then(|| match_driver(model, &profiles)),
            driver: Ok(profiles),
            instances: Ok(Vec::new()),
        }
    }

    fn statuses(checks: &[Check]) -> Vec<(String, super::super::Status)> {
        checks.iter().map(|c| (c.check.clone(), c.status)).collect()
    }

    /// As on an H200 with driver 580: MIG off, yet the driver lists the
    /// profiles and their placements, so the table is checked; only the
    /// instances wait for MIG mode.
    #[test]
    fn mig_off_still_checks_the_table_when_the_driver_answers() {
        use super::super::Status::{Fail, Ok as Good, Warn};
        let checks = gpu_checks(&gpu(false, survey_of(GpuModel::H200_141gb)));
        assert_eq!(
            statuses(&checks)[1..],
            [
                ("nvml.gpu0.mig".to_string(), Fail),
                ("nvml.gpu0.profiles".to_string(), Good),
                ("nvml.gpu0.placements".to_string(), Good),
                ("nvml.gpu0.instances".to_string(), Warn),
            ]
        );
        assert!(
            checks[2].detail.contains("1g.18gb 17.58 GiB"),
            "{:?}",
            checks[2]
        );
        assert!(
            checks[2]
                .detail
                .contains("variants (never created by smartmig): 1g.18gb+me (id 20)"),
            "{:?}",
            checks[2]
        );
        let checks = gpu_checks(&gpu(false, Vec::new()));
        let later: Vec<_> = statuses(&checks)[2..].to_vec();
        assert_eq!(
            later,
            ["profiles", "placements", "instances"]
                .map(|w| (format!("nvml.gpu0.{w}"), Warn))
                .to_vec()
        );
        let on = gpu_checks(&gpu(true, survey_of(GpuModel::H200_141gb)));
        assert_eq!(on[4].check, "nvml.gpu0.instances");
        assert_eq!(on[4].status, Good);
    }

    #[test]
    fn the_table_agrees_with_itself_and_drift_is_named() {
        use super::super::Status::{Fail, Ok as Good, Warn};
        for model in GpuModel::ALL {
            let m = match_driver(model, &survey_of(model));
            assert_eq!(profiles_check(0, &m).status, Good, "{model}");
            assert_eq!(placements_check(0, &m).status, Good, "{model}");
        }
        let model = GpuModel::A100_40gb;
        let mut ps = survey_of(model);
        let three = ps.iter_mut().find(|p| p.id == 9).unwrap();
        three.placements = Ok(vec![(0, 4)]);
        let m = match_driver(model, &ps);
        assert_eq!(profiles_check(0, &m).status, Good);
        let pl = placements_check(0, &m);
        assert_eq!(pl.status, Fail);
        assert!(
            pl.detail
                .contains("3g.20gb: driver placements [0+4], table [0+4 4+4]"),
            "{pl:?}"
        );
        ps.iter_mut().find(|p| p.id == 9).unwrap().id = 99;
        let ids = profiles_check(0, &match_driver(model, &ps));
        assert_eq!(ids.status, Fail);
        assert!(
            ids.detail.contains("3g.20gb: driver id 99, table id 9"),
            "{ids:?}"
        );
        assert!(
            ids.fix.as_deref().unwrap_or("").contains("refuses"),
            "{ids:?}"
        );
        // A renamed profile (GB300 on R61x drivers) warns and names both.
        let model = GpuModel::Gb300_288gb;
        let mut ps = survey_of(model);
        let three = ps.iter_mut().find(|p| p.id == 9).unwrap();
        three.name = Some("3g.126gb".into());
        three.memory_mib = 126 * 1024;
        let c = profiles_check(0, &match_driver(model, &ps));
        assert_eq!(c.status, Warn, "{c:?}");
        assert!(
            c.detail.contains("3g.126gb 126.00 GiB")
                && c.detail.contains("3g.139gb (id 9) is named 3g.126gb"),
            "{c:?}"
        );
    }

    #[test]
    fn orphan_gpu_instances_warn() {
        let good = GpuInstanceSurvey {
            id: 1,
            profile_id: 9,
            start: 0,
            size: 4,
            mig_uuids: vec!["MIG-x".into()],
        };
        assert_eq!(
            instances_check(0, &Ok(vec![good.clone()])).status,
            super::super::Status::Ok
        );
        let orphan = GpuInstanceSurvey {
            id: 2,
            mig_uuids: Vec::new(),
            start: 4,
            ..good.clone()
        };
        let c = instances_check(0, &Ok(vec![good, orphan]));
        assert_eq!(c.status, super::super::Status::Warn);
        assert!(
            c.fix.as_deref().unwrap_or("").contains("-gi 2 -dgi"),
            "{c:?}"
        );
    }
}
