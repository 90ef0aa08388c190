//! End-to-end: `etc/slurm/job_submit.lua` in a real Slurm (22.05 on the
//! host, 24.11 or 26.05 with `SMARTMIG_SLURM_SERIES`; job_submit/lua
//! plugin, single node with two fake GPUs of 7 shards), with
//! the SPANK plugin loaded (its `--mig-mem`/`--mig-profile` reach slurmctld
//! in the job's spank_job_env) and, for the jobs that run, smartmigd's sim
//! backend (two A100-40GB).
//!
//! Every case here fails without the script: Slurm alone accepts
//! `shard:0`, `shard:8` (pends forever), smartmig options without shards
//! and whole GPUs (`--gres=gpu:N`, which would run on a GPU in MIG mode
//! without an instance, beside its shard jobs),
//! and bills `shard:5`/`shard:6`/`shard:1 --mig-mem=20G` as asked although
//! MIG builds a 7g/7g/3g instance, so a second job is placed on the slices
//! that instance takes and fails on the node. The table of `FORMS` (issue
//! 53) holds every way the three series take to ask for GPUs: each is
//! billed as what MIG builds or refused at submit, never accepted as a
//! whole GPU that then fails on the node.
//!
//! Needs root and a release build of the workspace (`scripts/test` does
//! both); fails, never skips, when Slurm or smartmigd cannot start.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Once;
use std::time::{Duration, Instant};

use serde_json::Value;
use smartmig_suite::{describe, fields, plugstack_line, repo_root, Sidecar, SlurmCluster};

const JOB_TIMEOUT: Duration = Duration::from_secs(60);

/// Installs the script in every cluster of this test binary:
/// `tests/slurm/cluster.sh` copies `SMARTMIG_SLURM_JOB_SUBMIT` next to
/// slurm.conf and sets `JobSubmitPlugins=lua`. Set once, before any cluster
/// starts, by whichever test comes first (every test here wants it).
fn with_job_submit_script() {
    static SET: Once = Once::new();
    SET.call_once(|| {
        let script = repo_root().join("etc/slurm/job_submit.lua");
        assert!(script.is_file(), "{} is missing", script.display());
        std::env::set_var("SMARTMIG_SLURM_JOB_SUBMIT", script);
    });
}

/// A cluster with the script and the plugin (`required`, socket in the
/// cluster directory; slurmd must see it at start for the release epilog).
fn cluster() -> SlurmCluster {
    with_job_submit_script();
    let cluster = SlurmCluster::up_with(|dir| {
        std::fs::write(dir.join("plugstack.conf"), plugstack_line(dir, ""))
            .expect("write plugstack.conf");
    });
    let conf = std::fs::read_to_string(cluster.slurm_conf()).unwrap_or_default();
    assert!(
        conf.lines().any(|l| l == "JobSubmitPlugins=lua")
            && cluster.dir().join("job_submit.lua").is_file(),
        "cluster.sh did not install the job_submit script:\n{conf}"
    );
    cluster
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `sbatch ARGS` must be refused, with `needle` in what the user sees.
fn assert_refused(cluster: &SlurmCluster, args: &[&str], needle: &str) {
    let mut all = args.to_vec();
    all.extend_from_slice(&["--hold", "--wrap", "true"]);
    let seen = cluster.sbatch_refused(&all);
    assert!(
        seen.contains(&format!("smartmig: {needle}")),
        "sbatch {args:?}: expected {needle:?} in: {seen}\n{}",
        cluster.log_tails()
    );
}

/// A field of `scontrol show job -o JOB` (e.g. `TresPerNode`). GRES in
/// TRES strings are spelled `gres:shard:3` by 22.05 and `gres/shard:3`
/// from 23.11 on: returned in 22.05's spelling.
fn job_field(cluster: &SlurmCluster, job: u32, key: &str) -> String {
    let out = cluster
        .command("scontrol")
        .args(["show", "job", "-o", &job.to_string()])
        .output()
        .expect("run scontrol");
    let prefix = format!("{key}=");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(&prefix))
        .unwrap_or("")
        .replace("gres/", "gres:")
}

/// Submits a held job (it never runs) and checks what Slurm bills and the
/// note the user got: `note` is `Some(text)` for a rewritten request.
fn assert_billed(cluster: &SlurmCluster, args: &[&str], tres: &str, note: Option<&str>) -> u32 {
    let mut all = args.to_vec();
    all.extend_from_slice(&["--hold", "--wrap", "true"]);
    let out = cluster.try_sbatch(&all);
    assert!(out.status.success(), "sbatch {args:?}: {}", describe(&out));
    let job: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no job id: {}", describe(&out)));
    let billed = job_field(cluster, job, "TresPerNode");
    assert_eq!(billed, tres, "sbatch {args:?}: job {job} billed {billed}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    match note {
        Some(n) => assert!(
            stderr.contains(&format!("sbatch: smartmig: {n}")),
            "sbatch {args:?}: expected note {n:?}, stderr: {stderr}"
        ),
        None => assert!(
            !stderr.contains("smartmig"),
            "sbatch {args:?}: unexpected note: {stderr}"
        ),
    }
    job
}

/// Refusals at submit (sbatch and srun) and the shard counts Slurm bills,
/// also after `scontrol update`. No job runs.
#[test]
fn submit_refuses_what_mig_cannot_build_and_bills_what_it_builds() {
    let start = Instant::now();
    let cluster = cluster();
    assert_refused(
        &cluster,
        &["--gres=shard:0"],
        "--gres=shard:0 asks for no MIG compute slice; ask for at least shard:1",
    );
    assert_refused(
        &cluster,
        &["--gres=shard:8"],
        "--gres=shard:8: a GPU has only 7 MIG compute slices (a100-40gb); ask for shard:7 (or --gres=gpu:1) for a whole GPU as one MIG instance",
    );
    // Whole GPUs (issue 42): one GPU per node, as one MIG instance.
    assert_refused(
        &cluster,
        &["--gres=gpu:2"],
        "--gres=gpu:2: on smartmig nodes a job gets one GPU per node, as one MIG instance; ask --gres=gpu:1 (billed as shard:7)",
    );
    // The message quotes Slurm's own TRES text: `gres:gpu:1` on 22.05,
    // `gres/gpu:1` from 23.11 (docs/slurm-integration.md, "Slurm series").
    let tres = if smartmig_suite::slurm_release() >= (23, 11) {
        "gres/gpu:1"
    } else {
        "gres:gpu:1"
    };
    assert_refused(
        &cluster,
        &["--gpus=1"],
        &format!("--gpus (tres_per_job={tres}): on smartmig nodes a job gets one GPU, as one MIG instance, per node; ask --gres=gpu:1"),
    );
    assert_refused(
        &cluster,
        &["--gres=gpu:3g.20gb:1"],
        "--gres=gpu:3g.20gb asks for a MIG device type; on smartmig nodes ask --gres=shard:3 --mig-profile=3g.20gb",
    );
    assert_refused(
        &cluster,
        &["--mig-mem=20G"],
        "--mig-mem needs --gres=shard:K",
    );
    assert_refused(
        &cluster,
        &["--mig-profile=3g.20gb"],
        "--mig-profile needs --gres=shard:K (e.g. --gres=shard:3 --mig-profile=3g.20gb)",
    );
    // Options the node's model cannot serve: without the script these are
    // accepted (the plugin knows no model at submit) and fail on the node.
    assert_refused(
        &cluster,
        &["--gres=shard:3", "--mig-profile=3g.40gb"],
        "--mig-profile=3g.40gb: a100-40gb has no 3g profile with about 40 GB (it has 3g.20gb)",
    );
    assert_refused(
        &cluster,
        &["--gres=shard:1", "--mig-mem=50G"],
        "--mig-mem=50G: 50 GB is more than any a100-40gb profile",
    );
    assert_refused(
        &cluster,
        &["--gres=shard:5", "--mig-profile=4g.20gb"],
        "--mig-profile=4g.20gb has 4 compute slices but the job asks for shard:5",
    );
    // A memory variant is billed its room (issue 55), no more.
    assert_refused(
        &cluster,
        &["--gres=shard:3", "--mig-profile=1g.10gb"],
        "--mig-profile=1g.10gb has 1 compute slices but the job asks for shard:3; use --gres=shard:2",
    );
    // srun and salloc pass the options in spank_job_env too (no batch
    // environment): refused before anything runs.
    let out = cluster
        .command("timeout")
        .args(["30", "srun", "--mig-mem=20G", "true"])
        .output()
        .expect("run srun");
    assert!(
        !out.status.success(),
        "srun --mig-mem without shards ran: {}",
        describe(&out)
    );
    assert!(
        text(&out).contains("smartmig: --mig-mem needs --gres=shard:K"),
        "srun: {}",
        describe(&out)
    );

    let mut held = vec![
        assert_billed(
            &cluster,
            &["--gres=shard:5"],
            "gres:shard:7",
            Some("shard:5 billed as shard:7 (no 5-slice MIG profile on a100-40gb)"),
        ),
        assert_billed(
            &cluster,
            &["--gres=shard:6"],
            "gres:shard:7",
            Some("shard:6 billed as shard:7"),
        ),
        assert_billed(
            &cluster,
            &["--gres=shard:1", "--mig-mem=20G"],
            "gres:shard:3",
            Some("shard:1 with --mig-mem=20G billed as shard:3 (a100-40gb: 20 GB needs 3g.20gb)"),
        ),
        assert_billed(
            &cluster,
            &["--gres=shard:1", "--mig-profile=4g.20gb"],
            "gres:shard:4",
            Some("shard:1 with --mig-profile=4g.20gb billed as shard:4"),
        ),
        // Already what MIG builds: untouched, no note.
        assert_billed(
            &cluster,
            &["--gres=shard:3", "--mig-mem=15G"],
            "gres:shard:3",
            None,
        ),
        // Issue 55: memory that needs a memory variant (1g.10gb: 1 compute
        // slice, 2 memory slices) is billed and built as the default
        // profile of the room it takes, else Slurm offers a shard whose
        // memory is gone.
        assert_billed(
            &cluster,
            &["--gres=shard:1", "--mig-mem=8G"],
            "gres:shard:2",
            Some("shard:1 with --mig-mem=8G billed as shard:2 (a100-40gb: 8 GB needs 1g.10gb's memory, which takes the room of a 2g.10gb; the job gets 2g.10gb)"),
        ),
        assert_billed(
            &cluster,
            &["--gres=shard:1", "--mig-mem=10G"],
            "gres:shard:2",
            Some("shard:1 with --mig-mem=10G billed as shard:2"),
        ),
        assert_billed(
            &cluster,
            &["--gres=shard:1", "--mig-profile=1g.10gb"],
            "gres:shard:2",
            Some("shard:1 with --mig-profile=1g.10gb billed as shard:2 (a100-40gb: 1g.10gb's memory takes the room of a 2g.10gb; the job gets 1g.10gb)"),
        ),
        assert_billed(
            &cluster,
            &["--gres=shard:2", "--mig-profile=1g.10gb"],
            "gres:shard:2",
            None,
        ),
        assert_billed(
            &cluster,
            &["--gres=shard:1", "--mig-mem=5G"],
            "gres:shard:1",
            None,
        ),
        // A whole GPU is all of its shards, served as one 7g instance.
        assert_billed(
            &cluster,
            &["--gres=gpu:1"],
            "gres:shard:7",
            Some("--gres=gpu:1 billed as shard:7: a whole a100-40gb as one 7g.40gb MIG instance"),
        ),
        assert_billed(
            &cluster,
            &["--gpus-per-node=1", "--mig-mem=30G"],
            "gres:shard:7",
            Some("--gres=gpu:1 billed as shard:7"),
        ),
        // Jobs without GPUs are not touched.
        assert_billed(&cluster, &["-n1"], "", None),
    ];

    // scontrol update of a pending job goes through the same checks
    // (Slurm 22.05 drops user messages there; slurmctld.log has them).
    let job = assert_billed(&cluster, &["--gres=shard:2"], "gres:shard:2", None);
    held.push(job);
    let update = |gres: &str| {
        cluster
            .command("scontrol")
            .args(["update", &format!("jobid={job}"), &format!("gres={gres}")])
            .output()
            .expect("run scontrol update")
    };
    let out = update("shard:5");
    assert!(out.status.success(), "scontrol update: {}", describe(&out));
    assert_eq!(job_field(&cluster, job, "TresPerNode"), "gres:shard:7");
    let out = update("shard:0");
    assert!(
        !out.status.success(),
        "update to shard:0 accepted: {}",
        describe(&out)
    );
    assert_eq!(job_field(&cluster, job, "TresPerNode"), "gres:shard:7");
    let log = std::fs::read_to_string(cluster.dir().join("log/slurmctld.log")).unwrap_or_default();
    assert!(
        log.contains(&format!(
            "smartmig: refused update of job {job}: --gres=shard:0"
        )),
        "no refusal in slurmctld.log:\n{}",
        cluster.log_tails()
    );

    let ids: Vec<String> = held.iter().map(u32::to_string).collect();
    let out = cluster
        .command("scancel")
        .args(&ids)
        .output()
        .expect("run scancel");
    assert!(out.status.success(), "scancel: {}", describe(&out));
    eprintln!("submit checks done in {:?}", start.elapsed());
}

// ---------------------------------------------------------------------------
// Every way to ask for GPUs (issue 53): billed or refused at submit, never
// accepted and then failed on the node.

/// Which series' Slurm takes a form at all: where it does not, sbatch or
/// slurmctld refuses it whatever the script says.
#[derive(Clone, Copy, Debug)]
enum Takes {
    /// Every series.
    All,
    /// This release and later; older ones refuse the form themselves
    /// (22.05 has no `--tres-per-task` and no `gpu=1` spelling).
    Since(u32, u32),
    /// Releases before this one; from it on Slurm refuses the form itself
    /// (`--gres=gres:gpu:1`, `--cpus-per-gpu` without GPUs).
    Before(u32, u32),
}

impl Takes {
    fn on(self, release: (u32, u32)) -> bool {
        match self {
            Takes::All => true,
            Takes::Since(major, minor) => release >= (major, minor),
            Takes::Before(major, minor) => release < (major, minor),
        }
    }
}

/// What a form must come to where Slurm takes it.
#[derive(Clone, Copy, Debug)]
enum Outcome {
    /// Accepted, with this `TresPerNode` (22.05's spelling, `gres:`) and
    /// this note to the user (`None`: untouched, no smartmig note); no GPU
    /// left in `TresPerJob`/`TresPerSocket`/`TresPerTask`.
    Billed(&'static str, Option<&'static str>),
    /// Refused by the script: one `error: smartmig: ` line the user saw
    /// holds every one of these words.
    Refused(&'static [&'static str]),
}

struct Form {
    args: &'static [&'static str],
    takes: Takes,
    outcome: Outcome,
}

const fn form(args: &'static [&'static str], takes: Takes, outcome: Outcome) -> Form {
    Form {
        args,
        takes,
        outcome,
    }
}

const WHOLE: Option<&str> =
    Some("billed as shard:7: a whole a100-40gb as one 7g.40gb MIG instance");
const ONE_GPU: &str = "on smartmig nodes a job gets one GPU, as one MIG instance, per node; ask --gres=gpu:1 for a whole GPU or --gres=shard:K for K compute slices";
const PER_TASK: &[&str] = &["--gpus-per-task/--tres-per-task (tres_per_task=", ONE_GPU];
const GPUS: &[&str] = &["--gpus (tres_per_job=", ONE_GPU];
const SHARDS_PER_TASK: &[&str] = &[
    "shards must be requested per node with --gres=shard:K",
    "not with --tres-per-task (tres_per_task=",
];
const CPUS_PER_GPU: &[&str] = &[
    "--cpus-per-gpu=2 (cpus_per_tres=",
    "ask --mincpus=2 (CPUs per node) or --cpus-per-task=2 (-c, per task) with --gres=gpu:1 instead",
];

/// The forms: GRES spellings of 22.05 (`gres:gpu:1`) and of 24.11/26.05
/// (`gres/gpu:1`, `gres/gpu=1`), typed ones, the `--gpus*` options,
/// `--tres-per-task` (24.11+), and the per-GPU options that cannot follow a
/// GPU billed as shards.
const FORMS: &[Form] = &[
    // A whole GPU per node: billed as all of its shards.
    form(
        &["--gres=gpu:1"],
        Takes::All,
        Outcome::Billed("gres:shard:7", WHOLE),
    ),
    form(
        &["--gres=gpu"],
        Takes::All,
        Outcome::Billed("gres:shard:7", WHOLE),
    ),
    form(
        &["--gpus-per-node=1"],
        Takes::All,
        Outcome::Billed("gres:shard:7", WHOLE),
    ),
    form(
        &["--gres=gres:gpu:1"],
        Takes::Before(24, 11),
        Outcome::Billed("gres:shard:7", WHOLE),
    ),
    form(
        &["--gres=gres/gpu:1"],
        Takes::Since(24, 11),
        Outcome::Billed("gres:shard:7", WHOLE),
    ),
    form(
        &["--gres=gpu=1"],
        Takes::Since(24, 11),
        Outcome::Billed("gres:shard:7", Some("--gres=gpu=1 billed as shard:7")),
    ),
    form(
        &["--gres=gpu:a100:1"],
        Takes::All,
        Outcome::Billed(
            "gres:shard:a100:7",
            Some("--gres=gpu:a100:1 billed as shard:a100:7"),
        ),
    ),
    form(
        &["--gpus-per-node=a100:1"],
        Takes::All,
        Outcome::Billed(
            "gres:shard:a100:7",
            Some("--gres=gpu:a100:1 billed as shard:a100:7"),
        ),
    ),
    form(
        &["--gres=gpu:a100=1"],
        Takes::All,
        Outcome::Billed(
            "gres:shard:a100:7",
            Some("--gres=gpu:a100=1 billed as shard:a100:7"),
        ),
    ),
    // 24.11+ put --cpus-per-task in tres_per_task (`cpu=2`): not a GPU.
    form(
        &["--gres=gpu:1", "--cpus-per-task=2"],
        Takes::All,
        Outcome::Billed("gres:shard:7", WHOLE),
    ),
    // Shards, in both separators.
    form(
        &["--gres=shard:5"],
        Takes::All,
        Outcome::Billed(
            "gres:shard:7",
            Some("shard:5 billed as shard:7 (no 5-slice MIG profile on a100-40gb)"),
        ),
    ),
    form(
        &["--gres=shard=5"],
        Takes::Since(24, 11),
        Outcome::Billed(
            "gres:shard:7",
            Some("shard:5 billed as shard:7 (no 5-slice MIG profile on a100-40gb)"),
        ),
    ),
    form(
        &["--gres=shard=2"],
        Takes::Since(24, 11),
        Outcome::Billed("gres:shard=2", None),
    ),
    form(
        &["--gres=shard:2", "--cpus-per-task=2"],
        Takes::All,
        Outcome::Billed("gres:shard:2", None),
    ),
    // No GPU at all: untouched.
    form(
        &["--tres-per-task=cpu=2", "-n", "1"],
        Takes::Since(24, 11),
        Outcome::Billed("", None),
    ),
    form(
        &["--cpus-per-gpu=2"],
        Takes::Before(24, 11),
        Outcome::Billed("", None),
    ),
    // More than one GPU per node, MIG device types.
    form(
        &["--gres=gpu:2"],
        Takes::All,
        Outcome::Refused(&["--gres=gpu:2: on smartmig nodes a job gets one GPU per node"]),
    ),
    form(
        &["--gpus-per-node=2"],
        Takes::All,
        Outcome::Refused(&["--gres=gpu:2: on smartmig nodes a job gets one GPU per node"]),
    ),
    form(
        &["--gres=gpu=2"],
        Takes::Since(24, 11),
        Outcome::Refused(&["--gres=gpu=2: on smartmig nodes a job gets one GPU per node"]),
    ),
    form(
        &["--gres=gpu:3g.20gb:1"],
        Takes::All,
        Outcome::Refused(&["--gres=gpu:3g.20gb asks for a MIG device type"]),
    ),
    // GPUs per job, socket or task.
    form(&["--gpus=1"], Takes::All, Outcome::Refused(GPUS)),
    form(&["--gpus=a100:1"], Takes::All, Outcome::Refused(GPUS)),
    form(
        &["--gpus=1", "--ntasks-per-gpu=1"],
        Takes::All,
        Outcome::Refused(GPUS),
    ),
    form(
        &["--cpus-per-gpu=2", "--gpus=1"],
        Takes::All,
        Outcome::Refused(GPUS),
    ),
    form(
        &["--gpus-per-socket=1", "--sockets-per-node=1"],
        Takes::All,
        Outcome::Refused(&["--gpus-per-socket (tres_per_socket=", ONE_GPU]),
    ),
    form(
        &["--gpus-per-task=1", "-n", "1"],
        Takes::All,
        Outcome::Refused(PER_TASK),
    ),
    form(
        &["--gpus-per-task=1", "-n", "2"],
        Takes::All,
        Outcome::Refused(PER_TASK),
    ),
    form(
        &["--gpus-per-task=1", "-n", "1", "--cpus-per-task=2"],
        Takes::All,
        Outcome::Refused(PER_TASK),
    ),
    form(
        &["--gpus-per-task=1", "--gres=gpu:1", "-n", "1"],
        Takes::All,
        Outcome::Refused(PER_TASK),
    ),
    form(
        &["--cpus-per-gpu=2", "--gpus-per-task=1", "-n", "1"],
        Takes::All,
        Outcome::Refused(PER_TASK),
    ),
    form(
        &["--tres-per-task=gres/gpu:1", "-n", "1"],
        Takes::Since(24, 11),
        Outcome::Refused(PER_TASK),
    ),
    form(
        &["--tres-per-task=gres/gpu=1", "-n", "1"],
        Takes::Since(24, 11),
        Outcome::Refused(PER_TASK),
    ),
    form(
        &["--tres-per-task=gres:gpu:1", "-n", "1"],
        Takes::Since(24, 11),
        Outcome::Refused(PER_TASK),
    ),
    form(
        &["--tres-per-task=gres:gpu=1", "-n", "1"],
        Takes::Since(24, 11),
        Outcome::Refused(PER_TASK),
    ),
    form(
        &["--tres-per-task=gres/gpu:a100=1", "-n", "1"],
        Takes::Since(24, 11),
        Outcome::Refused(PER_TASK),
    ),
    form(
        &["--tres-per-task=gres/shard:2", "-n", "1"],
        Takes::Since(24, 11),
        Outcome::Refused(SHARDS_PER_TASK),
    ),
    form(
        &["--tres-per-task=gres/shard=2", "-n", "1"],
        Takes::Since(24, 11),
        Outcome::Refused(SHARDS_PER_TASK),
    ),
    // Per-GPU options beside a whole GPU: Slurm would refuse the job once it
    // is billed as shards ("Invalid generic resource (gres) specification").
    form(
        &["--cpus-per-gpu=2", "--gres=gpu:1"],
        Takes::All,
        Outcome::Refused(CPUS_PER_GPU),
    ),
    form(
        &["--cpus-per-gpu=2", "--gpus-per-node=1"],
        Takes::All,
        Outcome::Refused(CPUS_PER_GPU),
    ),
    form(
        &["--mem-per-gpu=1G", "--gres=gpu:1"],
        Takes::All,
        Outcome::Refused(&[
            "--mem-per-gpu=1024M (mem_per_tres=",
            "ask --mem=1024M with --gres=gpu:1 instead",
        ]),
    ),
    form(
        &["--gres=gpu:1", "--ntasks-per-gpu=1"],
        Takes::All,
        Outcome::Refused(&[
            "--ntasks-per-gpu=1: ",
            "ask --ntasks-per-node=1 with --gres=gpu:1 instead",
        ]),
    ),
    form(
        &["--gres=gpu:1", "--gpu-freq=high"],
        Takes::All,
        Outcome::Refused(&["--gpu-freq (tres_freq=", "submit without --gpu-freq"]),
    ),
];

/// Submits one form (held) and checks it against its row. Returns a
/// description of what went wrong, and the id of a job it left held.
fn check_form(
    cluster: &SlurmCluster,
    release: (u32, u32),
    row: &Form,
) -> (Option<String>, Option<u32>) {
    let mut all = row.args.to_vec();
    all.extend_from_slice(&["--hold", "--wrap", "true"]);
    let out = cluster.try_sbatch(&all);
    let seen = text(&out);
    let job: Option<u32> = String::from_utf8_lossy(&out.stdout).trim().parse().ok();
    let args = row.args;
    if !row.takes.on(release) {
        // Slurm itself refuses it on this series: refused at submit,
        // whoever said so.
        return if out.status.success() {
            (Some(format!("{args:?}: accepted (job {job:?}), expected refused at submit by Slurm or the script: {seen}")), job)
        } else {
            (None, None)
        };
    }
    match row.outcome {
        Outcome::Refused(words) => {
            if out.status.success() {
                return (
                    Some(format!(
                        "{args:?}: accepted (job {job:?}), expected refused with {words:?}: {seen}"
                    )),
                    job,
                );
            }
            // One line of the script's, with all the words.
            let said = seen
                .lines()
                .any(|l| l.contains("error: smartmig: ") && words.iter().all(|w| l.contains(w)));
            if !said {
                return (
                    Some(format!(
                        "{args:?}: refused, but no `error: smartmig: ` line with all of {words:?}: {seen}"
                    )),
                    None,
                );
            }
            (None, None)
        }
        Outcome::Billed(tres, note) => {
            let Some(job) = job.filter(|_| out.status.success()) else {
                return (
                    Some(format!(
                        "{args:?}: refused, expected billed as {tres:?}: {seen}"
                    )),
                    None,
                );
            };
            let record = cluster
                .job_records(job)
                .into_iter()
                .next()
                .unwrap_or_default();
            let get = |key: &str| {
                record
                    .get(key)
                    .map_or(String::new(), |v| v.replace("gres/", "gres:"))
            };
            let mut problems = Vec::new();
            let billed = get("TresPerNode");
            if billed != tres {
                problems.push(format!("TresPerNode={billed}, expected {tres:?}"));
            }
            for key in ["TresPerJob", "TresPerSocket", "TresPerTask"] {
                let value = get(key);
                if value.contains("gpu") || value.contains("shard") {
                    problems.push(format!("{key}={value} asks for GPUs beside TresPerNode"));
                }
            }
            let stderr = String::from_utf8_lossy(&out.stderr);
            match note {
                Some(n)
                    if !stderr
                        .lines()
                        .any(|l| l.starts_with("sbatch: smartmig: ") && l.contains(n)) =>
                {
                    problems.push(format!("expected the note {n:?}"));
                }
                None if stderr.contains("smartmig") => {
                    problems.push("unexpected smartmig note".to_string());
                }
                _ => {}
            }
            if problems.is_empty() {
                (None, Some(job))
            } else {
                (
                    Some(format!(
                        "{args:?} (job {job}): {}; stderr: {stderr}",
                        problems.join("; ")
                    )),
                    Some(job),
                )
            }
        }
    }
}

/// Issue 53: every way Slurm 22.05, 24.11 and 26.05 take to ask for GPUs
/// is billed as what MIG builds or refused at submit with a message naming
/// the option and what to ask instead. Before, 24.11 and 26.05 accepted
/// `--gpus-per-task=1` (`TresPerTask=gres/gpu=1`), `--gres=gpu=1` and
/// `--tres-per-task=gres/shard=2` untouched (the script read only the
/// `gres/gpu:1` spelling), and the jobs failed on the node. All rows run;
/// the failures are reported together.
#[test]
fn every_way_to_ask_for_gpus_is_billed_or_refused_at_submit() {
    let start = Instant::now();
    let cluster = cluster();
    let release = smartmig_suite::slurm_release();
    let mut failures = Vec::new();
    let mut held = Vec::new();
    let (mut by_script, mut by_slurm, mut billed) = (0, 0, 0);
    for row in FORMS {
        let (failure, job) = check_form(&cluster, release, row);
        held.extend(job);
        match (failure, row.takes.on(release), row.outcome) {
            (Some(f), _, _) => failures.push(f),
            (None, false, _) => by_slurm += 1,
            (None, true, Outcome::Refused(_)) => by_script += 1,
            (None, true, Outcome::Billed(..)) => billed += 1,
        }
    }
    if !held.is_empty() {
        let ids: Vec<String> = held.iter().map(u32::to_string).collect();
        let out = cluster
            .command("scancel")
            .args(&ids)
            .output()
            .expect("run scancel");
        assert!(out.status.success(), "scancel: {}", describe(&out));
    }
    assert!(
        failures.is_empty(),
        "Slurm {}.{:02}: {} of {} forms wrong:\n{}\n{}",
        release.0,
        release.1,
        failures.len(),
        FORMS.len(),
        failures.join("\n"),
        cluster.log_tails()
    );
    eprintln!(
        "Slurm {}.{:02}: {} forms: {billed} billed, {by_script} refused by the script, {by_slurm} refused by Slurm itself ({:?})",
        release.0,
        release.1,
        FORMS.len(),
        start.elapsed()
    );
}

// ---------------------------------------------------------------------------
// Jobs that run: Slurm's placement now matches the instances MIG builds.

/// A job body that prints what the job saw and waits for `DIR/go.all`
/// (at most ~30 s), so the test can look at two jobs running side by side.
fn held_job(dir: &Path) -> String {
    format!(
        "echo CVD=$CUDA_VISIBLE_DEVICES PROFILE=$SMARTMIG_PROFILE GPUS=$SLURM_JOB_GPUS; \
         for i in $(seq 300); do [ -e {g}/go.all ] && break; sleep 0.1; done; echo END",
        g = dir.display()
    )
}

/// Submits a held job as the ordinary job user; returns (id, output path).
fn submit(cluster: &SlurmCluster, dir: &Path, name: &str, args: &[&str]) -> (u32, PathBuf) {
    let out = dir.join(format!("{name}.out"));
    let job = cluster.sbatch_as_job_user(&out, args, &held_job(dir));
    (job, out)
}

/// Waits until the job's output has its first line (it got its instance or
/// failed trying), or it ended.
fn wait_started(cluster: &SlurmCluster, job: u32, out: &Path) -> String {
    smartmig_suite::Wait::new(format!("job {job} to start"), JOB_TIMEOUT)
        .every(Duration::from_millis(50))
        .context(|| cluster.log_tails())
        .until(|| {
            let text = std::fs::read_to_string(out).unwrap_or_default();
            if text.contains("CVD=") {
                return Ok(text);
            }
            let state = cluster.job_state(job).unwrap_or_default();
            assert!(
                !matches!(state.as_str(), "FAILED" | "CANCELLED" | "COMPLETED"),
                "job {job} ended {state} before it started: {text:?}\n{}",
                cluster.log_tails()
            );
            Err((state, text))
        })
}

/// Memory slices of the A100-40GB profiles (sidecar/mig/src/models.rs).
fn memory_slices(profile: &str) -> u64 {
    match profile {
        "1g.5gb" => 1,
        "1g.10gb" | "2g.10gb" => 2,
        "3g.20gb" | "4g.20gb" => 4,
        "7g.40gb" => 8,
        other => panic!("unexpected profile {other}"),
    }
}

/// Runs two jobs side by side: the first must be running on its instance
/// before the second is submitted. Both must get their instances (no
/// FAILED), the instances the sidecar reports must be disjoint, and both
/// jobs must COMPLETE. Returns the two profiles.
fn side_by_side(
    cluster: &SlurmCluster,
    sidecar: &Sidecar,
    name: &str,
    first: &[&str],
    second: &[&str],
) -> (String, String) {
    let dir = cluster.shared_dir().join(name);
    std::fs::create_dir_all(&dir).expect("create job dir");
    let mut perms = std::fs::metadata(&dir).expect("stat job dir").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o1777);
    std::fs::set_permissions(&dir, perms).expect("chmod job dir");

    let (a, a_out) = submit(cluster, &dir, "first", first);
    let a_text = wait_started(cluster, a, &a_out);
    let (b, b_out) = submit(cluster, &dir, "second", second);
    let b_text = wait_started(cluster, b, &b_out);
    let (fa, fb) = (fields(&a_text), fields(&b_text));
    for (job, f, args, text) in [(a, &fa, first, &a_text), (b, &fb, second, &b_text)] {
        let cvd = f.get("CVD").map(String::as_str).unwrap_or("");
        assert!(
            cvd.starts_with("MIG-"),
            "job {job} ({args:?}) got no MIG instance: {text:?}\n{}",
            cluster.log_tails()
        );
    }

    // Both hold their instances now: they must not overlap.
    let status = sidecar.status();
    let held: Vec<Value> = Sidecar::instances(&status)
        .into_iter()
        .filter(|i| i["job_id"].as_u64().is_some())
        .collect();
    let find = |job: u32| -> (u64, u64, u64, String) {
        let i = held
            .iter()
            .find(|i| i["job_id"].as_u64() == Some(u64::from(job)))
            .unwrap_or_else(|| panic!("job {job} holds no instance: {status:#}"));
        let profile = i["profile"].as_str().unwrap_or("").to_string();
        let gpu = i["gpu"].as_u64().unwrap_or(u64::MAX);
        let start = i["start"].as_u64().unwrap_or(u64::MAX);
        (gpu, start, start + memory_slices(&profile), profile)
    };
    let (ia, ib) = (find(a), find(b));
    assert!(
        ia.0 != ib.0 || ia.2 <= ib.1 || ib.2 <= ia.1,
        "instances of jobs {a} ({ia:?}) and {b} ({ib:?}) overlap: {status:#}"
    );
    for (job, f, inst) in [(a, &fa, &ia), (b, &fb, &ib)] {
        assert_eq!(
            f.get("PROFILE"),
            Some(&inst.3),
            "job {job} saw another profile than the sidecar reports: {status:#}"
        );
        assert_eq!(
            f.get("GPUS").and_then(|g| g.parse::<u64>().ok()),
            Some(inst.0),
            "job {job}: Slurm's GPU and the instance's GPU differ: {status:#}"
        );
    }

    std::fs::write(dir.join("go.all"), b"").expect("write go file");
    for (job, out) in [(a, &a_out), (b, &b_out)] {
        let state = cluster.wait_job(job, JOB_TIMEOUT);
        assert_eq!(
            state,
            "COMPLETED",
            "job {job}: {:?}\n{}",
            std::fs::read_to_string(out).unwrap_or_default(),
            cluster.log_tails()
        );
    }
    (ia.3, ib.3)
}

/// "5 then 2": `shard:5` is billed as the 7 slices its 7g instance takes,
/// so Slurm puts a `shard:2` job on the other GPU, where it gets its
/// instance (without the script Slurm puts it next to the 7g instance and
/// it fails). Then `shard:1 --mig-mem=20G` (a 3g.20gb instance) next to
/// `shard:6` (7g): both run, on different GPUs. Then `shard:1
/// --mig-mem=8G` (billed shard:2, built 2g.10gb) next to `shard:1
/// --mig-profile=1g.10gb` (billed shard:2, built 1g.10gb). Then a whole GPU next to
/// `shard:2`, in the `=` spelling where the series takes it.
#[test]
fn rounded_jobs_run_side_by_side_without_failures() {
    let start = Instant::now();
    let cluster = cluster();
    let sidecar = Sidecar::start(cluster.dir(), "allocate_wait_s = 10");

    let (p5, p2) = side_by_side(
        &cluster,
        &sidecar,
        "five-two",
        &["--gres=shard:5"],
        &["--gres=shard:2"],
    );
    assert_eq!((p5.as_str(), p2.as_str()), ("7g.40gb", "2g.10gb"));

    let (p6, p1) = side_by_side(
        &cluster,
        &sidecar,
        "six-mem",
        &["--gres=shard:6"],
        &["--gres=shard:1", "--mig-mem=20G"],
    );
    assert_eq!((p6.as_str(), p1.as_str()), ("7g.40gb", "3g.20gb"));

    // Issue 55: `shard:1 --mig-mem=8G` is billed shard:2 and built as the
    // 2g.10gb whose room its memory takes; an explicit 1g.10gb is billed
    // the same room and built as asked.
    let (pm, pp) = side_by_side(
        &cluster,
        &sidecar,
        "room",
        &["--gres=shard:1", "--mig-mem=8G"],
        &["--gres=shard:1", "--mig-profile=1g.10gb"],
    );
    assert_eq!((pm.as_str(), pp.as_str()), ("2g.10gb", "1g.10gb"));

    // Issue 53: the `=` spelling that 24.11 and 26.05 take (`--gres=gpu=1`,
    // `--gres=shard=2`) is billed and runs like the `:` one: a whole GPU as
    // its 7g instance, two shards beside it on the other GPU.
    let (whole, two) = if smartmig_suite::slurm_release() >= (24, 11) {
        ("--gres=gpu=1", "--gres=shard=2")
    } else {
        ("--gres=gpu:1", "--gres=shard:2")
    };
    let (pw, p2) = side_by_side(&cluster, &sidecar, "whole-two", &[whole], &[two]);
    assert_eq!((pw.as_str(), p2.as_str()), ("7g.40gb", "2g.10gb"));

    assert!(
        cluster.wait_node_state("idle", Duration::from_secs(10)),
        "node not idle after the jobs: {}",
        cluster.node_state()
    );
    eprintln!("side-by-side jobs done in {:?}", start.elapsed());
}

// ---------------------------------------------------------------------------
// Whole-GPU interactive jobs (issue 56, item 4).

/// Runs `PROGRAM ARGS` (srun, salloc) for at most 60 s; (success, output).
fn interactive(cluster: &SlurmCluster, program: &str, args: &[&str]) -> (bool, String) {
    let out = cluster
        .command("timeout")
        .arg("60")
        .arg(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    (out.status.success(), describe(&out))
}

/// `srun --gres=gpu:1 CMD` runs on one whole-GPU instance where srun's step
/// asks for the job's billed shards (Slurm 23.02 and later). Slurm 22.05's
/// srun asks its step for the `gpu:1` it was given, which the job billed as
/// `shard:7` does not have, and Slurm refused the step after granting the
/// job ("Step requested GRES (gpu:(null)) not found in the job"); there the
/// script refuses it at submit, naming what to ask instead, and both of
/// those (`srun --gres=shard:7`, `salloc --gres=gpu:1` with `srun` inside)
/// run on the 7g.40gb.
#[test]
fn srun_of_a_whole_gpu_runs_or_is_refused_with_what_to_ask() {
    let cluster = cluster();
    let _sidecar = Sidecar::start(cluster.dir(), "allocate_wait_s = 10");
    let show = "echo PROFILE=$SMARTMIG_PROFILE";
    let asks_own_gres = smartmig_suite::slurm_release() < (23, 2);

    let (ok, seen) = interactive(&cluster, "srun", &["--gres=gpu:1", "sh", "-c", show]);
    if asks_own_gres {
        assert!(!ok, "srun --gres=gpu:1 ran on 22.05: {seen}");
        assert!(
            seen.contains(
                "smartmig: srun --gres=gpu:1 cannot start on this Slurm (before 23.02): it would be billed as shard:7, but srun asks its step for the GPU itself, which Slurm then refuses; ask srun --gres=shard:7 (a whole a100-40gb as one 7g.40gb MIG instance), or salloc --gres=gpu:1 and srun without --gres inside it"
            ),
            "{seen}\n{}",
            cluster.log_tails()
        );
        assert!(
            !seen.contains("not found in the job"),
            "a job was granted and its step refused: {seen}"
        );
    } else {
        assert!(ok, "srun --gres=gpu:1: {seen}\n{}", cluster.log_tails());
        assert!(seen.contains("billed as shard:7"), "{seen}");
        assert!(seen.contains("PROFILE=7g.40gb"), "{seen}");
    }

    // What the refusal asks for runs on every series.
    let (ok, seen) = interactive(&cluster, "srun", &["--gres=shard:7", "sh", "-c", show]);
    assert!(ok, "srun --gres=shard:7: {seen}\n{}", cluster.log_tails());
    assert!(seen.contains("PROFILE=7g.40gb"), "{seen}");
    let (ok, seen) = interactive(
        &cluster,
        "salloc",
        &["--gres=gpu:1", "srun", "sh", "-c", show],
    );
    assert!(
        ok,
        "salloc --gres=gpu:1 srun: {seen}\n{}",
        cluster.log_tails()
    );
    assert!(seen.contains("billed as shard:7"), "{seen}");
    assert!(seen.contains("PROFILE=7g.40gb"), "{seen}");
}
