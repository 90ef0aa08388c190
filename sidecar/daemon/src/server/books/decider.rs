//! What decides: the policy, the shadow's fallback and the placement rule,
//! each with state of its own (learned, greedy's batching window, the
//! learned rule's), built from the settings and replaced whole with them
//! by a SIGHUP ([`super::Books::install`]).

use std::sync::{Arc, Mutex};

use super::cells::unpoisoned;
use crate::placement::PlacementRule;
use crate::policy::RepartitionPolicy;
use crate::policy_choice::Built;

/// The policy, the fallback and the placement rule of one set of
/// settings. A request or an epoch takes one `Arc<Decider>` together with
/// its settings ([`super::Books::in_effect`]): it asks the policy of the
/// settings it reads, never a newer or an older one.
pub(in crate::server) struct Decider {
    /// The configured policy.
    pub(in crate::server) policy: PolicyCell,
    pub(in crate::server) policy_name: String,
    /// The shadow's fallback and its name, while the shadow is on
    /// (`[shadow]`): it sees every epoch, its decisions apply while the
    /// shadow says it runs ([`super::super::shadow`]).
    pub(in crate::server) fallback: Option<(PolicyCell, String)>,
    /// Which waiting allocate goes first (`placement`); asked in a GPU's
    /// transaction.
    pub(in crate::server) placement: PlacementCell,
}

impl Decider {
    pub(in crate::server) fn new(
        policy: Built,
        fallback: Option<Built>,
        placement: PlacementRule,
    ) -> Decider {
        let (policy, policy_name) = policy;
        Decider {
            policy: PolicyCell::new(policy),
            policy_name,
            fallback: fallback.map(|(p, name)| (PolicyCell::new(p), name)),
            placement: PlacementCell(Mutex::new(placement)),
        }
    }

    /// The `placement` rule's name, as status and the log show it.
    pub(in crate::server) fn placement_name(&self) -> String {
        self.placement.with(|p| p.name())
    }
}

/// A policy and its own state. Third in the lock order: after a GPU's
/// transaction, before the ledger.
#[derive(Clone)]
pub(in crate::server) struct PolicyCell(Arc<tokio::sync::Mutex<Box<dyn RepartitionPolicy + Send>>>);

impl PolicyCell {
    fn new(policy: Box<dyn RepartitionPolicy + Send>) -> PolicyCell {
        PolicyCell(Arc::new(tokio::sync::Mutex::new(policy)))
    }

    /// Asks the policy (the closure cannot await).
    pub(in crate::server) async fn with<R>(
        &self,
        f: impl FnOnce(&mut (dyn RepartitionPolicy + Send)) -> R,
    ) -> R {
        let mut p = self.0.lock().await;
        f(p.as_mut())
    }
}

/// The placement rule and its own state: asked under a GPU's
/// transaction, a leaf.
pub(in crate::server) struct PlacementCell(Mutex<PlacementRule>);

impl PlacementCell {
    pub(in crate::server) fn with<R>(&self, f: impl FnOnce(&mut PlacementRule) -> R) -> R {
        f(&mut unpoisoned(&self.0))
    }
}
