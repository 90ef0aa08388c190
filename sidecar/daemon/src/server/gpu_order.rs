//! Slurm's GPU order against the backend's (`slurmd -G`): checked at
//! start, and asked again until Slurm answers once when it could not be
//! asked at start (smartmigd started before munge and Slurm: the
//! quickstart's order, issue 56).
//!
//! At start a mismatch stops the daemon ([`StartError::GpuOrder`]). Found
//! later, it cannot: the daemon logs it as an error, says it in `status`
//! and refuses every allocate with it, since every job would get an
//! instance on a GPU other than the one Slurm gave it.

use std::sync::Arc;
use std::time::Duration;

use smartmig_client::protocol::GpuOrderStatus;

use super::books::{GpuOrderCheck, Outcome};
use super::context::Daemon;
use super::panic;
use crate::backend::Backend;
use crate::holds::GresTyping;
use crate::slurm::{GresGpu, SlurmClient, SlurmError};

/// What a mismatch means and how to fix it (a start that finds one stops
/// with it: `StartError::GpuOrder`).
pub(super) fn mismatch(m: &str) -> String {
    format!(
        "Slurm and smartmigd number the GPUs differently: {m}. Slurm numbers the GPUs of gres.conf by device name (/dev/nvidiaN in sorted order), smartmigd by NVML index; they agree when NVML's GPU N is /dev/nvidiaN (`nvidia-smi -q` shows each GPU's Minor Number)"
    )
}

/// The first wait before asking Slurm again; doubled after each failed
/// ask up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(2);
/// The longest wait between two asks.
const RETRY_MAX: Duration = Duration::from_secs(300);

impl GpuOrderCheck {
    /// The `gpu_order` section of a status reply.
    pub(super) fn status(&self) -> Option<GpuOrderStatus> {
        let (state, detail) = match self.outcome.as_ref()? {
            Outcome::Matches { gpus, .. } => (
                "matches",
                format!("Slurm's {gpus} gpu GRES are the backend's GPUs in the same order"),
            ),
            Outcome::NoGres => (
                "not-checked",
                "slurmd -G lists no gpu GRES for this node".to_string(),
            ),
            Outcome::Unanswered(e) => (
                "waiting",
                format!("Slurm has not answered yet ({e}); smartmigd asks again"),
            ),
            Outcome::Mismatch(m) => ("mismatch", m.clone()),
        };
        Some(GpuOrderStatus {
            state: state.into(),
            detail,
            attempts: self.attempts,
        })
    }

    /// What Slurm's answer says about per-GPU GRES types (the holds,
    /// [`crate::holds::decide`]).
    pub(super) fn typing(&self) -> GresTyping {
        match &self.outcome {
            Some(Outcome::Matches { typing, .. }) => typing.clone(),
            Some(Outcome::NoGres) => GresTyping::NoGpus,
            _ => GresTyping::Unknown,
        }
    }

    /// The refusal of an allocate while the order is known to be wrong.
    pub(super) fn refusal(&self) -> Option<String> {
        match &self.outcome {
            Some(Outcome::Mismatch(m)) => Some(format!(
                "{}; smartmigd hands out no instance until gres.conf is fixed and smartmigd restarted",
                mismatch(m)
            )),
            _ => None,
        }
    }
}

/// Asks Slurm (`slurmd -G`) and compares its GPU order with the backend's.
/// Blocking: it runs slurmd.
pub(super) fn ask(backend: &dyn Backend, slurm: &dyn SlurmClient, node: &str) -> Outcome {
    compare(backend, node, slurm.gres_gpus(node))
}

fn compare(backend: &dyn Backend, node: &str, gres: Result<Vec<GresGpu>, SlurmError>) -> Outcome {
    let gres = match gres {
        Ok(g) if g.is_empty() => return Outcome::NoGres,
        Ok(g) => g,
        Err(e) => return Outcome::Unanswered(e.to_string()),
    };
    let typed: Vec<&str> = gres.iter().filter_map(|g| g.mig_type.as_deref()).collect();
    if !typed.is_empty() {
        return Outcome::Mismatch(format!(
            "Slurm's gpu GRES on {node} are MIG devices (Type={}): the node still runs a static MIG setup. \
             Keep mode = \"advise\" there, or drain the node and change its gres.conf to one gpu and one \
             shard per compute slice for each GPU (docs/slurm-integration.md §1 and §2d) before running \
             smartmigd in dynamic or confirm mode",
            typed.join(",")
        ));
    }
    let ours: Vec<(u32, Option<u32>)> = backend.gpus().iter().map(|g| (g.index, g.minor)).collect();
    let minor_of = |file: &str| {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let meta = std::fs::metadata(file).ok()?;
        meta.file_type()
            .is_char_device()
            .then(|| libc::minor(meta.rdev() as libc::dev_t))
    };
    let mismatches = crate::slurm::gpu_order_mismatches(&ours, &gres, minor_of);
    if mismatches.is_empty() {
        Outcome::Matches {
            gpus: gres.len(),
            typing: crate::holds::typing(&gres),
        }
    } else {
        Outcome::Mismatch(mismatches.join("; "))
    }
}

/// Logs an outcome: `at` says when ("at start", "on ask N").
pub(super) fn log(node: &str, outcome: &Outcome, at: &str) {
    match outcome {
        Outcome::Matches { gpus, .. } => {
            tracing::info!(node, gpus, "Slurm's GPU order matches the backend's ({at})");
        }
        Outcome::NoGres => tracing::warn!(
            node,
            "slurmd -G lists no gpu GRES for this node; GPU order not checked ({at})"
        ),
        Outcome::Unanswered(e) => tracing::warn!(
            node,
            "cannot check Slurm's GPU order ({e}); smartmigd asks again until Slurm answers, \
             with waits from {} s up to {} s ({at})",
            RETRY_FIRST.as_secs(),
            RETRY_MAX.as_secs()
        ),
        Outcome::Mismatch(m) => tracing::error!(
            node,
            "{}; allocates are refused until gres.conf is fixed and smartmigd restarted ({at})",
            mismatch(m)
        ),
    }
}

/// Asks Slurm again, with growing waits, until it answers once (the
/// check at start could not ask it); then stops. Nothing to do when the
/// check at start got an answer or was not made.
pub(super) fn spawn_retry(daemon: &Arc<Daemon>) {
    let pending = daemon
        .books
        .node(|l| matches!(l.gpu_order.outcome, Some(Outcome::Unanswered(_))));
    if !pending {
        return;
    }
    let daemon = daemon.clone();
    let mut stop = daemon.node.shutdown.subscribe();
    tokio::spawn(async move {
        let mut wait = RETRY_FIRST;
        loop {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = stop.changed() => break,
            }
            let span = tracing::info_span!("loop", task = "gpu_order");
            let round =
                tracing::Instrument::instrument(panic::catch(retry_once(daemon.clone())), span);
            match round.await {
                Ok(true) => break,
                Ok(false) => {}
                Err(message) => {
                    daemon.svc.metrics.panic("gpu_order");
                    tracing::error!("panic in the GPU order check: {message}; asking again later");
                }
            }
            wait = (wait * 2).min(RETRY_MAX);
        }
    });
}

/// One ask; true once Slurm answered.
async fn retry_once(daemon: Arc<Daemon>) -> bool {
    let slurm = daemon.settings.current().slurm.clone();
    let asker = daemon.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        ask(asker.svc.backend.as_ref(), slurm.as_ref(), &asker.node.name)
    })
    .await
    .unwrap_or_else(|e| Outcome::Unanswered(format!("the check failed: {e}")));
    let attempts = {
        daemon.books.node(|ledger| {
            ledger.gpu_order.attempts += 1;
            ledger.gpu_order.outcome = Some(outcome.clone());
            ledger.gpu_order.attempts
        })
    };
    let answered = outcome.answered();
    if answered {
        log(&daemon.node.name, &outcome, &format!("ask {attempts}"));
        super::holds::log_decision(&daemon.cx(), &format!("ask {attempts}"));
    } else {
        tracing::debug!(attempts, "Slurm has not answered the GPU order check yet");
    }
    answered
}
