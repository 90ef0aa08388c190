//! The holds on stranded shards this node has in Slurm: first in the lock
//! order.

use std::ops::{Deref, DerefMut};

use tokio::sync::{Mutex, MutexGuard, Notify};

use crate::holds::Hold;

#[derive(Default)]
pub(super) struct HoldBook {
    held: Mutex<Vec<Hold>>,
    /// Woken after an allocate: the background sync runs.
    pub(super) wanted: Notify,
}

impl HoldBook {
    pub(super) async fn tx(&self) -> HoldsTx<'_> {
        HoldsTx(self.held.lock().await)
    }
}

/// The holds, held for a sync (GPU transactions may be opened meanwhile,
/// one at a time).
pub(in crate::server) struct HoldsTx<'a>(MutexGuard<'a, Vec<Hold>>);

impl Deref for HoldsTx<'_> {
    type Target = Vec<Hold>;
    fn deref(&self) -> &Vec<Hold> {
        &self.0
    }
}

impl DerefMut for HoldsTx<'_> {
    fn deref_mut(&mut self) -> &mut Vec<Hold> {
        &mut self.0
    }
}
