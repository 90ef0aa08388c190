//! Plans: the reconfigurations the policy wants, before they happen
//! (issue 22, part 2).
//!
//! In `mode = "dynamic"` (the default) each epoch's targets are carried
//! out at once and remembered here as *applied*, so `smartmig plan` shows
//! what the policy did and why it was safe. In `mode = "confirm"` they are
//! kept as *pending* plans, one per GPU, until an admin runs `smartmig
//! apply ID` or the plan lapses after `plan_timeout_s`. A GPU's plan keeps
//! its id while the policy keeps wanting the same target, so the id an
//! admin read is the one to apply; a different target replaces it with a
//! new id. Pure bookkeeping: the daemon checks a plan against the GPU's
//! layout when it is applied (busy instances are never destroyed).

use std::collections::{BTreeMap, VecDeque};

use crate::mig::Layout;
use crate::protocol::{PlanEffect, PlanStatus};

/// Applied plans kept for `smartmig plan`.
pub const MAX_APPLIED: usize = 32;

/// A plan the daemon can carry out.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub from: Layout,
    pub to: Layout,
    /// What `plan` and `status` show.
    pub shown: PlanStatus,
}

/// Why a plan cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("no pending plan {id} (pending: {pending})")]
    NoSuchPlan { id: u64, pending: String },
    #[error(
        "plan {id} lapsed {ago} s ago (plan_timeout_s); `smartmig plan` shows the current one"
    )]
    Lapsed { id: u64, ago: u64 },
}

/// Pending plans per GPU and the last applied ones.
#[derive(Debug, Default)]
pub struct Plans {
    next_id: u64,
    pending: BTreeMap<u32, Plan>,
    applied: VecDeque<PlanStatus>,
}

impl Plans {
    /// The policy wants `gpu` to go `from` -> `to` (shown as `shown`,
    /// whose id and times are set here): a new pending plan, or the same
    /// one when it already wants exactly that. Returns the plan's id and
    /// whether it is new.
    pub fn propose(
        &mut self,
        gpu: u32,
        from: Layout,
        to: Layout,
        mut shown: PlanStatus,
        now: u64,
        timeout_s: u64,
    ) -> (u64, bool) {
        if let Some(p) = self.pending.get(&gpu) {
            if p.from == from && p.to == to {
                return (p.shown.id, false);
            }
        }
        self.next_id += 1;
        shown.id = self.next_id;
        shown.gpu = gpu;
        shown.created_at = now;
        shown.expires_at = Some(now + timeout_s);
        shown.applied_at = None;
        self.pending.insert(gpu, Plan { from, to, shown });
        (self.next_id, true)
    }

    /// `gpu` needs no reconfiguration any more: its pending plan goes.
    pub fn withdraw(&mut self, gpu: u32) -> Option<Plan> {
        self.pending.remove(&gpu)
    }

    /// `gpu`'s pending plan, withdrawn when `stale` says it no longer
    /// fits the GPU (its layout changed, or it would now destroy a busy
    /// instance).
    pub fn withdraw_if(&mut self, gpu: u32, stale: impl FnOnce(&Plan) -> bool) -> Option<Plan> {
        if self.pending.get(&gpu).is_some_and(stale) {
            return self.pending.remove(&gpu);
        }
        None
    }

    /// Removes and returns the plans whose time ran out at `now`.
    pub fn expire(&mut self, now: u64) -> Vec<Plan> {
        let lapsed: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, p)| p.shown.expires_at.is_some_and(|e| e <= now))
            .map(|(g, _)| *g)
            .collect();
        lapsed
            .into_iter()
            .filter_map(|g| self.pending.remove(&g))
            .collect()
    }

    /// Takes pending plan `id` to carry it out.
    pub fn take(&mut self, id: u64, now: u64) -> Result<Plan, PlanError> {
        let gpu = self
            .pending
            .iter()
            .find(|(_, p)| p.shown.id == id)
            .map(|(g, _)| *g);
        let Some(plan) = gpu.and_then(|g| self.pending.remove(&g)) else {
            let ids: Vec<String> = self
                .pending
                .values()
                .map(|p| p.shown.id.to_string())
                .collect();
            return Err(PlanError::NoSuchPlan {
                id,
                pending: if ids.is_empty() {
                    "none".into()
                } else {
                    ids.join(", ")
                },
            });
        };
        match plan.shown.expires_at {
            Some(e) if e <= now => Err(PlanError::Lapsed { id, ago: now - e }),
            _ => Ok(plan),
        }
    }

    /// A reconfiguration was carried out (an applied plan, or a dynamic
    /// epoch's target); returns it as recorded (id and times set).
    pub fn record_applied(&mut self, mut shown: PlanStatus, now: u64) -> PlanStatus {
        if shown.id == 0 {
            self.next_id += 1;
            shown.id = self.next_id;
            shown.created_at = now;
        }
        shown.expires_at = None;
        shown.applied_at = Some(now);
        self.applied.push_back(shown.clone());
        while self.applied.len() > MAX_APPLIED {
            self.applied.pop_front();
        }
        shown
    }

    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// Pending plans as (GPU, target), to refresh their expected effect.
    pub fn pending_targets(&self) -> Vec<(u32, Layout)> {
        self.pending.iter().map(|(&g, p)| (g, p.to)).collect()
    }

    /// Sets the expected effect of `gpu`'s pending plan (the queue moves
    /// each epoch, and so does what the plan would do to it).
    pub fn set_effect(&mut self, gpu: u32, effect: Option<PlanEffect>) {
        if let Some(p) = self.pending.get_mut(&gpu) {
            p.shown.effect = effect;
        }
    }

    pub fn pending(&self) -> Vec<PlanStatus> {
        self.pending.values().map(|p| p.shown.clone()).collect()
    }

    pub fn applied(&self) -> Vec<PlanStatus> {
        self.applied.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::{Geometry, GpuModel};

    fn shown() -> PlanStatus {
        PlanStatus {
            id: 0,
            gpu: 0,
            from: "a".into(),
            to: "b".into(),
            destroy: vec![],
            create: vec![],
            keeps_busy: vec![],
            created_at: 0,
            expires_at: None,
            applied_at: None,
            effect: None,
        }
    }

    fn layouts() -> (Layout, Layout) {
        let g = Geometry::of(GpuModel::A100_40gb);
        let a = g.whole_gpu();
        let b = g
            .maximal()
            .iter()
            .copied()
            .find(|l| *l != a)
            .expect("another layout");
        (a, b)
    }

    #[test]
    fn the_same_target_keeps_its_id_another_gets_a_new_one() {
        let (a, b) = layouts();
        let mut p = Plans::default();
        assert_eq!(p.propose(0, a, b, shown(), 100, 60), (1, true));
        assert_eq!(p.propose(0, a, b, shown(), 130, 60), (1, false));
        assert_eq!(p.propose(0, a, a, shown(), 140, 60), (2, true));
        assert_eq!(p.propose(1, a, b, shown(), 140, 60), (3, true));
        assert_eq!(p.pending().len(), 2);
        assert!(p.withdraw(1).is_some());
        assert_eq!(p.pending().len(), 1);
    }

    #[test]
    fn plans_lapse_and_are_taken_once() {
        let (a, b) = layouts();
        let mut p = Plans::default();
        let (id, _) = p.propose(0, a, b, shown(), 100, 60);
        assert_eq!(p.expire(159).len(), 0);
        let taken = p.take(id, 150).expect("pending");
        assert_eq!((taken.from, taken.to), (a, b));
        let e = p.take(id, 150).unwrap_err();
        assert_eq!(e.to_string(), "no pending plan 1 (pending: none)");
        let (id, _) = p.propose(0, a, b, shown(), 200, 60);
        assert!(matches!(
            p.take(id, 260),
            Err(PlanError::Lapsed { ago: 0, .. })
        ));
        let (_, _) = p.propose(0, a, b, shown(), 300, 60);
        assert_eq!(p.expire(360).len(), 1);
        assert!(p.pending().is_empty());
    }

    #[test]
    fn applied_plans_are_kept_bounded() {
        let mut p = Plans::default();
        for t in 0..(MAX_APPLIED as u64 + 5) {
            p.record_applied(shown(), t);
        }
        let a = p.applied();
        assert_eq!(a.len(), MAX_APPLIED);
        assert!(a
            .iter()
            .all(|s| s.applied_at.is_some() && s.expires_at.is_none()));
        assert!(a.windows(2).all(|w| w[0].id < w[1].id));
    }
}
