//! `smartmig doctor --hardware-test --gpu-index N --yes`: on an idle GPU in MIG
//! mode, create one instance of every profile of its model through the
//! daemon's own NVML backend, check it, and destroy it again.
//!
//! Per profile: NVML's possible placements against the table, then
//! `NvmlBackend::create` at the first placement the driver offers, `list`
//! shows it there with a `MIG-` UUID, its `access_files` exist, `destroy`,
//! and the GPU is empty again. Whatever a failed step leaves is destroyed
//! before the next profile. Refuses without `--yes`, on a GPU that is not
//! in MIG mode or has any instance, and while smartmigd answers on the
//! config's sockets. So far this has run only against the NVML emulator
//! (`sidecar/nvml-emu`), never on a GPU.

use std::time::Duration;

use anyhow::{bail, Context as _};

use super::{Args, Check};
use crate::daemon::backend::inventory::survey;
use crate::daemon::backend::nvml::NvmlBackend;
use crate::daemon::backend::Backend;
use crate::daemon::config::Config;
use crate::daemon::Client;
use crate::mig::driver::table_placements;
use crate::mig::{DriverProfile, Geometry, GpuModel, ProfileSpec, SpotId};

pub fn run(args: &Args) -> anyhow::Result<Vec<Check>> {
    let Some(gpu) = args.gpu else {
        bail!("--hardware-test needs --gpu-index N (the NVML index of an idle GPU in MIG mode)");
    };
    if !args.yes {
        bail!(
            "--hardware-test creates and destroys a MIG instance of every profile on GPU {gpu}; \
             nothing was changed. Run it again with --yes on an idle GPU, with smartmigd stopped"
        );
    }
    let config =
        Config::load(&args.config).with_context(|| format!("reading {}", args.config.display()))?;
    for socket in [config.socket.clone(), config.admin_socket()] {
        let client = Client::new(&socket).with_io_timeout(Duration::from_secs(5));
        if client.health().is_ok() {
            bail!(
                "smartmigd answers on {}: stop it first (`systemctl stop smartmigd`); \
                 the test must not change instances under a running daemon",
                socket.display()
            );
        }
    }
    let before = survey(&config.nvml).context("loading NVML")?;
    let Some(g) = before.gpus.iter().find(|g| g.index == gpu) else {
        bail!("no GPU {gpu}: NVML sees {} GPU(s)", before.gpus.len());
    };
    let Some(model) = g.model else {
        bail!("GPU {gpu} ({:?}) is not a model smartmig knows", g.name);
    };
    if !g.mig_on() {
        bail!("GPU {gpu}: MIG mode is not on (`nvidia-smi -i {gpu} -mig 1` and a GPU reset)");
    }
    let instances = g
        .instances
        .clone()
        .with_context(|| format!("listing GPU {gpu}'s instances"))?;
    if !instances.is_empty() {
        bail!(
            "GPU {gpu} has {} GPU instance(s); the test needs a GPU without any (`nvidia-smi mig -i {gpu} -lgi`)",
            instances.len()
        );
    }
    // Opening the backend destroys GPU instances without a compute
    // instance on every GPU: refuse rather than touch another GPU.
    for other in &before.gpus {
        if let Ok(list) = &other.instances {
            if let Some(orphan) = list.iter().find(|i| i.mig_uuids.is_empty()) {
                bail!(
                    "GPU {} has GPU instance {} without a compute instance, which opening the NVML \
                     backend would destroy; remove it first (`nvidia-smi mig -i {} -gi {} -dgi`)",
                    other.index,
                    orphan.id,
                    other.index,
                    orphan.id
                );
            }
        }
    }
    // The backend refuses a GPU whose driver differs from the table,
    // naming the differences, before anything is created.
    let backend = NvmlBackend::open(&config.nvml).context("opening the NVML backend")?;
    let driver = g.driver.as_ref().map_or(&[][..], Vec::as_slice);
    let mut out: Vec<Check> = model
        .spec()
        .profiles
        .iter()
        .map(|spec| {
            let offered = driver.iter().find(|d| d.index == spec.nvml_profile);
            test_profile(&backend, gpu, model, spec, offered)
        })
        .collect();
    out.push(empty_check(&backend, &config, gpu));
    Ok(out)
}

/// One profile (`offered`: the driver's entry at its NVML index):
/// placements, create, list, access files, destroy.
fn test_profile(
    backend: &dyn Backend,
    gpu: u32,
    model: GpuModel,
    spec: &ProfileSpec,
    offered: Option<&DriverProfile>,
) -> Check {
    let name = format!("hardware.gpu{gpu}.{}", spec.name());
    let fix = "do not enable smartmig on this GPU; report this line (docs/doctor.md)";
    let driver = match offered.map(|d| &d.placements) {
        Some(Ok(list)) => list.clone(),
        Some(Err(e)) => {
            return Check::fail(
                name,
                format!("cannot ask the possible placements: {e}"),
                fix,
            )
        }
        None => return Check::fail(name, "the driver does not offer this profile", fix),
    };
    let table = table_placements(spec);
    let mut sorted = driver.clone();
    sorted.sort_unstable();
    let mut problems = Vec::new();
    if sorted != table {
        problems.push(format!("placements: driver {sorted:?}, table {table:?}"));
    }
    let Some(&(start, _)) = driver.first() else {
        return Check::fail(name, "the driver offers no placement", fix);
    };
    let placement = u8::try_from(start)
        .ok()
        .and_then(|s| Geometry::of(model).spot_id(spec.shape, s));
    let Some(placement) = placement else {
        problems.push(format!("start {start} is not a placement of the table"));
        return Check::fail(name, problems.join("; "), fix);
    };
    match backend.create(gpu, placement) {
        Ok(uuid) => {
            problems.extend(verify(backend, gpu, model, placement, &uuid));
            if let Err(e) = backend.destroy(gpu, &uuid) {
                problems.push(format!("destroy {uuid}: {e}"));
            }
        }
        Err(e) => problems.push(format!("create at start {start}: {e}")),
    }
    problems.extend(clean_up(backend, gpu));
    if problems.is_empty() {
        Check::ok(
            name,
            format!("created at start {start} (placements as in the table), listed, access files present, destroyed"),
        )
    } else {
        Check::fail(name, problems.join("; "), fix)
    }
}

/// What is wrong with a freshly created instance.
fn verify(
    backend: &dyn Backend,
    gpu: u32,
    model: GpuModel,
    placement: SpotId,
    uuid: &str,
) -> Vec<String> {
    let mut problems = Vec::new();
    if !uuid.starts_with("MIG-") {
        problems.push(format!("uuid {uuid} does not start with MIG-"));
    }
    match backend.list(gpu) {
        Ok(list) => match list.iter().find(|i| i.uuid == uuid) {
            Some(i) if i.placement == placement => {}
            Some(i) => problems.push(format!(
                "listed at {}, created at {}",
                placement_text(model, i.placement),
                placement_text(model, placement)
            )),
            None => problems.push(format!("{uuid} is not listed after its create")),
        },
        Err(e) => problems.push(format!("list: {e}")),
    }
    match backend.access_files(gpu, uuid) {
        Ok(files) if files.is_empty() => problems.push("no access files".into()),
        Ok(files) => {
            for f in files.iter().filter(|f| !f.exists()) {
                problems.push(format!("access file {} does not exist", f.display()));
            }
        }
        Err(e) => problems.push(format!("access files: {e}")),
    }
    problems
}

/// Destroys whatever is left on the GPU (it was empty before the test).
fn clean_up(backend: &dyn Backend, gpu: u32) -> Vec<String> {
    match backend.list(gpu) {
        Ok(list) => list
            .iter()
            .filter_map(|i| {
                backend
                    .destroy(gpu, &i.uuid)
                    .err()
                    .map(|e| format!("left {} behind and cannot destroy it: {e}", i.uuid))
            })
            .collect(),
        Err(e) => vec![format!("list after the test: {e}")],
    }
}

/// The GPU is empty at the end, through the backend and through a fresh
/// survey (which also sees GPU instances without a compute instance).
fn empty_check(backend: &dyn Backend, config: &Config, gpu: u32) -> Check {
    let name = format!("hardware.gpu{gpu}.empty");
    let listed = backend.list(gpu).map(|l| l.len());
    let surveyed = survey(&config.nvml).map(|s| {
        s.gpus
            .iter()
            .find(|g| g.index == gpu)
            .and_then(|g| g.instances.as_ref().ok().map(Vec::len))
    });
    match (listed, surveyed) {
        (Ok(0), Ok(Some(0))) => Check::ok(name, format!("GPU {gpu} has no MIG instance after the test")),
        (listed, surveyed) => Check::fail(
            name,
            format!("GPU {gpu} after the test: listed {listed:?}, GPU instances {surveyed:?}"),
            format!("remove them by hand: `nvidia-smi mig -i {gpu} -dci` then `nvidia-smi mig -i {gpu} -dgi`"),
        ),
    }
}

/// `3g.20gb@4` for messages.
fn placement_text(model: GpuModel, id: SpotId) -> String {
    let p = Geometry::of(model).spot(id);
    format!("{}@{}", p.profile.name(), p.start)
}
