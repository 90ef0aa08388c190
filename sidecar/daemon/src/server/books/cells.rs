//! The small cells of the books: the settings swapped as a whole, the
//! memory estimates, the jobs' accounts, the connection counts and the
//! usage log's turn. Each is a lock reached only through a closure (or,
//! for the settings, a clone).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use crate::memory::MemoryState;

/// A poisoned lock's data: every update leaves the books consistent, so a
/// panic elsewhere (answered `internal`) does not stop the daemon.
pub(super) fn unpoisoned<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A value replaced whole (the settings in effect): a reader takes one
/// snapshot ([`SwapCell::current`]) and reads everything from it, so it
/// sees the old value or the new one, never a mix.
pub(in crate::server) struct SwapCell<T>(RwLock<Arc<T>>);

impl<T> SwapCell<T> {
    pub(in crate::server) fn new(value: T) -> SwapCell<T> {
        SwapCell(RwLock::new(Arc::new(value)))
    }

    /// The value in effect: one snapshot, consistent in itself.
    pub(in crate::server) fn current(&self) -> Arc<T> {
        self.0
            .read()
            .map(|l| l.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Installs a new value in one swap.
    pub(in crate::server) fn replace(&self, value: T) {
        let snapshot = Arc::new(value);
        match self.0.write() {
            Ok(mut l) => *l = snapshot,
            Err(p) => *p.into_inner() = snapshot,
        }
    }
}

/// The learned memory estimates and the out-of-memory ledger (short,
/// synchronous critical sections; a leaf). Shared with the background
/// saves and requeues.
#[derive(Clone)]
pub(in crate::server) struct MemoryBook(Arc<Mutex<MemoryState>>);

impl MemoryBook {
    pub(in crate::server) fn new(state: MemoryState) -> MemoryBook {
        MemoryBook(Arc::new(Mutex::new(state)))
    }

    pub(in crate::server) fn with<R>(&self, f: impl FnOnce(&mut MemoryState) -> R) -> R {
        f(&mut unpoisoned(&self.0))
    }

    /// Saves the memory state in the background (fsync'd, after the reply;
    /// saves queue on the lock, so the last one writes the newest state).
    pub(in crate::server) fn save_later(&self, job_id: u64) {
        let memory = self.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = memory.with(|m| m.save()) {
                tracing::error!(job = job_id, "memory estimates not saved: {e}");
            }
        });
    }
}

/// The Slurm accounts of running jobs (a leaf), filled in the background
/// when a job's `AdminComment` is tagged.
#[derive(Clone, Default)]
pub(in crate::server) struct Accounts(Arc<Mutex<HashMap<u64, String>>>);

impl Accounts {
    pub(in crate::server) fn insert(&self, job_id: u64, account: String) {
        unpoisoned(&self.0).insert(job_id, account);
    }

    pub(in crate::server) fn remove(&self, job_id: u64) -> Option<String> {
        unpoisoned(&self.0).remove(&job_id)
    }
}

/// Connections of unprivileged users, per uid and in total.
#[derive(Debug, Default)]
pub(in crate::server) struct Counts {
    pub(in crate::server) per_uid: HashMap<u32, usize>,
    pub(in crate::server) total: usize,
}

/// The connections unprivileged users hold now (a leaf).
#[derive(Clone, Debug, Default)]
pub(in crate::server) struct Connections(Arc<Mutex<Counts>>);

impl Connections {
    pub(in crate::server) fn with<R>(&self, f: impl FnOnce(&mut Counts) -> R) -> R {
        f(&mut unpoisoned(&self.0))
    }
}

/// One at a time (a leaf): the usage log's appends and rotation.
#[derive(Debug, Default)]
pub(in crate::server) struct Turn(Mutex<()>);

impl Turn {
    pub(in crate::server) fn take<R>(&self, f: impl FnOnce() -> R) -> R {
        let _turn = unpoisoned(&self.0);
        f()
    }
}
