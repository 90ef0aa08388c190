//! The shared-parameter actor-critic network (candle, CPU) and its export to
//! ONNX.
//!
//! Actor: `obs -> Linear(h) -> ReLU -> Linear(h) -> ReLU -> Linear(A)`, then
//! the action mask is applied as `logits + (mask - 1) * 1e9` (so a masked
//! action gets probability exactly 0 after the softmax, and the exported
//! graph needs no boolean ops). Critic: the same trunk shape with its own
//! weights and one output (the per-agent value); it is used in training
//! only and not exported.
//!
//! Weights are initialised from a seeded ChaCha8 stream (not candle's own
//! RNG) so that training is reproducible bit for bit given the seed.

use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::LearnError;

use crate::formats::policy_file::MASK_PENALTY;

/// One dense layer, candle layout: `weight` is `[out, in]`.
#[derive(Clone, Debug)]
pub struct Dense {
    pub weight: Var,
    pub bias: Var,
}

impl Dense {
    fn new(
        rng: &mut ChaCha8Rng,
        inputs: usize,
        outputs: usize,
        gain: f64,
    ) -> Result<Self, LearnError> {
        // Uniform(-b, b) with b = gain * sqrt(6 / (in + out)) (Glorot).
        let bound = gain * (6.0 / (inputs + outputs) as f64).sqrt();
        let w: Vec<f32> = (0..inputs * outputs)
            .map(|_| rng.random_range(-bound..bound) as f32)
            .collect();
        let weight = Var::from_tensor(&Tensor::from_vec(w, (outputs, inputs), &Device::Cpu)?)?;
        let bias = Var::from_tensor(&Tensor::zeros(outputs, DType::F32, &Device::Cpu)?)?;
        Ok(Dense { weight, bias })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor, LearnError> {
        Ok(x.matmul(&self.weight.as_tensor().t()?)?
            .broadcast_add(self.bias.as_tensor())?)
    }

    /// (weights row-major `[out, in]`, bias, out, in).
    fn export(&self) -> Result<(Vec<f32>, Vec<f32>, usize, usize), LearnError> {
        let (out, inp) = self.weight.as_tensor().dims2()?;
        Ok((
            self.weight.as_tensor().flatten_all()?.to_vec1::<f32>()?,
            self.bias.as_tensor().to_vec1::<f32>()?,
            out,
            inp,
        ))
    }
}

/// A three-layer MLP.
#[derive(Clone, Debug)]
pub struct Mlp {
    pub layers: [Dense; 3],
}

impl Mlp {
    fn new(
        rng: &mut ChaCha8Rng,
        inputs: usize,
        hidden: usize,
        outputs: usize,
        out_gain: f64,
    ) -> Result<Self, LearnError> {
        Ok(Mlp {
            layers: [
                Dense::new(rng, inputs, hidden, 1.0)?,
                Dense::new(rng, hidden, hidden, 1.0)?,
                Dense::new(rng, hidden, outputs, out_gain)?,
            ],
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor, LearnError> {
        let h = self.layers[0].forward(x)?.relu()?;
        let h = self.layers[1].forward(&h)?.relu()?;
        self.layers[2].forward(&h)
    }

    fn vars(&self) -> Vec<Var> {
        self.layers
            .iter()
            .flat_map(|l| [l.weight.clone(), l.bias.clone()])
            .collect()
    }
}

/// GPUs per node for the node-level mean action (the critic's input): the
/// simulator numbers GPUs across the cluster, and nodes of 8 GPUs (DGX/HGX)
/// are what A100/H100 clusters are built of.
pub const NODE_GPUS: usize = 8;

/// The width of the critic's input: the agent's observation, then the mean
/// action of the *other* GPUs of its node and of the cluster (one share per
/// action each), so the value is `V(o_i, ā_node, ā_cluster)`.
pub const fn critic_dim(obs_dim: usize, actions: usize) -> usize {
    obs_dim + 2 * actions
}

/// The actor (policy) and critic (value) networks of one GPU model.
///
/// The actor sees the agent's observation only (it is what runs in the
/// daemon, one row per GPU); the critic is mean-field: it also sees the mean
/// action of the other agents ([`critic_dim`]), as in mean-field
/// actor-critic (Yang et al., 2018). It is used in training only.
#[derive(Clone, Debug)]
pub struct ActorCritic {
    pub obs_dim: usize,
    pub actions: usize,
    pub hidden: usize,
    pub actor: Mlp,
    pub critic: Mlp,
}

impl ActorCritic {
    /// Fresh networks; the actor's last layer starts small so the initial
    /// policy is close to uniform over the allowed actions.
    pub fn new(
        obs_dim: usize,
        actions: usize,
        hidden: usize,
        seed: u64,
    ) -> Result<Self, LearnError> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        Ok(ActorCritic {
            obs_dim,
            actions,
            hidden,
            actor: Mlp::new(&mut rng, obs_dim, hidden, actions, 0.1)?,
            critic: Mlp::new(&mut rng, critic_dim(obs_dim, actions), hidden, 1, 1.0)?,
        })
    }

    /// A copy with its own parameters (candle `Var`s are shared handles, so
    /// `clone` would alias the weights being trained).
    pub fn clone_deep(&self) -> Result<Self, LearnError> {
        let copy = |m: &Mlp| -> Result<Mlp, LearnError> {
            let mut layers = m.layers.clone();
            for l in &mut layers {
                l.weight = Var::from_tensor(&l.weight.as_tensor().copy()?)?;
                l.bias = Var::from_tensor(&l.bias.as_tensor().copy()?)?;
            }
            Ok(Mlp { layers })
        };
        Ok(ActorCritic {
            obs_dim: self.obs_dim,
            actions: self.actions,
            hidden: self.hidden,
            actor: copy(&self.actor)?,
            critic: copy(&self.critic)?,
        })
    }

    pub fn actor_vars(&self) -> Vec<Var> {
        self.actor.vars()
    }

    pub fn critic_vars(&self) -> Vec<Var> {
        self.critic.vars()
    }

    /// Masked logits `[n, A]` for observations `[n, D]` and masks `[n, A]`.
    pub fn masked_logits(&self, obs: &Tensor, mask: &Tensor) -> Result<Tensor, LearnError> {
        let logits = self.actor.forward(obs)?;
        let penalty = mask.affine(f64::from(MASK_PENALTY), -f64::from(MASK_PENALTY))?;
        Ok((logits + penalty)?)
    }

    /// Values `[n]` for critic inputs `[n, critic_dim]` (observation and mean actions).
    pub fn values(&self, critic_in: &Tensor) -> Result<Tensor, LearnError> {
        Ok(self.critic.forward(critic_in)?.squeeze(1)?)
    }

    /// (masked logits, probabilities) for row-major slices: the reference the
    /// ONNX export is checked against, and the trainer's acting path.
    pub fn act(
        &self,
        obs: &[f32],
        mask: &[f32],
        rows: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), LearnError> {
        let o = Tensor::from_slice(obs, (rows, self.obs_dim), &Device::Cpu)?;
        let m = Tensor::from_slice(mask, (rows, self.actions), &Device::Cpu)?;
        let logits = self.masked_logits(&o, &m)?;
        let probs = candle_nn::ops::softmax_last_dim(&logits)?;
        Ok((
            logits.flatten_all()?.to_vec1::<f32>()?,
            probs.flatten_all()?.to_vec1::<f32>()?,
        ))
    }

    /// The actor as an ONNX model (opset 17): inputs `obs [n, D]` and
    /// `mask [n, A]` (float, 1 = allowed), outputs `logits [n, A]` (masked)
    /// and `probs [n, A]`. `metadata` goes into the model's
    /// `metadata_props` (key, value).
    pub fn export_onnx(&self, metadata: &[(&str, &str)]) -> Result<Vec<u8>, LearnError> {
        let layers = self
            .actor
            .layers
            .iter()
            .map(Dense::export)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(super::export::mlp_policy_onnx(&layers, metadata))
    }
}
