//! Checkpoint selection: the trainer keeps the network with the best
//! validation objective seen so far, since neither PPO nor ES improves the
//! deterministic policy monotonically (docs/policy.md).

use super::model::ActorCritic;
use super::LearnError;
use crate::sim::Standing;

/// The best network seen so far (by its validation standing: jobs left
/// unserved first, then ET; `sim::Standing`) and where it came from.
pub(super) struct Checkpoint {
    /// Its validation standing.
    pub(super) score: Standing,
    /// A copy with its own parameters (training goes on with the original).
    pub(super) net: ActorCritic,
    /// `imitation`, `ppo:<iteration>` or `es:<iteration>`.
    pub(super) label: String,
}

impl Checkpoint {
    /// The first checkpoint: a copy of `net` whatever its standing.
    pub(super) fn new(
        score: Standing,
        net: &ActorCritic,
        label: String,
    ) -> Result<Self, LearnError> {
        Ok(Checkpoint {
            score,
            net: net.clone_deep()?,
            label,
        })
    }

    /// Keeps a copy of `net` if its validation standing beats the best so
    /// far.
    pub(super) fn offer(
        &mut self,
        score: Standing,
        net: &ActorCritic,
        label: impl FnOnce() -> String,
    ) -> Result<(), LearnError> {
        if score.beats(&self.score) {
            self.score = score;
            self.net = net.clone_deep()?;
            self.label = label();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{net, tiny};
    use super::*;

    /// A checkpoint keeps the better of what it is offered (serving every
    /// job beats any ET; ties keep the earlier), asks for a label only when
    /// it keeps, and owns its weights: training the offered network
    /// further leaves the checkpoint as it was.
    #[test]
    fn keeps_the_best_and_owns_its_copy() {
        let cfg = tiny();
        let (a, b) = (net(&cfg, 1), net(&cfg, 2));
        let bytes = |n: &ActorCritic| n.export_onnx(&[]).unwrap();
        assert_ne!(bytes(&a), bytes(&b));
        let mut c = Checkpoint::new(Standing::new(2, 0.1), &a, "first".into()).unwrap();
        c.offer(Standing::new(3, 0.01), &b, || {
            unreachable!("more unserved kept")
        })
        .unwrap();
        assert_eq!(
            (c.score, c.label.as_str()),
            (Standing::new(2, 0.1), "first")
        );
        c.offer(Standing::new(0, 0.8), &b, || "b".into()).unwrap();
        assert_eq!((c.score, c.label.as_str()), (Standing::new(0, 0.8), "b"));
        c.offer(Standing::new(0, 0.8), &a, || unreachable!("a tie kept"))
            .unwrap();
        c.offer(Standing::new(0, 0.9), &a, || {
            unreachable!("a worse one kept")
        })
        .unwrap();
        let kept = bytes(&b);
        assert_eq!(bytes(&c.net), kept);

        // Training goes on with `b`: the checkpoint does not move.
        for v in b.actor_vars() {
            v.set(&(v.as_tensor() + 1.0).unwrap()).unwrap();
        }
        assert_ne!(bytes(&b), kept);
        assert_eq!(bytes(&c.net), kept);

        c.offer(Standing::new(0, 0.5), &a, || "a".into()).unwrap();
        assert_eq!((c.score, c.label.as_str()), (Standing::new(0, 0.5), "a"));
        assert_eq!(bytes(&c.net), bytes(&a));
    }
}
