//! `smartmig doctor --nvml-survey`: what NVML says about every GPU's MIG
//! profiles, as JSON, beside the table's verdict, for a report from a real
//! GPU (docs/mig-geometry.md, "Checking a new GPU").
//!
//! Read only, like the rest of doctor: it loads NVML and asks (MIG mode,
//! every profile at every NVML index: id, compute slices, memory, name,
//! possible placements; the instances that exist). It never changes MIG
//! mode, creates or destroys an instance, or resets a GPU. It needs no
//! smartmig config: without one it loads the default `libnvidia-ml.so.1`.

use serde::Serialize;

use super::gpus::gpu_checks;
use super::{Args, Check};
use crate::daemon::backend::inventory::{cuda_version_text, survey, GpuSurvey, Survey};
use crate::daemon::config::{Config, NvmlConfig};
use crate::mig::{DriverProfile, GpuModel, Provenance};

#[derive(Serialize)]
struct Report {
    library: String,
    driver_version: String,
    nvml_version: String,
    cuda_driver_version: String,
    device_count_error: Option<String>,
    gpus: Vec<GpuReport>,
}

#[derive(Serialize)]
struct GpuReport {
    index: u32,
    name: Result<String, String>,
    /// The table's model the name maps to.
    model: Option<GpuModel>,
    minor: Result<u32, String>,
    mig_current: Result<bool, String>,
    mig_pending: Result<bool, String>,
    /// Every profile the driver offers, by NVML index.
    driver_profiles: Result<Vec<DriverProfile>, String>,
    /// The driver against the table: would smartmigd manage this GPU?
    table: Option<TableReport>,
    /// GPU instances that exist: (profile id, start, size, MIG devices).
    instances: Result<Vec<(u32, u32, u32, usize)>, String>,
    /// doctor's verdict lines for this GPU.
    checks: Vec<Check>,
}

#[derive(Serialize)]
struct TableReport {
    agrees: bool,
    differences: Vec<String>,
    notes: Vec<String>,
    /// Table name -> (driver name, id, compute slices, MiB) of each match.
    matched: Vec<(String, String, u32, u32, u64)>,
    variants: Vec<String>,
    /// Where the table's figures come from, per group.
    sources: Vec<(String, String)>,
}

fn text<T: ToString, E: ToString>(r: &Result<T, E>) -> String {
    match r {
        Ok(v) => v.to_string(),
        Err(e) => format!("error: {}", e.to_string()),
    }
}

fn table_report(g: &GpuSurvey) -> Option<TableReport> {
    let m = g.matched.as_ref()?;
    let s = m.model.spec().sources;
    let source =
        |what: &str, p: Provenance| (what.to_string(), format!("{}: {}", p.label(), p.text()));
    Some(TableReport {
        agrees: m.agrees(),
        differences: m.differences.iter().map(ToString::to_string).collect(),
        notes: m.notes.clone(),
        matched: m
            .profiles
            .iter()
            .map(|p| {
                (
                    p.spec.name(),
                    p.name(),
                    p.driver.id,
                    p.driver.slices,
                    p.driver.memory_mib,
                )
            })
            .collect(),
        variants: m
            .variants
            .iter()
            .map(|v| {
                format!(
                    "{} (id {}, NVML index {})",
                    v.driver.label(),
                    v.driver.id,
                    v.driver.index
                )
            })
            .collect(),
        sources: vec![
            source("profiles", s.profiles),
            source("ids", s.ids),
            source("placements", s.placements),
        ],
    })
}

fn gpu_report(g: &GpuSurvey) -> GpuReport {
    let err = |e: &crate::daemon::backend::BackendError| e.to_string();
    GpuReport {
        index: g.index,
        name: g.name.clone().map_err(|e| err(&e)),
        model: g.model,
        minor: g.minor.clone().map_err(|e| err(&e)),
        mig_current: g.mig.as_ref().map(|m| m.current).map_err(err),
        mig_pending: g.mig.as_ref().map(|m| m.pending).map_err(err),
        driver_profiles: g.driver.clone().map_err(|e| err(&e)),
        table: table_report(g),
        instances: g
            .instances
            .as_ref()
            .map(|list| {
                list.iter()
                    .map(|i| (i.profile_id, i.start, i.size, i.mig_uuids.len()))
                    .collect()
            })
            .map_err(err),
        checks: gpu_checks(g),
    }
}

fn report(s: &Survey) -> Report {
    Report {
        library: s.library.display().to_string(),
        driver_version: text(&s.driver_version),
        nvml_version: text(&s.nvml_version),
        cuda_driver_version: match &s.cuda_driver_version {
            Ok(v) => cuda_version_text(*v),
            Err(e) => format!("error: {e}"),
        },
        device_count_error: s.device_count_error.as_ref().map(ToString::to_string),
        gpus: s.gpus.iter().map(gpu_report).collect(),
    }
}

/// Prints the survey as JSON. The NVML library comes from `--config` when
/// that file loads, else the default.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let nvml = Config::load(&args.config).map_or_else(|_| NvmlConfig::default(), |c| c.nvml);
    let s =
        survey(&nvml).map_err(|e| anyhow::anyhow!("loading {}: {e}", nvml.library.display()))?;
    println!("{}", serde_json::to_string_pretty(&report(&s))?);
    Ok(())
}
