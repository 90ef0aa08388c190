//! A job step's instance, asked for in `init_post_opt` (slurmstepd, as
//! root, before the tasks fork), as named steps: is the step ours, what
//! the job asked for, the sidecar's answer, the job's environment, the
//! out-of-memory marker. What it decides is acted upon in `task_init`
//! ([`Outcome`]); nothing here fails slurmstepd.

use std::ffi::{c_char, c_int, CStr};
use std::time::{Duration, Instant};

use smartmig_client::client::{Client, ClientError};
use smartmig_client::protocol::{AllocateReply, AllocateRequest, ErrorKind};

use crate::args::{OnFailure, PluginArgs};
use crate::{job, log, oom, slurmctl, spank, state, sys, LogLevel, Outcome};

/// A step with shards: who it is (from Slurm's SPANK items, never from
/// the job's environment) and where Slurm put it (a claim smartmigd checks
/// against slurmctld's record).
struct Step {
    job_id: u32,
    uid: u32,
    step_id: u32,
    /// `S_JOB_ARRAY_ID` and `S_JOB_ARRAY_TASK_ID`: what a requeue names.
    array: job::ArrayTask,
    gres: job::StepGres,
}

/// What the job asked for and how the plugin is set up.
struct Asked {
    args: PluginArgs,
    /// `--mig-mem`, GB.
    memory_gb: Option<f64>,
    /// `--mig-profile`.
    profile: Option<String>,
}

/// The remote-context work of `init_post_opt`: decide whether the step is
/// ours, ask the sidecar, set the environment. Returns what `task_init`
/// must do; never fails otherwise.
///
/// # Safety
/// `sp`, `ac` and `av` are the callback's arguments.
pub(crate) unsafe fn prepare_step(sp: sys::spank_t, ac: c_int, av: *mut *mut c_char) -> Outcome {
    // What the plugin adds to a job start, logged with the allocation.
    let started = Instant::now();
    // SAFETY: `sp` is the callback's handle.
    let step = match unsafe { ours(sp) } {
        Ok(Some(s)) => s,
        Ok(None) => return Outcome::Untouched,
        Err(failed) => return failed,
    };
    // SAFETY: forwarded from the callback.
    let asked = match unsafe { asked(ac, av) } {
        Ok(a) => a,
        Err(failed) => return failed,
    };
    let asked_at = Instant::now();
    // SAFETY: `sp` is the callback's handle.
    let reply = match unsafe { ask_sidecar(sp, &step, &asked) } {
        Ok(r) => r,
        Err(outcome) => return outcome,
    };
    let took_ms = started.elapsed().as_secs_f64() * 1000.0;
    let sidecar_ms = asked_at.elapsed().as_secs_f64() * 1000.0;
    for (name, value) in [
        ("CUDA_VISIBLE_DEVICES", reply.uuid.as_str()),
        ("SMARTMIG_PROFILE", reply.profile.as_str()),
    ] {
        // SAFETY: `sp` is the callback's handle.
        if let Err(e) = unsafe { spank::setenv(sp, name, value) } {
            return fail(format!("job {}: {e}", step.job_id));
        }
    }
    // SAFETY: `sp` is the callback's handle.
    let oom_file = unsafe { oom_marker(sp, &step, &asked) };
    // No note from smartmigd: perhaps one in Slurm (read in task_init).
    let told = match reply.note {
        Some(_) => None,
        None => ToldLookup::new(&step, &asked.args).map(Box::new),
    };
    log(
        LogLevel::Info,
        &format!(
            "job {} step {:#x}: {} on GPU {} ({}, start {}, {:?}, waited {} ms; GPU from {}); smartmig took {took_ms:.2} ms (sidecar {sidecar_ms:.2} ms)",
            step.job_id,
            step.step_id,
            reply.uuid,
            reply.gpu,
            reply.profile,
            reply.start,
            reply.action,
            reply.waited_ms,
            step.gres.gpu_source
        ),
    );
    Outcome::Allocated {
        uuid: reply.uuid,
        profile: reply.profile,
        oom_file,
        note: reply.note,
        told,
    }
}

/// Where a requeued batch job's rerun that smartmigd had no note for
/// reads why it was requeued (issue 56): smartmigd restarted since the
/// requeue, the job now runs on another node, or the plugin itself
/// requeued it while smartmigd was unreachable. Prepared in
/// `init_post_opt` from Slurm's items and the plugstack arguments; used in
/// `task_init` ([`ToldLookup::line`]), the first callback where Slurm
/// tells the restart count.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ToldLookup {
    /// The job as `scontrol` names it (`A_T` for an array task).
    job: String,
    /// `S_JOB_ID`: whose record is read.
    job_id: u32,
    scontrol: std::path::PathBuf,
    slurm_conf: Option<String>,
}

impl ToldLookup {
    /// For a batch step only (the one step a requeue restarts; its srun
    /// steps would print the line again).
    fn new(step: &Step, args: &PluginArgs) -> Option<Self> {
        (step.step_id == job::BATCH_STEP).then(|| Self {
            job: step.array.requeue_target(step.job_id),
            job_id: step.job_id,
            scontrol: args.scontrol.clone(),
            slurm_conf: slurm_conf(args),
        })
    }

    /// The told-why line of the job's `AdminComment` word, on a rerun
    /// only, so a first run costs no Slurm call.
    ///
    /// Runs in `task_init`, as the job's user: Slurm 22.05 answers
    /// `S_SLURM_RESTART_COUNT` with 0 in a requeued batch step, and puts
    /// `SLURM_RESTART_COUNT` into the job's environment only after
    /// `init_post_opt` and `task_init_privileged` (seen on 22.05 while
    /// writing the told-why checks of tests/e2e_agreement.rs). That variable is the user's to set, so a
    /// forged one only makes the plugin run `scontrol show job` on the
    /// job's own id (from Slurm's items, never the environment) with the
    /// user's own rights, and print its word in the job's own output:
    /// nothing the user could not do, or read, themselves.
    ///
    /// # Safety
    /// `sp` is the callback's handle.
    pub(crate) unsafe fn line(&self, sp: sys::spank_t) -> Option<String> {
        // SAFETY: `sp` is the callback's handle.
        let item = unsafe { spank::item_u32(sp, sys::spank_item_S_SLURM_RESTART_COUNT) };
        // SAFETY: `sp` is the callback's handle.
        let env = unsafe { spank::getenv(sp, "SLURM_RESTART_COUNT") }
            .and_then(|v| v.trim().parse::<u32>().ok());
        let restarts = item.unwrap_or(0).max(env.unwrap_or(0));
        if restarts == 0 {
            return None;
        }
        let conf = self.slurm_conf.as_deref();
        match slurmctl::admin_comment(&self.scontrol, conf, &self.job, self.job_id) {
            Ok(c) => {
                let line = smartmig_client::told::find(&c).map(|w| w.line(None));
                log(
                    LogLevel::Info,
                    &format!(
                        "job {}: run after restart {restarts}; its AdminComment {} why it was requeued",
                        self.job,
                        if line.is_some() { "says" } else { "does not say" }
                    ),
                );
                line
            }
            Err(e) => {
                log(
                    LogLevel::Error,
                    &format!(
                        "job {}: cannot read why its last run was requeued: {e}",
                        self.job
                    ),
                );
                None
            }
        }
    }
}

/// The step, when it is ours: not the extern step, with shards on this
/// node, and Slurm told the job id and uid. `Err`: the job must fail.
///
/// # Safety
/// `sp` is the callback's handle.
unsafe fn ours(sp: sys::spank_t) -> Result<Option<Step>, Outcome> {
    // SAFETY: `sp` is the callback's handle.
    let step = unsafe { spank::item_u32(sp, sys::spank_item_S_JOB_STEPID) };
    if step == Some(job::EXTERN_STEP) {
        return Ok(None);
    }
    let step_id = step.unwrap_or(job::BATCH_STEP);
    // SAFETY: `sp` is the callback's handle.
    let gres = match job::step_gres(step_id, |name| unsafe { spank::getenv(sp, name) }) {
        Ok(None) => {
            // SAFETY: `sp` is the callback's handle.
            return match unsafe { whole_gpu_step(sp, step_id) } {
                Outcome::Untouched => Ok(None),
                failed => Err(failed),
            };
        }
        Ok(Some(g)) => g,
        Err(e) => {
            return Err(fail(format!(
                "cannot tell which MIG instance this job needs: {e}"
            )))
        }
    };
    // SAFETY: `sp` is the callback's handle.
    let (job_id, uid) = unsafe {
        (
            spank::item_u32(sp, sys::spank_item_S_JOB_ID),
            spank::item_u32(sp, sys::spank_item_S_JOB_UID),
        )
    };
    let (Some(job_id), Some(uid)) = (job_id, uid) else {
        return Err(fail(
            "Slurm did not provide the job id or uid to the plugin".into(),
        ));
    };
    // SAFETY: `sp` is the callback's handle.
    let array = unsafe {
        job::ArrayTask::new(
            spank::item_u32(sp, sys::spank_item_S_JOB_ARRAY_ID),
            spank::item_u32(sp, sys::spank_item_S_JOB_ARRAY_TASK_ID),
        )
    };
    Ok(Some(Step {
        job_id,
        uid,
        step_id,
        array,
        gres,
    }))
}

/// A step without shards: untouched, unless Slurm gave it whole GPUs on
/// this smartmig node and `gpu_jobs=fail` (the default): then it fails
/// with [`job::whole_gpu_refusal`]. A plugstack.conf that does not parse
/// counts as the default.
///
/// # Safety
/// `sp` is the callback's handle.
unsafe fn whole_gpu_step(sp: sys::spank_t, step_id: u32) -> Outcome {
    // SAFETY: `sp` is the callback's handle (both calls).
    let Some((variable, gpus)) = job::whole_gpus(step_id, |n| unsafe { spank::getenv(sp, n) })
    else {
        return Outcome::Untouched;
    };
    let allowed = matches!(&state().args, Some(Ok(a)) if a.gpu_jobs_allowed);
    if allowed {
        return Outcome::Untouched;
    }
    // SAFETY: `sp` is the callback's handle.
    let job_id = unsafe { spank::item_u32(sp, sys::spank_item_S_JOB_ID) }.unwrap_or(0);
    fail(job::whole_gpu_refusal(job_id, variable, &gpus))
}

/// The plugstack arguments (as `init` parsed them) and the job's options;
/// `Err` when one of them is unusable, or the plugin was built for another
/// Slurm: the job fails with the reason.
///
/// # Safety
/// `ac` and `av` are the callback's arguments.
unsafe fn asked(ac: c_int, av: *mut *mut c_char) -> Result<Asked, Outcome> {
    let (args, mig_mem, mig_profile, mismatch) = {
        let st = state();
        (
            st.args.clone(),
            st.mig_mem.clone(),
            st.mig_profile.clone(),
            st.version_mismatch.clone(),
        )
    };
    if let Some(e) = mismatch {
        return Err(fail(format!(
            "the smartmig SPANK plugin was {e}; tell your administrator"
        )));
    }
    let args = match args {
        Some(a) => a,
        // SAFETY: forwarded from the callback.
        None => PluginArgs::parse(&unsafe { spank::args(ac, av) }),
    };
    let args = args.map_err(|e| {
        fail(format!(
            "the smartmig SPANK plugin is misconfigured on this node ({e}); \
             tell your administrator"
        ))
    })?;
    let memory_gb = match mig_mem {
        None => None,
        Some(Ok(gb)) => Some(gb),
        Some(Err(e)) => return Err(fail(e.to_string())),
    };
    // `--mig-profile`: smartmigd resolves it on the GPU's model and hands
    // out exactly that profile or refuses, in the allocate itself.
    let profile = match mig_profile {
        None => None,
        Some(Err(e)) => return Err(fail(e.to_string())),
        Some(Ok(name)) => Some(name),
    };
    Ok(Asked {
        args,
        memory_gb,
        profile,
    })
}

/// Asks smartmigd for the step's instance, patiently while it is
/// unreachable (`sidecar_wait`). `Err`: what the job gets instead, by
/// `on_failure` (a profile the GPU cannot build, or a claim slurmctld did
/// not grant, always fails the job).
///
/// # Safety
/// `sp` is the callback's handle.
unsafe fn ask_sidecar(
    sp: sys::spank_t,
    step: &Step,
    asked: &Asked,
) -> Result<AllocateReply, Outcome> {
    let args = &asked.args;
    // SAFETY: `sp` is the callback's handle.
    let job_name = unsafe { spank::getenv(sp, "SLURM_JOB_NAME") }.filter(|n| !n.trim().is_empty());
    let request = AllocateRequest {
        job_id: u64::from(step.job_id),
        step: Some(step.step_id),
        uid: step.uid,
        gpu: step.gres.gpu,
        slices: step.gres.shards,
        memory_gb: asked.memory_gb,
        deadline: None,
        time_limit_s: None,
        job_name,
        oom_marker: Some(args.oom_requeue),
        profile: asked.profile.clone(),
    };
    let client = Client::new(&args.socket).with_io_timeout(args.timeout);
    let what = format!(
        "job {}: no MIG instance with {} compute slice(s) on GPU {}",
        step.job_id, step.gres.shards, step.gres.gpu
    );
    match patiently(args.sidecar_wait, || client.allocate(request.clone())) {
        Ok(r) => Ok(r),
        // A profile the GPU cannot build is the job's own error: it fails,
        // whatever `on_failure` says (a whole GPU would hide it). So does a
        // claim slurmctld did not grant (a SLURM_SHARDS_ON_NODE the user
        // set in a `gpu` job): smartmigd refused it and logged it.
        Err(ClientError::Daemon(b))
            if (b.kind == ErrorKind::InvalidRequest && asked.profile.is_some())
                || b.kind == ErrorKind::NotGranted =>
        {
            Err(fail(format!("{what}: {}", b.message)))
        }
        Err(e) => Err(sidecar_failed(step, args, e, &what)),
    }
}

/// The sidecar gave no instance: the job fails (after the node is
/// drained or the job requeued, see [`give_back`]), or with
/// `on_failure=whole-gpu` runs on the GPU Slurm chose.
fn sidecar_failed(step: &Step, args: &PluginArgs, e: ClientError, what: &str) -> Outcome {
    let reason = format!("{what}: {e}");
    match args.on_failure {
        OnFailure::Fail => fail(give_back(args, &e, reason, step)),
        OnFailure::WholeGpu => {
            let warning = format!(
                "{reason}; running on GPU {} as Slurm assigned it \
                 (on_failure=whole-gpu: not isolated from other jobs on that GPU)",
                step.gres.gpu
            );
            log(LogLevel::Error, &warning);
            Outcome::Degraded(warning)
        }
    }
}

/// With `oom_requeue=yes`, the job's out-of-memory marker file, prepared
/// and named in its environment (`None`, logged, when that fails). A job
/// with --mig-profile asked for exactly that profile: a restart on a larger
/// one would contradict it (and fail the profile check), so it gets no
/// marker and is never requeued for memory.
///
/// # Safety
/// `sp` is the callback's handle.
unsafe fn oom_marker(sp: sys::spank_t, step: &Step, asked: &Asked) -> Option<String> {
    let args = &asked.args;
    if !args.oom_requeue || asked.profile.is_some() {
        return None;
    }
    let job_id = step.job_id;
    // SAFETY: `sp` is the callback's handle.
    let gid = unsafe { spank::item_u32(sp, sys::spank_item_S_JOB_GID) }.unwrap_or(step.uid);
    let batch = step.step_id == job::BATCH_STEP;
    let path = match oom::prepare(&args.oom_dir(), job_id, step.uid, gid, batch) {
        Ok(path) => path,
        Err(e) => {
            log(
                LogLevel::Error,
                &format!(
                    "job {job_id}: no out-of-memory marker ({e}); an out-of-memory \
                     failure of this job will not be requeued"
                ),
            );
            return None;
        }
    };
    if let Some(w) = oom::unbounded_warning(&args.oom_dir()) {
        log(LogLevel::Info, &format!("job {job_id}: warning: {w}"));
    }
    let path = path.to_string_lossy().into_owned();
    // SAFETY: `sp` is the callback's handle.
    match unsafe { spank::setenv(sp, oom::ENV, &path) } {
        Ok(()) => Some(path),
        Err(e) => {
            log(LogLevel::Error, &format!("job {job_id}: {e}"));
            None
        }
    }
}

/// Whether `e` means the sidecar is not there (socket missing or refused,
/// connect timed out, daemon shutting down, or gone mid-request) rather
/// than a refusal.
fn is_unreachable(e: &ClientError) -> bool {
    match e {
        ClientError::Connect { .. } | ClientError::ConnectTimeout { .. } | ClientError::Dropped => {
            true
        }
        ClientError::Daemon(body) => body.kind == ErrorKind::ShuttingDown,
        _ => false,
    }
}

/// Calls `f` until it succeeds, fails for another reason than an
/// unreachable sidecar, or `wait` has passed: a restarting smartmigd
/// (systemd restarts it within seconds) does not fail the jobs that start
/// meanwhile.
fn patiently<T>(
    wait: Duration,
    mut f: impl FnMut() -> Result<T, ClientError>,
) -> Result<T, ClientError> {
    let start = Instant::now();
    loop {
        match f() {
            Err(e) if is_unreachable(&e) && start.elapsed() < wait => {
                std::thread::sleep(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

/// The job gets no instance. When the sidecar stayed unreachable, drain
/// the node so Slurm stops sending shard jobs here (smartmigd resumes it
/// when it is back). When it is unreachable or found no room in time
/// (Slurm's shard count and the MIG layout disagree, e.g. two 3g
/// instances strand the seventh slice), requeue a batch job so it runs
/// later instead of failing; before a requeue for an unreachable sidecar,
/// write why into its `AdminComment` ([`tell_admin_comment`]: smartmigd,
/// which words the other requeues, is not there to). Returns the reason
/// for the job's output, saying what was done and what happens next.
///
/// Every command runs as root, so nothing in them comes from the job's
/// environment (the user's, issue 53): the job to requeue and comment on
/// is the step's own ([`job::ArrayTask::requeue_target`] of Slurm's
/// items), the node is slurmstepd's, and `scontrol` reads the config of
/// [`slurm_conf`].
fn give_back(args: &PluginArgs, e: &ClientError, mut text: String, step: &Step) -> String {
    let unreachable = is_unreachable(e);
    let no_fit = matches!(e, ClientError::Daemon(b) if b.kind == ErrorKind::NoFit);
    let conf = slurm_conf(args);
    if unreachable {
        text.push_str(&format!(
            " (waited {:.0} s for smartmigd)",
            args.sidecar_wait.as_secs_f64()
        ));
        if args.drain_on_unreachable {
            match node_name() {
                Some(node) => match slurmctl::drain(
                    &args.scontrol,
                    conf.as_deref(),
                    &node,
                    slurmctl::UNREACHABLE_REASON,
                ) {
                    Ok(()) => text.push_str(&format!("; node {node} drained")),
                    Err(e) => text.push_str(&format!("; could not drain the node: {e}")),
                },
                None => text.push_str("; could not drain the node: its Slurm name is unknown"),
            }
        }
    }
    if (unreachable || no_fit) && args.requeue && step.step_id == job::BATCH_STEP {
        let id = step.array.requeue_target(step.job_id);
        // No fit: smartmigd already wrote why (its word is in the comment).
        let told = unreachable.then(|| tell_admin_comment(args, conf.as_deref(), step, &id));
        match slurmctl::requeue(&args.scontrol, conf.as_deref(), &id) {
            Ok(()) => {
                log(
                    LogLevel::Info,
                    &format!("job {}: requeued as {id}", step.job_id),
                );
                text.push_str(&requeued_text(unreachable, &id));
            }
            Err(e) => {
                if let Some(Some(old)) = told {
                    // Not requeued after all: the comment must not say so.
                    let _ = slurmctl::set_admin_comment(&args.scontrol, conf.as_deref(), &id, &old);
                }
                text.push_str(&format!("; could not requeue the job: {e}"));
            }
        }
    }
    text
}

/// What the job's output says of its requeue: that it was requeued and
/// what happens next (issue 56).
fn requeued_text(unreachable: bool, id: &str) -> String {
    if unreachable {
        format!(
            "; this batch job is requeued: it goes back to Slurm's queue and starts again \
             later, on another node or on this one once smartmigd is back (`scontrol show job \
             {id}` says why in its AdminComment, and so will its next run's output)"
        )
    } else {
        "; job requeued: it starts again later".to_string()
    }
}

/// Writes why the plugin requeues the job (smartmigd unreachable) into its
/// `AdminComment` before the requeue, keeping the rest of the comment
/// (issue 56): `scontrol show job` says it while the job waits, and its
/// next run prints it, on whatever node and whether or not smartmigd kept
/// a note. `job` is the step's own id as [`slurmctl::requeue`] names it.
/// Returns the comment as it was, to restore when the requeue fails;
/// `None` (logged) when it could not be read or set: then nothing is
/// written, so the site's own comment is never lost.
fn tell_admin_comment(
    args: &PluginArgs,
    conf: Option<&str>,
    step: &Step,
    job: &str,
) -> Option<String> {
    let old = slurmctl::admin_comment(&args.scontrol, conf, job, step.job_id)
        .map_err(|e| {
            log(
                LogLevel::Error,
                &format!("job {job}: AdminComment not told why the job is requeued: {e}"),
            );
        })
        .ok()?;
    let word = smartmig_client::told::Requeued::unreachable(
        unix_now(),
        node_name().as_deref(),
        step.gres.gpu,
    )
    .to_word();
    let new = smartmig_client::told::merge(&old, &word);
    match slurmctl::set_admin_comment(&args.scontrol, conf, job, &new) {
        Ok(()) => Some(old),
        Err(e) => {
            log(
                LogLevel::Error,
                &format!("job {job}: AdminComment not told why the job is requeued: {e}"),
            );
            None
        }
    }
}

/// Unix seconds now (0 before 1970: a clock that wrong shows in the word).
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The slurm.conf the plugin's `scontrol` reads: `slurm_conf=` of
/// plugstack.conf, else slurmstepd's own `SLURM_CONF` (slurmd's, which it
/// inherits), else none (Slurm's compiled-in path). Never the job's.
fn slurm_conf(args: &PluginArgs) -> Option<String> {
    args.slurm_conf
        .as_ref()
        .map(|p| p.to_string_lossy().into_owned())
        .or_else(|| std::env::var("SLURM_CONF").ok())
        .filter(|c| !c.is_empty())
}

/// The node's Slurm name: slurmd exports `SLURMD_NODENAME` to the
/// processes it starts (slurmstepd included); else the short host name
/// (right unless slurm.conf maps names). Never the job's copy, which is
/// the user's to set.
fn node_name() -> Option<String> {
    std::env::var("SLURMD_NODENAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            let mut buf = [0u8; 256];
            // SAFETY: the buffer is valid for its length; gethostname
            // NUL-terminates within it on success.
            let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
            if rc != 0 {
                return None;
            }
            let name = CStr::from_bytes_until_nul(&buf).ok()?.to_str().ok()?;
            name.split('.')
                .next()
                .filter(|n| !n.is_empty())
                .map(String::from)
        })
}

/// A failed outcome, also logged to slurmd.log.
fn fail(reason: String) -> Outcome {
    log(LogLevel::Error, &reason);
    Outcome::Failed(reason)
}
