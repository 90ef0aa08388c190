//! One GPU's part of the books: its state ([`GpuState`]) behind its own
//! async lock, reached only through a [`GpuTx`].

use std::ops::{Deref, DerefMut};

use tokio::sync::Notify;

use super::super::clock::unix_now_f64;
use crate::allocate::GpuBook;
use crate::memory::{next_larger_memory, Released};
use crate::mig::{Geometry, GpuModel, SpotId};
use crate::placement::Turn;
use crate::workload::{gpu_load, PowerModel};

/// Energy of one GPU integrated from the workload power model (used when
/// the backend has no energy counter, i.e. on the sim backend).
pub(in crate::server) struct EnergyMeter {
    power: PowerModel,
    last: f64,
    joules: f64,
}

impl EnergyMeter {
    pub(in crate::server) fn new(model: GpuModel) -> EnergyMeter {
        EnergyMeter {
            power: PowerModel::default_for(model),
            last: unix_now_f64(),
            joules: 0.0,
        }
    }

    /// Accounts the time since the last call at `load` (the load that held
    /// during that time: call before every busy/idle change).
    fn advance(&mut self, load: f64) -> f64 {
        let now = unix_now_f64();
        if now > self.last {
            self.joules += self.power.energy_j(load, now - self.last);
        }
        self.last = now;
        self.joules
    }
}

/// One GPU's state, behind its lock.
pub(in crate::server) struct GpuState {
    pub(in crate::server) book: GpuBook,
    pub(in crate::server) energy: EnergyMeter,
    /// The waiting allocate the placement rule chose last: it stands until
    /// that allocate takes it, stops waiting, or no longer fits, so that a
    /// rule whose answer drifts with the clock (the learned one) cannot
    /// make two allocates hand the turn back and forth.
    pub(in crate::server) promised: Option<Turn>,
}

impl GpuState {
    fn load(&self) -> f64 {
        let g = self.book.geometry;
        gpu_load(
            self.book.busy().iter().map(|id| g.spot(id).compute()),
            g.spec.compute_slices,
        )
    }

    /// The modelled energy so far (call before every busy/idle change).
    pub(in crate::server) fn tick_energy(&mut self) -> f64 {
        let load = self.load();
        self.energy.advance(load)
    }
}

/// One GPU: what never changes (index, model, UUID), its state behind an
/// async mutex that only [`Gpu::tx`] takes, and a wake-up for the
/// allocates waiting on it.
pub(in crate::server) struct Gpu {
    pub(in crate::server) index: u32,
    pub(in crate::server) model: GpuModel,
    /// The GPU's UUID (`GPU-...`) as the backend reported it at start
    /// (DCGM's `UUID` label), if it has one.
    pub(in crate::server) uuid: Option<String>,
    state: tokio::sync::Mutex<GpuState>,
    pub(in crate::server) released: Notify,
}

impl Gpu {
    pub(in crate::server) fn new(book: GpuBook, model: GpuModel, uuid: Option<String>) -> Gpu {
        Gpu {
            index: book.index,
            model,
            uuid,
            state: tokio::sync::Mutex::new(GpuState {
                book,
                energy: EnergyMeter::new(model),
                promised: None,
            }),
            released: Notify::new(),
        }
    }

    /// What a job on `placement` holds, as the memory bookkeeping sees it
    /// (profile, memory, and the next larger memory size for its compute
    /// slices).
    pub(in crate::server) fn held(&self, geometry: &Geometry, placement: SpotId) -> Released {
        let p = geometry.spot(placement);
        Released {
            gpu: self.index,
            profile: p.profile.name(),
            compute: p.compute(),
            memory_gb: p.profile.memory_gb,
            next_memory_gb: next_larger_memory(self.model.spec(), p.compute(), p.profile.memory_gb),
        }
    }
}

/// The one way to one GPU's state: its lock, held for as long as the
/// transaction lives. It reaches that GPU only; the ledger is reached
/// through [`super::Books::node`], whose closure cannot await, so it is
/// never held across an `.await` nor while this lock is being taken.
pub(in crate::server) struct GpuTx<'a> {
    st: tokio::sync::MutexGuard<'a, GpuState>,
}

impl Gpu {
    /// Opens a transaction on this GPU (waits for the one before it).
    pub(in crate::server) async fn tx(&self) -> GpuTx<'_> {
        GpuTx {
            st: self.state.lock().await,
        }
    }

    /// The state at start-up, before the books are shared.
    pub(in crate::server) fn state_mut(&mut self) -> &mut GpuState {
        self.state.get_mut()
    }
}

impl Deref for GpuTx<'_> {
    type Target = GpuState;
    fn deref(&self) -> &GpuState {
        &self.st
    }
}

impl DerefMut for GpuTx<'_> {
    fn deref_mut(&mut self) -> &mut GpuState {
        &mut self.st
    }
}
