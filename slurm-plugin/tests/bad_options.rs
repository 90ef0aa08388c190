//! Bad SPANK inputs (issue 8 bad-input matrix, plugin side): `--mig-mem`,
//! `--mig-profile` and plugstack.conf arguments, each with the exact error
//! text the plugin prints (on sbatch's stderr at submit, or in the failed
//! job's output and slurmd.log on the node). Uses the plugin's rlib, so the
//! parsers are the very functions the SPANK callbacks call.
//!
//! `cargo test --release -p smartmig-spank --test bad_options -- --nocapture`
//! prints the table that docs/reliability.md shows.

use smartmig_mig::{requested_profile, GpuModel};
use smartmig_spank::args::PluginArgs;
use smartmig_spank::options::{check_profile_syntax, parse_mig_mem};

const HINT: &str = "expected a size such as 10G, 15GB, 20480M or 40 (GB)";

/// (area, case, what the parser returned, the error as the user reads it).
fn cases() -> Vec<(&'static str, String, Result<String, String>)> {
    let mut out = Vec::new();
    for v in [
        "", "lots", "15Q", "0G", "-5G", "1.2.3G", "5000G", "2T", "1e3G",
    ] {
        out.push((
            "--mig-mem (submit)",
            format!("--mig-mem={v}"),
            parse_mig_mem(v)
                .map(|g| format!("{g} GB"))
                .map_err(|e| e.to_string()),
        ));
    }
    for v in ["", "three", "5g.30gb", "3g", "9g.80gb", "1g.24gb+gfx"] {
        out.push((
            "--mig-profile (submit)",
            format!("--mig-profile={v}"),
            check_profile_syntax(v)
                .map(|k| format!("{k} slices"))
                .map_err(|e| e.to_string()),
        ));
    }
    // On the node smartmigd resolves the name on its GPU's model (the
    // plugin passes it in the allocate); the same function, from smartmig-mig.
    for (model, name, shards) in [
        (GpuModel::A100_40gb, "3g.40gb", 3u8),
        (GpuModel::A100_40gb, "3g.20gb", 2),
        (GpuModel::A100_40gb, "1g.10gb", 1),
        (GpuModel::B200_180gb, "1g.23gb+me", 1),
    ] {
        out.push((
            "--mig-profile (node)",
            format!("{name} with shard:{shards} on {model}"),
            requested_profile(model.spec(), name, shards)
                .map(smartmig_mig::ProfileSpec::name)
                .map_err(|e| e.to_string()),
        ));
    }
    for w in [
        "sokcet=/x",
        "socket",
        "socket=relative.sock",
        "socket=",
        "timeout=soon",
        "timeout=0",
        "timeout=-3",
        "timeout=nan",
        "timeout=7200",
        "on_failure=ignore",
        "oom_requeue=maybe",
        "oom_dir=oom",
    ] {
        out.push((
            "plugstack.conf",
            format!("`{w}`"),
            PluginArgs::parse(&[w])
                .map(|a| format!("{a:?}"))
                .map_err(|e| e.to_string()),
        ));
    }
    out
}

fn expected(case: &str) -> String {
    let e = match case {
        "--mig-mem=" => format!("--mig-mem needs a value ({HINT})"),
        "--mig-mem=lots" => format!("--mig-mem=lots: not a size ({HINT})"),
        "--mig-mem=15Q" => format!("--mig-mem=15Q: unknown unit ({HINT})"),
        "--mig-mem=0G" => format!("--mig-mem=0G: must be more than 0 ({HINT})"),
        "--mig-mem=-5G" => format!("--mig-mem=-5G: not a size ({HINT})"),
        "--mig-mem=1.2.3G" => format!("--mig-mem=1.2.3G: not a size ({HINT})"),
        "--mig-mem=5000G" => "--mig-mem=5000G: 5000 GB is more than any MIG-capable GPU has".into(),
        "--mig-mem=2T" => "--mig-mem=2T: 2048 GB is more than any MIG-capable GPU has".into(),
        "--mig-mem=1e3G" => format!("--mig-mem=1e3G: unknown unit ({HINT})"),
        "--mig-profile=" => "--mig-profile=: empty profile name".into(),
        "--mig-profile=three" => "--mig-profile=three: `three` does not contain a MIG profile of the form `<N>g.<M>gb` (e.g. `3g.20gb`)".into(),
        "--mig-profile=5g.30gb" => "--mig-profile=5g.30gb: no MIG-capable GPU model has this profile (e.g. A100-40GB: 1g.5gb 1g.10gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb)".into(),
        "--mig-profile=3g" => "--mig-profile=3g: `3g` does not contain a MIG profile of the form `<N>g.<M>gb` (e.g. `3g.20gb`)".into(),
        "--mig-profile=9g.80gb" => "--mig-profile=9g.80gb: no MIG-capable GPU model has this profile (e.g. A100-40GB: 1g.5gb 1g.10gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb)".into(),
        "--mig-profile=1g.24gb+gfx" => "--mig-profile=1g.24gb+gfx is a `+gfx` variant (with graphics APIs (OpenGL, Vulkan)); smartmig creates only the default profiles: ask for --mig-profile=1g.24gb (docs/user-guide.md, \"Profile variants\")".into(),
        "1g.23gb+me with shard:1 on b200-180gb" => "--mig-profile=1g.23gb+me is a `+me` variant (with media extensions: a video decoder, JPEG and OFA engine); smartmig creates only the default profiles: ask for --mig-profile=1g.23gb (docs/user-guide.md, \"Profile variants\")".into(),
        "3g.40gb with shard:3 on a100-40gb" => "--mig-profile=3g.40gb: `3g.40gb`: a100-40gb has no 3g profile with about 40 GB (it has 3g.20gb)".into(),
        "3g.20gb with shard:2 on a100-40gb" => "--mig-profile=3g.20gb has 3 compute slices but the job asked for --gres=shard:2; use --gres=shard:3".into(),
        "1g.10gb with shard:1 on a100-40gb" => "--mig-profile=1g.10gb has 1 compute slices but the job asked for --gres=shard:1; use --gres=shard:2 (1g.10gb's memory takes the room of a 2g.10gb, so it is billed shard:2; the job gets 1g.10gb)".into(),
        "3g.20gb with shard:3 on tpu-v9" => "the sidecar reports an unknown GPU model `tpu-v9`".into(),
        "`sokcet=/x`" => "unknown plugstack.conf argument `sokcet=/x` (known keys: socket, timeout, on_failure, oom_requeue, oom_dir, sidecar_wait, drain_on_unreachable, requeue, scontrol, slurm_conf, gpu_jobs)".into(),
        "`socket`" => "plugstack.conf argument `socket` is not KEY=VALUE (known keys: socket, timeout, on_failure, oom_requeue, oom_dir, sidecar_wait, drain_on_unreachable, requeue, scontrol, slurm_conf, gpu_jobs)".into(),
        "`socket=relative.sock`" => "plugstack.conf argument `socket=relative.sock`: socket must be an absolute path".into(),
        "`socket=`" => "plugstack.conf argument `socket=`: socket must be an absolute path".into(),
        "`timeout=soon`" => "plugstack.conf argument `timeout=soon`: timeout must be a number of seconds".into(),
        "`timeout=0`" => "plugstack.conf argument `timeout=0`: timeout must be in (0, 3600] seconds".into(),
        "`timeout=-3`" => "plugstack.conf argument `timeout=-3`: timeout must be in (0, 3600] seconds".into(),
        "`timeout=nan`" => "plugstack.conf argument `timeout=nan`: timeout must be in (0, 3600] seconds".into(),
        "`timeout=7200`" => "plugstack.conf argument `timeout=7200`: timeout must be in (0, 3600] seconds".into(),
        "`on_failure=ignore`" => "plugstack.conf argument `on_failure=ignore`: on_failure must be `fail` or `whole-gpu`".into(),
        "`oom_requeue=maybe`" => "plugstack.conf argument `oom_requeue=maybe`: oom_requeue must be `yes` or `no`".into(),
        "`oom_dir=oom`" => "plugstack.conf argument `oom_dir=oom`: oom_dir must be an absolute path".into(),
        other => panic!("no expected text for case {other}"),
    };
    e
}

#[test]
fn bad_spank_inputs_give_their_exact_error() {
    let mut failures = Vec::new();
    println!("| area | case | exact error |\n|---|---|---|");
    let all = cases();
    assert!(all.len() >= 6);
    for (area, case, got) in all {
        let want = expected(&case);
        match got {
            Ok(v) => failures.push(format!("{case}: accepted ({v}), want error {want:?}")),
            Err(e) => {
                println!("| {area} | {case} | `{}` |", e.replace('|', "\\|"));
                if e != want {
                    failures.push(format!("{case}:\n  got  {e:?}\n  want {want:?}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
