//! XID events: what a test injects, and what `nvmlEventSetWait_v2` hands out.
//!
//! Like faults ([`crate::fault`]), events live in the shared state, so a
//! test process injects them ([`crate::Emulator::inject_xid`]) and the
//! daemon's event set sees them. Each injected XID gets a sequence number;
//! an event set (`nvmlEventSetCreate`) remembers the last number it handed
//! out and, from `nvmlDeviceRegisterEvents` on, sees the XIDs of the GPUs
//! registered for `nvmlEventTypeXidCriticalError` that were injected after
//! its creation, each once and in order. Other processes' sets are
//! unaffected (on hardware every set gets every event too).

use serde::{Deserialize, Serialize};

/// `nvmlEventTypeXidCriticalError` (nvml.h).
pub const XID_CRITICAL_ERROR: u64 = 8;

/// What NVML puts in `gpuInstanceId`/`computeInstanceId` when the event
/// is not attributable to one instance (nvml.h, `nvmlEventData_t`).
pub const NOT_ATTRIBUTED: u32 = u32::MAX;

/// One injected XID.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Xid {
    pub seq: u64,
    pub gpu: u32,
    pub xid: u64,
    /// The GPU instance (and compute instance) it is attributed to, or
    /// [`NOT_ATTRIBUTED`].
    pub gpu_instance: u32,
    pub compute_instance: u32,
}

/// One event set: the GPUs registered for XIDs and what it has seen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventSet {
    pub id: u32,
    pub gpus: Vec<u32>,
    /// The last XID sequence number handed out (or current at creation).
    pub seen: u64,
}

/// The events part of the state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Events {
    pub xids: Vec<Xid>,
    pub sets: Vec<EventSet>,
    pub next_seq: u64,
    pub next_set: u32,
}

/// Injected XIDs kept for late readers; older ones are dropped.
const KEEP: usize = 1024;

impl Events {
    /// Queues an XID on `gpu`, on GPU instance `gi` (and its compute
    /// instance `ci`) when given.
    pub fn inject(&mut self, gpu: u32, xid: u64, instance: Option<(u32, u32)>) {
        self.next_seq += 1;
        let (gi, ci) = instance.unwrap_or((NOT_ATTRIBUTED, NOT_ATTRIBUTED));
        self.xids.push(Xid {
            seq: self.next_seq,
            gpu,
            xid,
            gpu_instance: gi,
            compute_instance: ci,
        });
        if self.xids.len() > KEEP {
            self.xids.remove(0);
        }
    }

    /// A new set that sees XIDs injected from now on; returns its id.
    pub fn create_set(&mut self) -> u32 {
        self.next_set += 1;
        self.sets.push(EventSet {
            id: self.next_set,
            gpus: Vec::new(),
            seen: self.next_seq,
        });
        self.next_set
    }

    pub fn set_mut(&mut self, id: u32) -> Option<&mut EventSet> {
        self.sets.iter_mut().find(|s| s.id == id)
    }

    pub fn free_set(&mut self, id: u32) -> bool {
        let before = self.sets.len();
        self.sets.retain(|s| s.id != id);
        self.sets.len() != before
    }

    /// The next XID set `id` has not seen, if any (without taking it).
    pub fn peek(&self, id: u32) -> Option<&Xid> {
        let set = self.sets.iter().find(|s| s.id == id)?;
        self.xids
            .iter()
            .find(|x| x.seq > set.seen && set.gpus.contains(&x.gpu))
    }

    /// Takes the next XID set `id` has not seen.
    pub fn take(&mut self, id: u32) -> Option<Xid> {
        let x = self.peek(id)?.clone();
        self.set_mut(id)?.seen = x.seq;
        Some(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_sees_later_xids_of_its_gpus_once() {
        let mut e = Events::default();
        e.inject(0, 13, None);
        let s = e.create_set();
        e.set_mut(s).unwrap().gpus.push(1);
        e.inject(0, 79, None);
        e.inject(1, 94, Some((3, 0)));
        let x = e.take(s).unwrap();
        assert_eq!((x.gpu, x.xid, x.gpu_instance), (1, 94, 3));
        assert_eq!(e.take(s), None);
        e.set_mut(s).unwrap().gpus.push(0);
        // Seen numbers only grow: the GPU 0 XID before the last taken stays unseen.
        assert_eq!(e.take(s), None);
        e.inject(0, 48, None);
        assert_eq!(e.take(s).map(|x| x.gpu_instance), Some(NOT_ATTRIBUTED));
        assert!(e.free_set(s) && e.take(s).is_none());
    }
}
