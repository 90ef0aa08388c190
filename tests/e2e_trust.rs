//! End-to-end (issue 42, items 4 and 5): no variable a user sets changes
//! the instance a step gets, and a whole-GPU job never shares a GPU
//! unisolated with shard jobs.
//!
//! A real Slurm 22.05 node *without* `job_submit.lua` (so `--gres=gpu:N`
//! jobs reach the node as they would on a site that has not installed
//! it), the SPANK plugin and smartmigd (sim backend, Slurm queries on).
//! Every attack runs as the ordinary test user (`smartmig_suite::job_user`):
//!
//! - `SLURM_SHARDS_ON_NODE=3 sbatch --gres=gpu:1` (batch step) and
//!   `SLURM_SHARDS_ON_NODE=7 srun --gres=gpu:1` (srun step): Slurm keeps the
//!   user's variable for `gpu` jobs; before issue 42 they got a 3g.20gb and
//!   a 7g.40gb instance, reshaping the GPU for them;
//! - the same with `gpu_jobs=allow` (the plugin leaves honest whole-GPU
//!   steps alone there): the forged claim still reaches smartmigd, which
//!   checks slurmctld's record, refuses and logs it, and builds nothing;
//! - a shard job with forged GPU variables (`SLURM_JOB_GPUS=1`,
//!   `CUDA_VISIBLE_DEVICES=1`) and a forged count: Slurm overwrites them;
//! - `SLURM_SHARDS_ON_NODE=7 CUDA_VISIBLE_DEVICES=1 sbatch` without GRES:
//!   Slurm removes the variables, the plugin is not involved;
//! - a `gpu` job submitted from inside a `shard:2` job, which inherits
//!   `SLURM_SHARDS_ON_NODE=2`: it used to be confined to a 2g.10gb.
//!
//! The plugin cannot tell a forged `SLURM_SHARDS_ON_NODE` from Slurm's own
//! (a `gpu` job's step environment is the same either way, verified on
//! 22.05, and SPANK has no GRES item), so the refusal is smartmigd's:
//! `not_granted`, naming the grant, and the job fails whatever
//! `on_failure` says.
//!
//! Issue 53: nothing a user sets acts on another user's job or buys a
//! bigger slice than Slurm billed:
//!
//! - forged `SLURM_ARRAY_JOB_ID`/`SLURM_ARRAY_TASK_ID` in a shard batch job
//!   that gets no instance: the plugin's root `scontrol requeue` used to
//!   name them (`W_0,V` requeued another user's job V); it now names the
//!   job's own id from Slurm's SPANK items;
//! - a forged `SLURM_CONF` and `SLURMD_NODENAME` in an `srun` step's
//!   environment: the plugin's root `scontrol` used to read that config
//!   (so the node was not drained); it now reads slurmstepd's;
//! - `srun --mig-mem=40G` (and the same option through its
//!   `SLURM_SPANK_...` variable) inside `salloc --gres=shard:1`: it used to
//!   get a 7g.40gb while Slurm billed one shard; smartmigd now refuses it,
//!   naming what to ask for.
//!
//! Needs root and a release build of the workspace (`scripts/test`).

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use smartmig_suite::{describe, holds_within, job_user, plugstack_line, Sidecar, SlurmCluster};

const TIMEOUT: Duration = Duration::from_secs(90);
/// smartmigd's refusal of a shard count Slurm did not grant.
const NOT_SLURMS: &str = "Slurm granted this job no shards on this node (gpu on GPU 0)";
/// A shard count of the user's, set in the shell that submits a `gpu` job
/// (`SLURM_SHARDS_ON_NODE=3 sbatch --gres=gpu:1`). Forged variables travel
/// in sbatch's environment, never as `--export=ALL,VAR=value`: an export
/// list implies `--get-user-env`, which the test user (no login shell)
/// cannot satisfy, and from Slurm 26.05 on slurmd then fails the launch and
/// the job is requeued and held before the plugin ever runs.
const FORGED_COUNT: [(&str, &str); 1] = [("SLURM_SHARDS_ON_NODE", "3")];
/// The `gpu` job the forged count comes with.
const GPU_JOB: [&str; 1] = ["--gres=gpu:1"];
/// What a job prints: its devices and profile.
const ECHO: &str = "echo CVD=$CUDA_VISIBLE_DEVICES PROFILE=$SMARTMIG_PROFILE";

fn cluster(plugin_extra: &str) -> SlurmCluster {
    std::env::remove_var("SMARTMIG_SLURM_JOB_SUBMIT");
    let extra = plugin_extra.to_string();
    SlurmCluster::up_with(move |dir| {
        std::fs::write(dir.join("plugstack.conf"), plugstack_line(dir, &extra))
            .expect("write plugstack.conf");
    })
}

/// Instances any job holds, as `smartmig status` lists them.
fn held(sidecar: &Sidecar) -> Vec<(u64, String)> {
    Sidecar::instances(&sidecar.status())
        .into_iter()
        .filter_map(|i| {
            let job = i.get("job_id")?.as_u64()?;
            let profile = i.get("profile")?.as_str()?.to_string();
            Some((job, profile))
        })
        .collect()
}

/// Runs `srun ARGS` as the test user with `env` added to its environment.
fn srun_as_user(cluster: &SlurmCluster, env: &[(&str, &str)], args: &[&str]) -> Output {
    as_user(cluster, env, "srun", args)
}

/// Runs `PROGRAM ARGS` (a Slurm client) as the test user with `env` added
/// to its environment, for at most 60 s.
fn as_user(cluster: &SlurmCluster, env: &[(&str, &str)], program: &str, args: &[&str]) -> Output {
    let mut cmd = cluster.command("timeout");
    cmd.args(["60", "runuser", "-u", job_user(), "--", "env"]);
    cmd.arg(format!("SLURM_CONF={}", cluster.slurm_conf().display()));
    for (k, v) in env {
        cmd.arg(format!("{k}={v}"));
    }
    cmd.arg(program).args(args);
    cmd.current_dir("/tmp");
    cmd.output().expect("run a Slurm client")
}

/// A field of the job's first `scontrol show job` record.
fn job_field(cluster: &SlurmCluster, job: u32, key: &str) -> Option<String> {
    cluster.job_records(job).first()?.get(key).cloned()
}

/// Plugin arguments for a node whose smartmigd cannot be reached: a step
/// waits 1 s, then the plugin drains (`drain`) and requeues by itself.
fn unreachable(drain: bool) -> String {
    format!(
        "socket=/nonexistent/smartmig-root.sock sidecar_wait=1 requeue=yes drain_on_unreachable={}",
        if drain { "yes" } else { "no" }
    )
}

#[test]
fn forged_array_ids_never_requeue_another_users_job() {
    let cluster = cluster(&unreachable(false));
    // Two jobs of root's, running: V, the victim, and W, whose id the
    // forged array id borrows (`W_0,V` is a list of two ids to scontrol).
    let victim = cluster.sbatch_wrap(&[], "sleep 300");
    let other = cluster.sbatch_wrap(&[], "sleep 300");
    assert!(
        holds_within(TIMEOUT, || [victim, other]
            .iter()
            .all(|j| cluster.job_state(*j).as_deref() == Some("RUNNING"))),
        "root's jobs did not start: {:#?}",
        cluster.job_records(victim)
    );
    let task = format!("0,{victim}");
    let array_job = other.to_string();
    let out = cluster.shared_dir().join("forged-array.out");
    let attacker = cluster.sbatch_as_job_user_env(
        &[
            ("SLURM_ARRAY_JOB_ID", array_job.as_str()),
            ("SLURM_ARRAY_TASK_ID", task.as_str()),
        ],
        &out,
        &["--gres=shard:1"],
        "echo ran",
    );
    // Its first run meets no smartmigd and gives up after 1 s: it is
    // requeued, or (before issue 53) it failed.
    let first_run_over = holds_within(TIMEOUT, || {
        job_field(&cluster, attacker, "Restarts").is_some_and(|n| n != "0")
            || cluster
                .job_state(attacker)
                .is_some_and(|s| smartmig_suite::FINAL_JOB_STATES.contains(&s.as_str()))
    });
    assert!(
        first_run_over,
        "{:#?}\n{}",
        cluster.job_records(attacker),
        cluster.log_tails()
    );
    for job in [victim, other] {
        assert_eq!(
            job_field(&cluster, job, "Restarts").as_deref(),
            Some("0"),
            "root's job {job} was requeued by the user's forged array ids: {:#?}\n{}",
            cluster.job_records(job),
            cluster.log_tails()
        );
        assert_eq!(cluster.job_state(job).as_deref(), Some("RUNNING"));
    }
    // The requeue named the job's own id.
    assert_ne!(
        job_field(&cluster, attacker, "Restarts").as_deref(),
        Some("0"),
        "the shard job was not requeued: {:#?}\n{}",
        cluster.job_records(attacker),
        read(&out)
    );
    let _ = cluster
        .command("scancel")
        .args([
            &victim.to_string(),
            &other.to_string(),
            &attacker.to_string(),
        ])
        .output();
}

/// The requeue target of a real array task is `ARRAY_TASK`, from Slurm's
/// SPANK items on every series (a bare array id would requeue every task):
/// each task of a two-task array is requeued by itself.
#[test]
fn an_array_task_is_requeued_by_its_own_array_id() {
    let cluster = cluster(&unreachable(false));
    let out = cluster.shared_dir().join("array-%A_%a.out");
    let array = cluster.sbatch_as_job_user(&out, &["--gres=shard:1", "--array=0-1"], "echo ran");
    let log = cluster.dir().join("log/slurmd.log");
    let both = holds_within(TIMEOUT, || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        (0..2).all(|t| text.contains(&format!("requeued as {array}_{t}")))
    });
    assert!(
        both,
        "the tasks were not requeued as {array}_0 and {array}_1:\n{}",
        cluster.log_tails()
    );
    let _ = cluster.command("scancel").arg(array.to_string()).output();
}

#[test]
fn a_forged_slurm_conf_never_steers_the_plugins_scontrol() {
    let cluster = cluster(&unreachable(true));
    // The step's environment says: another config, another node.
    let out = srun_as_user(
        &cluster,
        &[],
        &[
            "--export=ALL,SLURM_CONF=/forged/slurm.conf,SLURMD_NODENAME=nosuchnode",
            "--gres=shard:1",
            "true",
        ],
    );
    let text = describe(&out);
    assert!(
        !out.status.success(),
        "the step ran without smartmigd: {text}"
    );
    assert!(
        cluster.wait_node_state("drained", TIMEOUT),
        "the node was not drained with slurmstepd's config (node state {}): {text}\n{}",
        cluster.node_state(),
        cluster.log_tails()
    );
    assert!(
        !text.contains("could not drain") && !text.contains("forged") && text.contains("drained"),
        "{text}"
    );
}

#[test]
fn a_step_gets_no_bigger_slice_than_its_job_was_billed() {
    let cluster = cluster("");
    let sidecar = Sidecar::start_with_slurm(cluster.dir(), "");
    let step = ["srun", "sh", "-c", "echo PROFILE=$SMARTMIG_PROFILE"];
    for (env, option) in [
        (vec![], Some("--mig-mem=40G")),
        (
            vec![("SLURM_SPANK__SLURM_SPANK_OPTION_smartmig_mig_mem", "40G")],
            None,
        ),
    ] {
        let mut args = vec!["--gres=shard:1", step[0]];
        args.extend(option);
        args.extend_from_slice(&step[1..]);
        let out = as_user(&cluster, &env, "salloc", &args);
        let text = describe(&out);
        assert!(!out.status.success(), "{env:?} {option:?}: ran: {text}");
        assert!(!text.contains("PROFILE=7g"), "{env:?} {option:?}: {text}");
        assert!(
            text.contains("needs 7g.40gb") && text.contains("--gres=shard:7"),
            "{env:?} {option:?}: {text}\n{}",
            cluster.smartmigd_log()
        );
        assert!(
            held(&sidecar).is_empty(),
            "instances left: {:?}",
            held(&sidecar)
        );
    }
    // 10 GB needs 1g.10gb, whose memory takes a 2g.10gb's room: not within
    // one shard either (issue 55); within two it is built as that 2g.10gb.
    let ten = |shards: &str| {
        let args = [shards, "srun", "--mig-mem=10G", step[1], step[2], step[3]];
        describe(&as_user(&cluster, &[], "salloc", &args))
    };
    let text = ten("--gres=shard:1");
    assert!(
        text.contains("needs 2g.10gb") && text.contains("--gres=shard:2"),
        "{text}"
    );
    let text = ten("--gres=shard:2");
    assert!(text.contains("PROFILE=2g.10gb"), "{text}");
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Runs a batch job as the test user, with `env` set in sbatch's
/// environment and its output in `name` (shared dir), and returns its final
/// state and output.
fn batch(
    cluster: &SlurmCluster,
    name: &str,
    env: &[(&str, &str)],
    args: &[&str],
    body: &str,
) -> (String, String) {
    let out = cluster.shared_dir().join(name);
    let job = cluster.sbatch_as_job_user_env(env, &out, args, body);
    let state = cluster.wait_job(job, TIMEOUT);
    (state, read(&out))
}

#[test]
fn a_users_variables_never_choose_an_instance() {
    let cluster = cluster("");
    let sidecar = Sidecar::start_with_slurm(cluster.dir(), "");
    let jobs = cluster.shared_dir();

    // Batch step of a gpu job with a forged shard count.
    let (state, text) = batch(&cluster, "forged-batch.out", &FORGED_COUNT, &GPU_JOB, ECHO);
    assert_eq!(state, "FAILED", "{text}\n{}", cluster.log_tails());
    assert!(
        text.contains(NOT_SLURMS),
        "{text}\n{}",
        cluster.smartmigd_log()
    );
    assert!(!text.contains("PROFILE=3g"), "got an instance: {text}");

    // srun step of a gpu job with a forged shard count.
    let out = srun_as_user(
        &cluster,
        &[("SLURM_SHARDS_ON_NODE", "7")],
        &["--gres=gpu:1", "sh", "-c", "echo PROFILE=$SMARTMIG_PROFILE"],
    );
    let text = describe(&out);
    assert!(!out.status.success(), "forged srun ran: {text}");
    assert!(!text.contains("PROFILE=7g"), "forged srun got a 7g: {text}");
    assert!(text.contains(NOT_SLURMS), "{text}");

    // No GRES at all: Slurm removes the variables; nothing is built.
    let (state, text) = batch(
        &cluster,
        "no-gres.out",
        &[("SLURM_SHARDS_ON_NODE", "7"), ("CUDA_VISIBLE_DEVICES", "1")],
        &[],
        ECHO,
    );
    assert_eq!(state, "COMPLETED", "{text}");
    assert!(text.trim_end().ends_with("PROFILE="), "{text}");

    // A gpu job submitted from inside a shard job inherits its count.
    let inner_out = jobs.join("inner.out");
    let outer_out = jobs.join("outer.out");
    let outer = cluster.sbatch_as_job_user(
        &outer_out,
        &["--gres=shard:2"],
        &format!(
            "sbatch --parsable --gres=gpu:1 -o {} --wrap 'echo PROFILE=$SMARTMIG_PROFILE'; sleep 1",
            inner_out.display()
        ),
    );
    assert_eq!(
        cluster.wait_job(outer, TIMEOUT),
        "COMPLETED",
        "{}",
        read(&outer_out)
    );
    let inner: u32 = read(&outer_out)
        .lines()
        .find_map(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no inner job id: {}", read(&outer_out)));
    let state = cluster.wait_job(inner, TIMEOUT);
    assert_eq!(state, "FAILED", "inner job {inner}: {}", read(&inner_out));
    assert!(
        read(&inner_out).contains("SLURM_SHARDS_ON_NODE=2 is not Slurm's"),
        "inner job {inner}: {}",
        read(&inner_out)
    );
    assert!(
        !read(&inner_out).contains("PROFILE=2g"),
        "{}",
        read(&inner_out)
    );
    assert!(
        held(&sidecar).is_empty(),
        "instances left: {:?}",
        held(&sidecar)
    );

    // A shard job's GPU variables and count are Slurm's: forged ones are
    // overwritten, and the job gets its 2 shards on the GPU Slurm chose.
    let (state, text) = batch(
        &cluster,
        "forged-shard.out",
        &[
            ("SLURM_SHARDS_ON_NODE", "7"),
            ("SLURM_JOB_GPUS", "1"),
            ("CUDA_VISIBLE_DEVICES", "1"),
        ],
        &["--gres=shard:2"],
        "echo PROFILE=$SMARTMIG_PROFILE SHARDS=$SLURM_SHARDS_ON_NODE GPUS=$SLURM_JOB_GPUS",
    );
    assert_eq!(state, "COMPLETED", "{text}");
    assert!(text.contains("PROFILE=2g.10gb SHARDS=2 GPUS=0"), "{text}");
}

/// With `gpu_jobs=allow` an honest whole-GPU step runs on the GPU as Slurm
/// placed it; a forged shard count reaches smartmigd, which checks
/// slurmctld's record, refuses and logs the claim and builds nothing; the
/// job fails with the reason.
#[test]
fn smartmigd_refuses_a_claim_slurm_did_not_grant() {
    let cluster = cluster("gpu_jobs=allow");
    let sidecar = Sidecar::start_with_slurm(cluster.dir(), "");
    let (state, text) = batch(&cluster, "honest.out", &[], &GPU_JOB, ECHO);
    assert_eq!(state, "COMPLETED", "{text}");
    assert!(text.contains("CVD=0 PROFILE="), "{text}");

    let (state, text) = batch(&cluster, "forged.out", &FORGED_COUNT, &GPU_JOB, ECHO);
    assert_eq!(state, "FAILED", "{text}");
    assert!(text.contains(NOT_SLURMS), "{text}");
    assert!(!text.contains("PROFILE=3g"), "{text}");
    assert!(held(&sidecar).is_empty(), "{:?}", held(&sidecar));
    let log = cluster.smartmigd_log();
    assert!(
        log.contains("refused: job") && log.contains("SLURM_SHARDS_ON_NODE=3 is not Slurm's"),
        "no refusal in smartmigd's log:\n{log}"
    );
}

/// `smartmig release` never gives a running job's instance away: refused
/// while Slurm shows the job running (naming its state and what to do, the
/// instance kept); `--force` cancels the job in Slurm first and releases
/// once Slurm shows it ended.
#[test]
fn release_by_hand_keeps_a_running_jobs_instance() {
    let cluster = cluster("");
    let sidecar = Sidecar::start_with_slurm(cluster.dir(), "");
    let out = cluster.shared_dir().join("running.out");
    let job = cluster.sbatch_as_job_user(&out, &["--gres=shard:3"], "sleep 300");
    let running = smartmig_suite::holds_within(TIMEOUT, || {
        held(&sidecar).iter().any(|(j, _)| *j == u64::from(job))
    });
    assert!(running, "job {job} got no instance: {}", read(&out));
    let smartmig = smartmig_suite::artifact("smartmig");
    let release = |extra: &[&str]| {
        cluster
            .command(smartmig.to_str().expect("utf-8 path"))
            .arg("release")
            .args(extra)
            .arg(job.to_string())
            .arg("--socket")
            .arg(sidecar.socket())
            .output()
            .expect("run smartmig release")
    };

    let refused = release(&[]);
    let text = describe(&refused);
    assert!(
        !refused.status.success(),
        "release of a running job: {text}"
    );
    assert!(
        text.contains(&format!("job {job} is RUNNING in Slurm"))
            && text.contains(&format!("smartmig release --force {job}")),
        "{text}"
    );
    assert_eq!(
        held(&sidecar),
        vec![(u64::from(job), "3g.20gb".to_string())]
    );
    assert_eq!(cluster.job_state(job).as_deref(), Some("RUNNING"));

    let forced = release(&["--force"]);
    let text = describe(&forced);
    assert!(forced.status.success(), "release --force: {text}");
    assert!(text.contains("cancelled in Slurm"), "{text}");
    assert_eq!(cluster.wait_job(job, TIMEOUT), "CANCELLED");
    assert!(held(&sidecar).is_empty(), "{:?}", held(&sidecar));
}
