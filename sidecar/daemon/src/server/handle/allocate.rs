//! `allocate` (root or `slurm_user`: the plugin at a job step's start):
//! idempotent per job, serialised per GPU, waiting up to
//! `allocate_wait_s` for a release when nothing fits, in the order the
//! `placement` rule gives among the allocates waiting on the same GPU
//! (docs/daemon.md, "How a request is served").

use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::super::books::{Gpu, GpuState, GpuTx, PlacementCell, Waiter, WaitingGuard};
use super::super::context::{unix_now, unix_now_f64, Cx};
use super::super::job_record::{self, Record};
use super::super::{holds, instances, queue, reap, room};
use crate::allocate::{Assignment, Beside, GpuBook, Need, Plan, Refusal};
use crate::config::Mode;
use crate::grant;
use crate::memory::Sizing;
use crate::mig::{Mix, ProfileSpec};
use crate::placement::{Contender, PlacementRule, Turn};
use crate::protocol::{AllocAction, AllocateReply, AllocateRequest, ErrorBody, ErrorKind};
use crate::usage::SliceTag;
use crate::workload::MemoryKey;

mod burst;

/// Characters of a job name kept in a memory key.
const MAX_JOB_NAME_CHARS: usize = 200;

/// Serves an allocate and counts it by result, with its latency.
pub(super) async fn serve(cx: &Cx<'_>, req: AllocateRequest) -> Result<AllocateReply, ErrorBody> {
    let t0 = Instant::now();
    let r = allocate(cx, req).await;
    let result = match &r {
        Ok(a) => match a.action {
            AllocAction::Existing => "existing",
            AllocAction::Reused => "reused",
            AllocAction::Created => "created",
            AllocAction::Reshaped => "reshaped",
        },
        Err(e) if e.kind == ErrorKind::NoFit => "no_fit",
        Err(_) => "error",
    };
    cx.svc
        .metrics
        .allocation(result, t0.elapsed().as_secs_f64());
    r
}

/// The allocate's steps: refuse what can never be served, return an
/// instance the job already holds, size the request, then take the turn
/// when there is room, or wait for it.
async fn allocate(cx: &Cx<'_>, req: AllocateRequest) -> Result<AllocateReply, ErrorBody> {
    let start = Instant::now();
    refuse_in_advise_mode(cx)?;
    refuse_on_wrong_gpu_order(cx)?;
    let gpu = the_gpu(cx, req.gpu)?;
    if let Some(r) = held_anywhere(cx, &req).await {
        return Ok(r);
    }
    let (req, interactive) = granted(cx, req).await?;
    read_pass(cx, &req, start).await;
    if let Some(marker) = req.oom_marker {
        cx.books.node(|l| l.plugin_oom_requeue = Some(marker));
    }
    let exact = exact_profile(gpu, &req)?;
    let key = memory_key(&req);
    let mut me = Contender {
        job_id: req.job_id,
        need: sized_need(cx, gpu, &req, exact, key.as_ref())?,
        exact,
        arrival: unix_now_f64() - start.elapsed().as_secs_f64(),
        deadline: f64::INFINITY,
        time_limit_s: None,
    };
    let mut wait = Wait::new(cx, gpu, start, interactive);
    loop {
        // Re-read each round: a queue read while waiting may have brought
        // the job's deadline.
        let times = cx
            .books
            .node(|l| l.times_of(req.job_id, req.deadline, req.time_limit_s));
        (me.deadline, me.time_limit_s) = (times.deadline, times.time_limit_s);
        let mut st = gpu.tx().await;
        if let Some(r) = existing_reply(&st.book, req.job_id) {
            return Ok(r);
        }
        match next_step(cx, gpu, &mut st, &me, &req)? {
            Step::Go(profile, plan) => {
                st.promised = None;
                let waited_ms = start.elapsed().as_millis() as u64;
                let reply = execute(cx, gpu, &mut st, &req, profile, plan, waited_ms)?;
                after_allocate(cx, &req, key, exact.is_some(), profile, waited_ms);
                // The GPU's busy instances changed: its holds follow.
                cx.books.want_holds();
                return Ok(reply);
            }
            Step::Refuse { reason, profile } => {
                drop(st);
                return Err(refuse_now(cx, &req, reason, profile).await);
            }
            Step::Wait {
                reason,
                mine,
                no_room_for,
            } => {
                // An interactive step cannot be requeued: young batch jobs
                // of its scheduling pass give way to it (`room`).
                let st = match no_room_for.filter(|_| mine) {
                    Some(profile) => match wait.room.try_now(cx, st, &req, profile).await {
                        Some(st) => st,
                        None => continue,
                    },
                    None => st,
                };
                wait.for_room(cx, st, &req, &me, (reason, no_room_for), mine)
                    .await?;
            }
        }
    }
}

fn refuse_in_advise_mode(cx: &Cx<'_>) -> Result<(), ErrorBody> {
    if cx.cfg().mode != Mode::Advise {
        return Ok(());
    }
    Err(ErrorBody::new(
        ErrorKind::InvalidRequest,
        format!(
            "smartmigd on {} runs in advise mode: it watches the node's own MIG setup and hands out no \
             instance; request a MIG device through Slurm (--gres=gpu:<profile>:1), or ask the admin \
             to switch the node to mode = \"dynamic\"",
            cx.node.name
        ),
    ))
}

/// Slurm's GPU order turned out wrong after the start (smartmigd started
/// before Slurm answered): every instance would be on another GPU than
/// the one Slurm gave the job.
fn refuse_on_wrong_gpu_order(cx: &Cx<'_>) -> Result<(), ErrorBody> {
    match cx.books.node(|l| l.gpu_order.refusal()) {
        None => Ok(()),
        Some(why) => Err(ErrorBody::new(ErrorKind::Backend, why)),
    }
}

fn the_gpu<'a>(cx: &Cx<'a>, index: u32) -> Result<&'a Gpu, ErrorBody> {
    cx.books.gpu(index).ok_or_else(|| {
        ErrorBody::new(
            ErrorKind::InvalidRequest,
            format!(
                "no GPU {index} on this node (it has {} GPUs)",
                cx.books.gpus.len()
            ),
        )
    })
}

/// Another step of a job that already holds an instance (on any GPU)
/// gets that instance back.
async fn held_anywhere(cx: &Cx<'_>, req: &AllocateRequest) -> Option<AllocateReply> {
    for other in &cx.books.gpus {
        let st = other.tx().await;
        if let Some(r) = existing_reply(&st.book, req.job_id) {
            if other.index != req.gpu {
                tracing::warn!(
                    job = req.job_id,
                    asked = req.gpu,
                    holds = other.index,
                    "job already holds an instance on another GPU; returning it"
                );
            }
            return Some(r);
        }
    }
    None
}

fn existing_reply(book: &GpuBook, job_id: u64) -> Option<AllocateReply> {
    let inst = book.find_job(job_id)?;
    let p = book.geometry.spot(inst.placement);
    Some(AllocateReply {
        uuid: inst.uuid.clone(),
        gpu: book.index,
        profile: p.profile.name(),
        start: p.start,
        compute: p.compute(),
        memory_gb: p.profile.memory_gb,
        reused: true,
        action: AllocAction::Existing,
        waited_ms: 0,
        note: None,
    })
}

/// The request as Slurm granted it: the plugin's shard count and GPU come
/// from the step's environment, which for `gpu` jobs may hold a
/// `SLURM_SHARDS_ON_NODE` the user set (docs/slurm-integration.md §9), so
/// they are checked against slurmctld's record of the job before anything
/// is built. A claim Slurm did not grant, or a job Slurm cannot vouch for,
/// is refused and logged; the instance has the job's granted size. With
/// the request, whether the record says the job is interactive (`None`
/// when it was not read), for [`room`].
async fn granted(
    cx: &Cx<'_>,
    mut req: AllocateRequest,
) -> Result<(AllocateRequest, Option<bool>), ErrorBody> {
    let cfg = cx.cfg();
    if !(cfg.slurm.enabled && cfg.slurm.check_grants) {
        return Ok((req, None));
    }
    let refuse = |kind: ErrorKind, why: String| {
        let message = format!("job {}: {why}", req.job_id);
        tracing::warn!(
            job = req.job_id,
            gpu = req.gpu,
            claimed = req.slices,
            "refused: {message}"
        );
        ErrorBody::new(kind, message)
    };
    let text = match job_record::read(cx, req.job_id).await {
        Ok(Record::Listed(text)) => text,
        Ok(Record::Gone) => {
            return Err(refuse(
                ErrorKind::NotGranted,
                "Slurm does not list this job".into(),
            ))
        }
        Err(e) => return Err(refuse(ErrorKind::Backend, e.to_string())),
    };
    let Some(grant) = grant::parse_grant(&text, &cx.node.name) else {
        let e = grant::GrantError::NotHere {
            node: cx.node.name.clone(),
        };
        return Err(refuse(ErrorKind::NotGranted, e.to_string()));
    };
    match grant::check(&grant, req.gpu, req.slices) {
        Ok(slices) => {
            req.slices = slices;
            let interactive = crate::make_room::record_facts(&text).map(|f| !f.batch);
            Ok((req, interactive))
        }
        Err(e) => Err(refuse(ErrorKind::NotGranted, e.to_string())),
    }
}

/// With holds on, the queue as it is since the scheduling pass that
/// started this job (re-read when the last read does not show the job
/// running and started before the allocate arrived, `start`; a read under
/// way is waited for), so that the allocate knows the other jobs that pass
/// placed on its GPU ([`crate::mig::Geometry::choose_spot`]). A pass costs
/// one read: its allocates wait for the first one's, which shows them all.
/// (Measured: with a 2 s rate limit instead, a pass of four placed within
/// 2 s of an older read knew nothing of each other, and 3 + 2 + 1 + 1 was
/// served as `3g@0 2g@4 1g@6` and a requeue.) Without holds the last read
/// (epoch, waiting allocates) is used as it is: no extra call to Slurm.
async fn read_pass(cx: &Cx<'_>, req: &AllocateRequest, start: Instant) {
    if holds::rule(cx).is_none() || queue::shows_running(cx, req.job_id) {
        return;
    }
    // One read at a time: a read under way (another job of the pass) is
    // waited for, and it most likely shows this job too.
    cx.books
        .as_pass_reader(async {
            if queue::shows_running(cx, req.job_id) || queue::read_since(cx, start) {
                return;
            }
            let _ = queue::read(cx).await;
        })
        .await;
}

/// `--mig-profile`: exactly that profile, or a refusal naming why.
fn exact_profile(
    gpu: &Gpu,
    req: &AllocateRequest,
) -> Result<Option<&'static ProfileSpec>, ErrorBody> {
    req.profile
        .as_deref()
        .map(|name| crate::mig::requested_profile(gpu.model.spec(), name, req.slices))
        .transpose()
        .map_err(|e| ErrorBody::new(ErrorKind::InvalidRequest, format!("GPU {}: {e}", req.gpu)))
}

/// The key of the job's learned memory estimate: its user and job name.
/// The user's name may come from NSS (LDAP, SSSD): a blocking lookup. Job
/// names are the user's to choose: bounded so keys stay small.
fn memory_key(req: &AllocateRequest) -> Option<MemoryKey> {
    req.job_name
        .as_deref()
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| {
            let name: String = n.chars().take(MAX_JOB_NAME_CHARS).collect();
            MemoryKey::new(
                tokio::task::block_in_place(|| super::super::auth::user_name(req.uid)),
                name,
            )
        })
}

/// What the job needs: its slices and the memory it declared, its learned
/// estimate, or more than it ran out of before; never more than the
/// slices Slurm billed hold ([`within_grant`]).
fn sized_need(
    cx: &Cx<'_>,
    gpu: &Gpu,
    req: &AllocateRequest,
    exact: Option<&'static ProfileSpec>,
    key: Option<&MemoryKey>,
) -> Result<Need, ErrorBody> {
    let declared_gb = exact.map_or(req.memory_gb, |p| Some(f64::from(p.memory_gb)));
    let (memory_gb, sizing) = cx.books.memory(|m| {
        m.size_request(
            gpu.model.spec(),
            req.job_id,
            req.slices,
            declared_gb,
            key,
            cx.cfg().memory.estimate,
        )
    });
    match &sizing {
        Sizing::Declared => {}
        Sizing::OomRestart { after_gb } => tracing::info!(
            job = req.job_id,
            gpu = req.gpu,
            declared_gb = ?declared_gb,
            "restart after running out of memory on a {after_gb} GB instance: asking for at least {} GB",
            memory_gb.unwrap_or(0.0)
        ),
        Sizing::Estimate => tracing::info!(
            job = req.job_id,
            gpu = req.gpu,
            user = key.map_or("", |k| k.user.as_str()),
            name = key.map_or("", |k| k.name.as_str()),
            "no --mig-mem: using the learned estimate of {:.2} GB",
            memory_gb.unwrap_or(0.0)
        ),
    }
    within_grant(gpu.model.spec(), req, memory_gb, &sizing)?;
    Ok(Need {
        slices: req.slices,
        memory_gb,
    })
}

/// Refuses a memory need that only more compute slices than Slurm billed
/// hold (`req.slices`, the granted shards, rounded up to a profile size;
/// issue 53). A `--mig-mem` is a step's own option, settable inside an
/// allocation billed for less; an out-of-memory restart gets more slices
/// only once smartmigd raised the job's shard request (its grant then
/// says so), and a learned estimate is already capped there
/// ([`crate::memory::memory_within_shards`]). A memory that needs a memory
/// variant needs its room's shards (issue 55: 8 GB on an A100-40GB needs
/// 1g.10gb, which blocks a 2g.10gb's two shards), so `--mig-mem=8G` in a
/// `shard:1` allocation is refused too. The refusal names what to ask for.
fn within_grant(
    spec: &'static crate::mig::ModelSpec,
    req: &AllocateRequest,
    memory_gb: Option<f64>,
    sizing: &Sizing,
) -> Result<(), ErrorBody> {
    let Some(cap_gb) = crate::memory::memory_within_shards(spec, req.slices) else {
        // More shards than a GPU has: the profile choice refuses it.
        return Ok(());
    };
    let Some(gb) = memory_gb.filter(|&gb| gb > f64::from(cap_gb)) else {
        return Ok(());
    };
    // More than any profile has: the profile choice refuses it as such.
    let Ok(fits) = crate::mig::select_profile(spec, req.slices, Some(gb)) else {
        return Ok(());
    };
    // A memory variant blocks its room's shards (issue 55): that is what
    // the job must be billed, and job_submit.lua builds it as the room.
    let bigger = spec.room_profile(fits);
    let what = match sizing {
        Sizing::OomRestart { after_gb } => format!(
            "its restart after running out of memory on {after_gb} GB asks for {gb} GB, which"
        ),
        _ => format!("--mig-mem={gb} GB"),
    };
    let compute = bigger.shape.compute;
    let room = if std::ptr::eq(fits, bigger) {
        String::new()
    } else {
        format!(
            "; {}'s memory takes the room of a {}",
            fits.name(),
            bigger.name()
        )
    };
    let message = format!(
        "{what} needs {} ({compute} compute slices{room}), but Slurm billed this job shard:{} \
         on GPU {}, and no {} instance within that many shards has more than {cap_gb} GB; \
         submit it with --gres=shard:{compute}, or --mig-mem of at most {cap_gb}G",
        bigger.name(),
        req.slices,
        req.gpu,
        spec.id
    );
    tracing::warn!(
        job = req.job_id,
        gpu = req.gpu,
        uid = req.uid,
        "refused: {message}"
    );
    Err(ErrorBody::new(ErrorKind::NotGranted, message))
}

/// What an allocate does next on its GPU.
enum Step {
    /// Its turn: this profile, by this plan.
    Go(&'static ProfileSpec, Plan),
    /// No room now (`reason`), or others go first; `mine`: the turn is this
    /// allocate's once room frees; `no_room_for`: the profile MIG cannot
    /// build now (`None` when others go first).
    Wait {
        reason: String,
        mine: bool,
        no_room_for: Option<&'static ProfileSpec>,
    },
    /// Its scheduling pass does not fit the GPU together and this job is
    /// the one turned away, with nothing there ending within the wait
    /// ([`burst`]): refused now, for `reason`; `profile`: its own.
    Refuse {
        reason: String,
        profile: &'static ProfileSpec,
    },
}

/// Whether `me` can be served now on `gpu` (locked in `st`), and how.
fn next_step(
    cx: &Cx<'_>,
    gpu: &Gpu,
    st: &mut GpuState,
    me: &Contender,
    req: &AllocateRequest,
) -> Result<Step, ErrorBody> {
    let cfg = cx.cfg();
    // Jobs Slurm started since before this one could wait hold no
    // instance because their allocates are on their way.
    let since = queue::pass_window_start(cfg);
    // Before the ledger's lock below: the rule takes it too.
    let holds = holds::rule(cx);
    let pass = burst::decide(cx, st, req, me.need, since);
    let mates = match pass_step(gpu, st, req.job_id, pass) {
        Ok(mates) => mates,
        Err(step) => return Ok(step),
    };
    let since = st.book.since_collision_s(unix_now());
    let beside = Beside {
        mates,
        holds: holds.map(|policy| policy.on_gpu(since)),
        lend: cfg.lend_idle,
    };
    let planned = st.book.plan_exact_beside(me.need, me.exact, &beside);
    if let (false, Ok((profile, plan))) = (beside.mates.is_empty(), &planned) {
        // Which jobs of its pass an allocate left room for: the log line
        // that explains a later no_fit (docs/slurm-integration.md §9).
        tracing::info!(
            job = req.job_id,
            gpu = req.gpu,
            mates = ?beside.mates,
            busy = ?st.book.busy(),
            "{} by {plan:?}, beside the rest of its scheduling pass",
            profile.name()
        );
    }
    // Who goes first among this allocate and those waiting on the same
    // GPU (`placement`); only asked when this one could go.
    let turn = match &planned {
        Ok(_) => {
            let mut others = cx.books.node(|l| l.contenders(req.gpu, req.job_id));
            next_turn(&cx.decider.placement, st, &mut others, me)
        }
        Err(_) => {
            if st.promised.as_ref().is_some_and(|t| t.job_id == req.job_id) {
                // Promised room that is gone (a re-shape took it): let the
                // others decide again.
                st.promised = None;
                gpu.released.notify_waiters();
            }
            None
        }
    };
    let mine = turn.as_ref().is_none_or(|t| t.job_id == req.job_id);
    match planned {
        Err(Refusal::Select(e)) => Err(ErrorBody::new(
            ErrorKind::InvalidRequest,
            format!("GPU {}: {e}", req.gpu),
        )),
        // Only an out-of-memory restart asks for more than the profile,
        // and the plugin gives such jobs no marker.
        Ok((profile, _)) if me.exact.is_some_and(|p| p != profile) => Err(ErrorBody::new(
            ErrorKind::InvalidRequest,
            format!(
                "GPU {}: --mig-profile={} asked, but this run needs {}",
                req.gpu,
                req.profile.as_deref().unwrap_or_default(),
                profile.name()
            ),
        )),
        Ok((profile, plan)) if mine => Ok(match turn {
            Some(t) => Step::Go(t.profile, t.plan),
            None => Step::Go(profile, plan),
        }),
        Err(Refusal::NoFit { reason, profile }) => Ok(Step::Wait {
            reason,
            mine,
            no_room_for: Some(profile),
        }),
        // No instance can be made on this GPU, through no fault of the
        // job: `no_fit`, so the plugin requeues a batch job (the node is
        // drained, so Slurm places it elsewhere) rather than failing it.
        Err(e @ Refusal::Unhealthy { .. }) => Err(ErrorBody::new(ErrorKind::NoFit, e.to_string())),
        Ok(_) => Ok(Step::Wait {
            reason: format!(
                "GPU {}: jobs that go first under placement `{}` take the room",
                req.gpu,
                cx.decider.placement_name()
            ),
            mine,
            no_room_for: None,
        }),
    }
}

/// The mates an allocate leaves room for, or, when its pass refuses it
/// now ([`burst`]), that step. A promise of room to job `job_id` is
/// withdrawn, and the other waiters decide again.
fn pass_step(gpu: &Gpu, st: &mut GpuState, job_id: u64, pass: burst::Pass) -> Result<Mix, Step> {
    let step = match pass {
        burst::Pass::Place(mates) => return Ok(mates),
        burst::Pass::Refuse(reason, profile) => {
            st.book.mark_collision(unix_now());
            Step::Refuse { reason, profile }
        }
    };
    if st.promised.as_ref().is_some_and(|t| t.job_id == job_id) {
        st.promised = None;
        gpu.released.notify_waiters();
    }
    Err(step)
}

/// Answers an allocate that [`burst`] refused at once: its shards go back
/// to Slurm with the requeue that follows, so the holds are synced first
/// (as for an allocate that gave up waiting, [`Wait::for_room`]), and a
/// batch job's user is told why ([`room::pass_refusal_told`]).
async fn refuse_now(
    cx: &Cx<'_>,
    req: &AllocateRequest,
    reason: String,
    profile: &'static ProfileSpec,
) -> ErrorBody {
    holds::sync(cx).await;
    room::pass_refusal_told(cx, req, &reason, profile);
    ErrorBody::new(ErrorKind::NoFit, reason)
}

/// The turn on `st`'s GPU when `me` could be served now: the promise
/// still standing, else the placement rule's choice among `me` and
/// `others` (remembered when it is another job). `None`: `me`, with the
/// plan [`GpuBook::plan`] gave (no one else waits, and the rule would
/// not choose a profile).
fn next_turn(
    placement: &PlacementCell,
    st: &mut GpuState,
    others: &mut Vec<Contender>,
    me: &Contender,
) -> Option<Turn> {
    if let Some(t) = &st.promised {
        if t.job_id != me.job_id && others.iter().any(|c| c.job_id == t.job_id) {
            return Some(t.clone());
        }
        if t.job_id == me.job_id {
            let want = me.need.memory_gb.unwrap_or(0.0);
            if let Ok(plan) = st.book.plan_profile(t.profile, want) {
                return Some(Turn { plan, ..t.clone() });
            }
        }
        st.promised = None;
    }
    placement.with(|rule| {
        if others.is_empty() && !matches!(*rule, PlacementRule::Learned { .. }) {
            return None;
        }
        others.push(me.clone());
        let turn = rule.next_turn(&st.book, others, unix_now_f64())?;
        if turn.job_id != me.job_id {
            st.promised = Some(turn.clone());
        }
        Some(turn)
    })
}

/// An allocate's wait for room: until `allocate_wait_s` after it arrived,
/// listed in the ledger's waiting allocates from its first wait on.
struct Wait<'a> {
    gpu: &'a Gpu,
    start: Instant,
    limit: Duration,
    deadline: tokio::time::Instant,
    shutdown: watch::Receiver<bool>,
    listed: Option<WaitingGuard<'a>>,
    /// Its asking for room when it is an interactive job's step.
    room: room::Asker,
}

impl<'a> Wait<'a> {
    fn new(cx: &Cx<'a>, gpu: &'a Gpu, start: Instant, interactive: Option<bool>) -> Wait<'a> {
        let limit = Duration::from_secs(cx.cfg().allocate_wait_s);
        Wait {
            gpu,
            start,
            limit,
            deadline: tokio::time::Instant::from_std(start + limit),
            shutdown: cx.node.shutdown.subscribe(),
            listed: None,
            room: room::Asker::new(interactive),
        }
    }

    /// Waits (the GPU's lock `st` given up) until a release or a re-shape
    /// may have made room, the queue was re-read, or the time is up
    /// (`no_fit`, naming `reason`, and for an interactive step what to do
    /// instead: [`room::advice`]), or the daemon shuts down. `why`: the
    /// reason, and the profile MIG cannot build now, if that is it.
    async fn for_room(
        &mut self,
        cx: &Cx<'a>,
        mut st: GpuTx<'_>,
        req: &AllocateRequest,
        me: &Contender,
        why: (String, Option<&'static ProfileSpec>),
        mine: bool,
    ) -> Result<(), ErrorBody> {
        let (reason, no_room_for) = why;
        if tokio::time::Instant::now() >= self.deadline {
            let holders = st.book.holders();
            st.book.mark_collision(unix_now());
            drop(st);
            let elsewhere = match no_room_for {
                Some(profile) => room::room_elsewhere(cx, req.gpu, profile).await,
                None => None,
            };
            let reason = format!(
                "{reason}; waited {} s{}",
                self.limit.as_secs(),
                room::advice(cx, req, elsewhere)
            );
            // The user sees the reason; the admin's log line also names
            // the jobs holding the GPU's instances.
            tracing::warn!(job = req.job_id, gpu = req.gpu, held_by = ?holders, "{reason}");
            // The job is requeued (or its step fails) on this answer, and
            // Slurm frees its shards: they were counted as used while it
            // waited, so the hold on what MIG still cannot build there is
            // queued first, or Slurm's next pass hands them to a job that
            // meets the same wall (measured: a second 3g placed beside
            // `1g@0` and `3g@4` 3 s after the first was requeued).
            self.listed = None;
            holds::sync(cx).await;
            room::batch_no_fit_told(cx, req, &reason, no_room_for);
            return Err(ErrorBody::new(ErrorKind::NoFit, reason));
        }
        // The job whose turn it is may be asleep: wake it before this
        // allocate starts listening (it would wake itself otherwise). The
        // GPU's lock is still held, so nothing can change before we listen.
        if !mine {
            self.gpu.released.notify_waiters();
        }
        let notified = self.gpu.released.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        drop(st);
        self.list(cx, req, me);
        // The holders may have ended without a release (no epilog): ask
        // Slurm now rather than at the next epoch.
        if mine && queue::is_stale(cx) {
            if let Some((q, t0)) = queue::read(cx).await {
                let _ = reap::ended_jobs(cx, &q, t0).await;
                return Ok(());
            }
        }
        tokio::select! {
            _ = tokio::time::timeout_at(self.deadline, notified) => Ok(()),
            _ = self.shutdown.changed() => {
                Err(ErrorBody::new(ErrorKind::ShuttingDown, "smartmigd is shutting down"))
            }
        }
    }

    /// Lists the allocate among the waiting ones (once), for status and
    /// the placement rule; it leaves the list when the allocate returns.
    fn list(&mut self, cx: &Cx<'a>, req: &AllocateRequest, me: &Contender) {
        if self.listed.is_some() {
            return;
        }
        cx.books.node(|l| {
            l.waiting.insert(
                req.job_id,
                Waiter {
                    gpu: req.gpu,
                    since: self.start,
                    uid: req.uid,
                    contender: me.clone(),
                    asked: (req.deadline, req.time_limit_s),
                },
            )
        });
        self.listed = Some(WaitingGuard {
            books: cx.books,
            gpu: self.gpu,
            job_id: req.job_id,
        });
    }
}

/// Runs a plan against the backend, records it in the book and the
/// journal (durably) and builds the reply.
fn execute(
    cx: &Cx<'_>,
    gpu: &Gpu,
    st: &mut GpuState,
    req: &AllocateRequest,
    profile: &'static ProfileSpec,
    plan: Plan,
    waited_ms: u64,
) -> Result<AllocateReply, ErrorBody> {
    let now = unix_now();
    let (uuid, action) = carry_out(cx, gpu.index, &mut st.book, plan, now)?;
    st.tick_energy();
    st.book.assign(
        &uuid,
        Assignment {
            job_id: req.job_id,
            step: req.step,
            uid: req.uid,
            since: now,
            deadline: req.deadline,
            time_limit_s: req.time_limit_s,
            wait_s: waited_ms / 1000,
            billed: Some(req.slices),
        },
    );
    hand_over(cx, gpu.index, &mut st.book, req, &uuid, now)?;
    let placed = st.book.find_uuid(&uuid).map(|i| i.placement);
    let g = st.book.geometry;
    let start = placed.map_or(0, |p| g.spot(p).start);
    let p = placed.map_or(profile, |p| g.spot(p).profile);
    tracing::info!(gpu = gpu.index, job = req.job_id, uid = req.uid, %uuid, profile = %p.name(), start, ?action, "allocated");
    let note = cx.books.node(|l| l.requeue_notes.remove(&req.job_id));
    if note.is_some() {
        tracing::info!(
            job = req.job_id,
            "the job's output is told why its last run was requeued"
        );
    }
    Ok(AllocateReply {
        uuid,
        gpu: gpu.index,
        profile: p.name(),
        start,
        compute: p.shape.compute,
        memory_gb: p.memory_gb,
        reused: matches!(action, AllocAction::Reused),
        action,
        waited_ms,
        note,
    })
}

/// The instance a plan yields: an idle one, one created in free space, or
/// one created after destroying idle ones (never a busy one).
fn carry_out(
    cx: &Cx<'_>,
    gpu: u32,
    book: &mut GpuBook,
    plan: Plan,
    now: u64,
) -> Result<(String, AllocAction), ErrorBody> {
    let failed = |book: &mut GpuBook, e| instances::resync(cx.svc, gpu, book, &e);
    match plan {
        Plan::Reuse { uuid } => Ok((uuid, AllocAction::Reused)),
        Plan::Create { placement } => {
            let uuid = instances::create(cx.svc, gpu, book, placement, now)
                .map_err(|e| failed(book, e))?;
            Ok((uuid, AllocAction::Created))
        }
        Plan::Reshape { destroy, placement } => {
            for victim in &destroy {
                let busy = book.find_uuid(victim).is_some_and(|i| i.job.is_some());
                assert!(!busy, "plan destroys busy instance {victim}");
                instances::destroy_idle(cx.svc, gpu, book, victim, " to re-shape")
                    .map_err(|e| failed(book, e))?;
            }
            let uuid = instances::create(cx.svc, gpu, book, placement, now)
                .map_err(|e| failed(book, e))?;
            Ok((uuid, AllocAction::Reshaped))
        }
    }
}

/// Gives instance `uuid`, just assigned to the job, to its user and
/// journals it; on failure the assignment is undone.
fn hand_over(
    cx: &Cx<'_>,
    gpu: u32,
    book: &mut GpuBook,
    req: &AllocateRequest,
    uuid: &str,
    now: u64,
) -> Result<(), ErrorBody> {
    let cfg = cx.cfg();
    if let Err(e) = cx.svc.isolate(cfg, book, Some(uuid)) {
        // The job would run on an instance others can open too.
        book.release(req.job_id, now);
        let _ = cx.svc.isolate(cfg, book, Some(uuid));
        return Err(ErrorBody::new(
            ErrorKind::Backend,
            format!("cannot give instance {uuid} to uid {}: {e}", req.uid),
        ));
    }
    if let Err(e) = cx.svc.save_journal(book) {
        book.release(req.job_id, now);
        let _ = cx.svc.isolate(cfg, book, Some(uuid));
        tracing::error!(gpu, job = req.job_id, "{e}");
        return Err(ErrorBody::new(
            ErrorKind::Backend,
            format!("cannot record the allocation: {e}"),
        ));
    }
    cx.svc.publish_jobs(book);
    Ok(())
}

/// What follows a served allocate: the memory bookkeeping learns of the
/// run, and the job's `AdminComment` is tagged in the background.
fn after_allocate(
    cx: &Cx<'_>,
    req: &AllocateRequest,
    key: Option<MemoryKey>,
    exact: bool,
    profile: &ProfileSpec,
    waited_ms: u64,
) {
    cx.books
        .memory(|m| m.on_allocate(req.job_id, key, exact, unix_now_f64()));
    cx.svc.usage.spawn_tag(
        cx.cfg(),
        cx.live.slurm.clone(),
        &cx.books.accounts,
        req.job_id,
        SliceTag {
            profile: profile.name(),
            gpu: req.gpu,
            memory_gb: profile.memory_gb,
            wait_s: waited_ms / 1000,
        },
    );
}
