//! The node's books: every piece of mutable node state smartmigd keeps,
//! with one owner ([`Books`]) and the only locks of the server. Nothing
//! outside this module takes a lock; the layers above reach the state
//! through the doors below, and the doors' types keep the lock order
//! (docs/architecture.md, "Who owns node state"):
//!
//! 1. **Holds** ([`Books::holds`], async): the holds on stranded shards
//!    this node has in Slurm. Only a hold sync takes it, first, and may
//!    then open GPU transactions, one at a time.
//! 2. **One GPU** ([`Gpu::tx`], async): a [`GpuTx`] is the only way to a
//!    GPU's instances, who holds them, its energy meter and the promised
//!    turn. Requests for one GPU are serialised; GPUs are independent (a
//!    task holds at most one transaction at a time).
//! 3. **The policy** ([`decider::PolicyCell::with`] of the [`Decider`] in effect,
//!    async lock, synchronous closure): the policy's own state (learned,
//!    greedy's window).
//! 4. **The ledger** ([`Books::node`], synchronous closure): allocates
//!    waiting for room, Slurm's deadlines and time limits, the plans,
//!    advise mode's record, where the queue came from, who returned
//!    instances, Slurm's GPU order, the plugin's `oom_requeue`.
//! 5. **Leaves** ([`Books::memory`], [`Books::shadow`],
//!    [`PlacementCell::with`], the connection counts, the jobs' accounts,
//!    the usage log's turn): synchronous closures that hold nothing else.
//!
//! Levels 3 to 5 are reached only inside a closure that is not `async`:
//! their locks can never be held across an `.await`, hence never while a
//! level-1 or level-2 lock is being waited for, and always come after
//! them. The settings in effect are swapped as a whole through a
//! [`SwapCell`], read without blocking a writer for longer than a clone;
//! the [`Decider`] built from them (policy, fallback, placement rule) is
//! the books' and is swapped with them in one step ([`Books::install`]),
//! so that a request or an epoch ([`Books::in_effect`]) sees the settings
//! and the decider of one configuration.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};

mod cells;
mod decider;
mod gpu;
mod holds;
mod ledger;
mod shadow;

pub(super) use cells::{Accounts, Connections, MemoryBook, SwapCell, Turn};
pub(super) use decider::{Decider, PlacementCell};
pub(super) use gpu::{Gpu, GpuState, GpuTx};
pub(super) use holds::HoldsTx;
pub(super) use ledger::{
    AdviseBook, GpuOrderCheck, Ledger, Outcome, SummaryFigures, ViewSource, Waiter, Watched,
};
pub(super) use shadow::ShadowRun;

use crate::memory::MemoryState;
use crate::mig::GpuModel;
use cells::unpoisoned;

/// The node's books: the GPUs, each behind its own lock, the node-wide
/// [`Ledger`] behind one more, and the leaves.
pub(super) struct Books {
    pub gpus: Vec<Gpu>,
    ledger: Mutex<Ledger>,
    /// The policy, the fallback and the placement rule in effect.
    decider: RwLock<Arc<Decider>>,
    /// The holds on stranded shards this node has in Slurm.
    holds: holds::HoldBook,
    /// The learned memory estimates and the out-of-memory ledger.
    pub memory: MemoryBook,
    /// The day's shadow: its jobs and which policy runs.
    pub shadow: ShadowRun,
    /// The Slurm accounts of running jobs, read when their
    /// `AdminComment` was tagged, written to the usage log at release.
    pub accounts: Accounts,
    /// Serialises appends to the usage log (and its rotation).
    pub usage_turn: Turn,
    /// The connections unprivileged users hold now.
    pub connections: Connections,
    /// This daemon drained the node for a GPU-fatal XID and has not seen
    /// it resumed since ([`crate::health::node_action`]).
    pub health_drained: AtomicBool,
    /// Taken by an allocate that reads the queue for its scheduling pass:
    /// the pass's other allocates wait for that read instead of deciding
    /// on the older one (measured: the first job of a pass reading, the
    /// two behind it placed without knowing of it).
    pass_read: tokio::sync::Mutex<()>,
}

impl Books {
    pub(super) fn new(gpus: Vec<Gpu>, decider: Decider, memory: MemoryState, now: f64) -> Books {
        Books {
            gpus,
            ledger: Mutex::new(Ledger::default()),
            decider: RwLock::new(Arc::new(decider)),
            holds: holds::HoldBook::default(),
            memory: MemoryBook::new(memory),
            shadow: ShadowRun::new(now),
            accounts: Accounts::default(),
            usage_turn: Turn::default(),
            connections: Connections::default(),
            health_drained: AtomicBool::new(false),
            pass_read: tokio::sync::Mutex::new(()),
        }
    }

    /// Reads or writes the node-wide ledger. The closure cannot await: the
    /// ledger is never held across an `.await`, nor while a GPU's or the
    /// holds' lock is being taken.
    pub(super) fn node<R>(&self, f: impl FnOnce(&mut Ledger) -> R) -> R {
        f(&mut unpoisoned(&self.ledger))
    }

    /// The decider in effect, with the settings `settings` reads (a
    /// snapshot of the settings' cell): both of one configuration, since
    /// [`Books::install`] swaps them under the same lock.
    pub(super) fn in_effect<S>(&self, settings: impl FnOnce() -> S) -> (S, Arc<Decider>) {
        let decider = self
            .decider
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (settings(), decider.clone())
    }

    /// Installs a new decider and, under the same lock, the settings it
    /// was built from (`swap_settings`, a swap of the settings' cell): a
    /// SIGHUP's one step. Whoever asked the old policy keeps it until its
    /// request or epoch ends.
    pub(super) fn install(&self, decider: Decider, swap_settings: impl FnOnce()) {
        let mut in_effect = self
            .decider
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        swap_settings();
        *in_effect = Arc::new(decider);
    }

    /// The ledger at start-up, before the books are shared.
    pub(super) fn node_mut(&mut self) -> &mut Ledger {
        self.ledger
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The holds, first in the lock order: GPU transactions are opened
    /// after it, one at a time.
    pub(super) async fn holds(&self) -> HoldsTx<'_> {
        self.holds.tx().await
    }

    /// Wakes the background hold sync (after an allocate).
    pub(super) fn want_holds(&self) {
        self.holds.wanted.notify_one();
    }

    /// Waits until a hold sync is wanted.
    pub(super) async fn holds_wanted(&self) {
        self.holds.wanted.notified().await;
    }

    /// Runs `f` as the scheduling pass's queue reader: the pass's other
    /// allocates wait for it.
    pub(super) async fn as_pass_reader<F: std::future::Future>(&self, f: F) -> F::Output {
        let _reading = self.pass_read.lock().await;
        f.await
    }

    /// Reads or writes the memory estimates (a leaf: holds nothing else).
    pub(super) fn memory<R>(&self, f: impl FnOnce(&mut MemoryState) -> R) -> R {
        self.memory.with(f)
    }

    /// The GPU with `index`.
    pub(super) fn gpu(&self, index: u32) -> Option<&Gpu> {
        self.gpus.get(index as usize)
    }

    pub(super) fn models(&self) -> Vec<GpuModel> {
        self.gpus.iter().map(|g| g.model).collect()
    }
}

/// Removes a job from the ledger's waiting allocates when its allocate
/// returns, by whichever path, and wakes the GPU's other waiters: the
/// placement rule may have been keeping one of them for this job.
pub(super) struct WaitingGuard<'a> {
    pub books: &'a Books,
    pub gpu: &'a Gpu,
    pub job_id: u64,
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.books.node(|l| l.waiting.remove(&self.job_id));
        self.gpu.released.notify_waiters();
    }
}
