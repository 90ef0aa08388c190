//! The parameter updates: behaviour cloning of the teacher
//! ([`imitation_update`]) and PPO's clipped surrogate with value loss,
//! entropy bonus and an optional KL early stop ([`ppo_update`]), both with
//! AdamW over seeded minibatches.

use candle_core::{Device, Tensor, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::config::PpoConfig;
use super::model::{critic_dim, ActorCritic};
use super::rollout::{critic_inputs, Batch};
use super::LearnError;

/// The rows `idx` of `batch` as tensors: observations `[n, d]`, critic
/// inputs `[n, critic_dim]`, masks `[n, a]`, actions `[n, 1]`, and
/// log-probabilities, advantages and returns `[n]`.
fn tensors(batch: &Batch, idx: &[usize], d: usize, a: usize) -> Result<Tensors, LearnError> {
    let n = idx.len();
    let mut obs = Vec::with_capacity(n * d);
    let mut mean_actions = Vec::with_capacity(n * 2 * a);
    let mut mask = Vec::with_capacity(n * a);
    let mut act = Vec::with_capacity(n);
    let mut logp = Vec::with_capacity(n);
    let mut adv = Vec::with_capacity(n);
    let mut ret = Vec::with_capacity(n);
    for &i in idx {
        obs.extend_from_slice(&batch.obs[i * d..(i + 1) * d]);
        mean_actions.extend_from_slice(&batch.mean_actions[i * 2 * a..(i + 1) * 2 * a]);
        mask.extend_from_slice(&batch.mask[i * a..(i + 1) * a]);
        act.push(batch.actions[i]);
        logp.push(batch.logp[i]);
        adv.push(batch.advantages[i]);
        ret.push(batch.returns[i]);
    }
    let critic_in = critic_inputs(&obs, &mean_actions, d, a);
    let dev = &Device::Cpu;
    Ok(Tensors {
        obs: Tensor::from_vec(obs, (n, d), dev)?,
        critic_in: Tensor::from_vec(critic_in, (n, critic_dim(d, a)), dev)?,
        mask: Tensor::from_vec(mask, (n, a), dev)?,
        actions: Tensor::from_vec(act, (n, 1), dev)?,
        logp: Tensor::from_vec(logp, n, dev)?,
        advantages: Tensor::from_vec(adv, n, dev)?,
        returns: Tensor::from_vec(ret, n, dev)?,
    })
}

/// One minibatch as tensors.
struct Tensors {
    obs: Tensor,
    critic_in: Tensor,
    mask: Tensor,
    actions: Tensor,
    logp: Tensor,
    advantages: Tensor,
    returns: Tensor,
}

/// A seeded random permutation of `0..n` (Fisher-Yates).
fn shuffled(n: usize, rng: &mut ChaCha8Rng) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.random_range(0..=i);
        idx.swap(i, j);
    }
    idx
}

/// AdamW over the actor and the critic, without weight decay: the
/// optimiser of every training phase.
pub fn optimiser(net: &ActorCritic, lr: f64) -> Result<AdamW, LearnError> {
    let mut vars = net.actor_vars();
    vars.extend(net.critic_vars());
    Ok(AdamW::new(
        vars,
        ParamsAdamW {
            lr,
            weight_decay: 0.0,
            ..ParamsAdamW::default()
        },
    )?)
}

/// Behaviour cloning (actor) and value regression (critic) on a teacher batch.
pub fn imitation_update(
    net: &ActorCritic,
    opt: &mut AdamW,
    batch: &Batch,
    epochs: usize,
    minibatch: usize,
    rng: &mut ChaCha8Rng,
) -> Result<f32, LearnError> {
    let (d, a) = (net.obs_dim, net.actions);
    let mut last = 0.0;
    for _ in 0..epochs {
        let idx = shuffled(batch.len(), rng);
        for chunk in idx.chunks(minibatch) {
            let t = tensors(batch, chunk, d, a)?;
            let logits = net.masked_logits(&t.obs, &t.mask)?;
            let logp = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
            let ce = logp.gather(&t.actions, 1)?.squeeze(1)?.mean_all()?.neg()?;
            let v = net.values(&t.critic_in)?;
            let vloss = (v - t.returns)?.sqr()?.mean_all()?;
            let loss = (ce.clone() + (vloss * 0.5)?)?;
            opt.backward_step(&loss)?;
            last = ce.to_scalar::<f32>()?;
        }
    }
    Ok(last)
}

/// PPO epochs over `batch` (advantages normalised per batch).
pub fn ppo_update(
    net: &ActorCritic,
    opt: &mut AdamW,
    batch: &mut Batch,
    p: &PpoConfig,
    rng: &mut ChaCha8Rng,
) -> Result<(), LearnError> {
    let (d, a) = (net.obs_dim, net.actions);
    normalise(&mut batch.advantages);
    for _ in 0..p.epochs {
        let idx = shuffled(batch.len(), rng);
        for chunk in idx.chunks(p.minibatch) {
            let t = tensors(batch, chunk, d, a)?;
            let adv = &t.advantages;
            let logits = net.masked_logits(&t.obs, &t.mask)?;
            let logp_all = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
            let logp = logp_all.gather(&t.actions, 1)?.squeeze(1)?;
            let log_ratio = (logp - &t.logp)?;
            if p.target_kl > 0.0 {
                // k3 estimator of KL(old || new): E[(r - 1) - ln r].
                let kl = ((log_ratio.exp()? - 1.0)? - &log_ratio)?
                    .mean_all()?
                    .to_scalar::<f32>()?;
                if f64::from(kl) > p.target_kl {
                    return Ok(());
                }
            }
            let ratio = log_ratio.exp()?;
            let s1 = (&ratio * adv)?;
            let s2 = (ratio.clamp(1.0 - p.clip, 1.0 + p.clip)? * adv)?;
            let pi_loss = s1.minimum(&s2)?.mean_all()?.neg()?;
            let probs = logp_all.exp()?;
            // Masked actions have probability 0 and log-probability -1e9:
            // their product is 0, so they add nothing to the entropy.
            let entropy = (probs * logp_all)?.sum(D::Minus1)?.mean_all()?.neg()?;
            let v = net.values(&t.critic_in)?;
            let vloss = (v - &t.returns)?.sqr()?.mean_all()?;
            let loss = ((pi_loss + (vloss * p.value_coef)?)? - (entropy * p.entropy)?)?;
            opt.backward_step(&loss)?;
        }
    }
    Ok(())
}

/// Shifts and scales `x` to mean 0 and standard deviation 1 (a constant
/// `x` becomes all zeros).
fn normalise(x: &mut [f32]) {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / n;
    let std = var.sqrt().max(1e-8);
    for x in x.iter_mut() {
        *x = (*x - mean) / std;
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::super::testing::{net, tiny};
    use super::*;

    fn optimiser(net: &ActorCritic, lr: f64) -> AdamW {
        super::optimiser(net, lr).unwrap()
    }

    /// `n` random observations (every action allowed but the last) with
    /// actions `action(i)` and the network's own log-probabilities.
    fn batch(net: &ActorCritic, n: usize, action: impl Fn(usize) -> u32) -> Batch {
        let mut rng = ChaCha8Rng::seed_from_u64(n as u64);
        let obs: Vec<f32> = (0..n * net.obs_dim).map(|_| rng.random::<f32>()).collect();
        let mut mask = vec![1.0f32; n * net.actions];
        for r in 0..n {
            mask[(r + 1) * net.actions - 1] = 0.0;
        }
        let actions: Vec<u32> = (0..n).map(action).collect();
        let (_, probs) = net.act(&obs, &mask, n).unwrap();
        let logp = (0..n)
            .map(|i| probs[i * net.actions + actions[i] as usize].ln())
            .collect();
        let mean_actions = (0..n * 2 * net.actions)
            .map(|_| rng.random::<f32>())
            .collect();
        Batch {
            obs,
            mean_actions,
            mask,
            actions,
            logp,
            advantages: vec![0.0; n],
            returns: vec![0.0; n],
        }
    }

    /// Mean probability of each row's action.
    fn probability(net: &ActorCritic, b: &Batch) -> f32 {
        let (_, probs) = net.act(&b.obs, &b.mask, b.len()).unwrap();
        let p: f32 = (0..b.len())
            .map(|i| probs[i * net.actions + b.actions[i] as usize])
            .sum();
        p / b.len() as f32
    }

    fn actor(net: &ActorCritic) -> Vec<f32> {
        net.actor_vars()
            .iter()
            .flat_map(|v| {
                v.as_tensor()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn shuffled_is_a_seeded_permutation() {
        let draw = |seed| shuffled(100, &mut ChaCha8Rng::seed_from_u64(seed));
        let a = draw(3);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        assert_ne!(a, sorted, "shuffled");
        assert_eq!(a, draw(3));
        assert_ne!(a, draw(4));
        assert!(draw(1).len() == 100 && shuffled(0, &mut ChaCha8Rng::seed_from_u64(0)).is_empty());
    }

    #[test]
    fn normalise_gives_mean_zero_and_unit_deviation() {
        let mut x = [1.0f32, 2.0, 3.0, 6.0];
        normalise(&mut x);
        let mean: f32 = x.iter().sum::<f32>() / 4.0;
        let var: f32 = x.iter().map(|v| v * v).sum::<f32>() / 4.0;
        assert!(mean.abs() < 1e-6 && (var - 1.0).abs() < 1e-5, "{x:?}");
        assert!(x[0] < x[1] && x[2] < x[3]);
        let mut same = [5.0f32; 3];
        normalise(&mut same);
        assert_eq!(same, [0.0; 3]);
    }

    /// `tensors` picks the rows asked for, in that order.
    #[test]
    fn tensors_pick_the_rows() {
        let cfg = tiny();
        let n = net(&cfg, 1);
        let mut b = batch(&n, 3, |i| i as u32);
        b.advantages = vec![0.5, 1.5, 2.5];
        let t = tensors(&b, &[2, 0], n.obs_dim, n.actions).unwrap();
        let c = critic_dim(n.obs_dim, n.actions);
        assert_eq!(t.obs.dims(), [2, n.obs_dim]);
        assert_eq!(t.critic_in.dims(), [2, c]);
        assert_eq!(t.mask.dims(), [2, n.actions]);
        assert_eq!(
            t.actions.flatten_all().unwrap().to_vec1::<u32>().unwrap(),
            [2, 0]
        );
        assert_eq!(t.advantages.to_vec1::<f32>().unwrap(), [2.5, 0.5]);
        assert_eq!(t.logp.to_vec1::<f32>().unwrap(), [b.logp[2], b.logp[0]]);
        assert_eq!(t.returns.dims(), [2]);
        let row = t.obs.get(1).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(row, b.obs[..n.obs_dim]);
        // The critic's row: the observation, then the mean actions.
        let row = t.critic_in.get(0).unwrap().to_vec1::<f32>().unwrap();
        let m = 2 * n.actions;
        assert_eq!(row[..n.obs_dim], b.obs[2 * n.obs_dim..3 * n.obs_dim]);
        assert_eq!(row[n.obs_dim..], b.mean_actions[2 * m..3 * m]);
    }

    /// Behaviour cloning makes the labelled actions much more likely.
    #[test]
    fn imitation_fits_the_labels() {
        let cfg = tiny();
        let n = net(&cfg, 1);
        let b = batch(&n, 32, |i| (i % 3) as u32);
        let before = probability(&n, &b);
        let mut opt = optimiser(&n, 1e-2);
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let ce = imitation_update(&n, &mut opt, &b, 30, 8, &mut rng).unwrap();
        let after = probability(&n, &b);
        assert!(after > 2.0 * before, "{before} -> {after}");
        assert!(ce.is_finite() && ce < -before.ln(), "{ce}");
    }

    /// With equal advantages (normalised to zero) and no value or entropy
    /// term there is no gradient: AdamW leaves the actor exactly as it was.
    #[test]
    fn ppo_without_advantage_changes_nothing() {
        let cfg = tiny();
        let n = net(&cfg, 1);
        let mut b = batch(&n, 16, |_| 0);
        b.advantages = vec![3.0; 16];
        let p = PpoConfig {
            epochs: 3,
            minibatch: 8,
            lr: 1e-2,
            entropy: 0.0,
            value_coef: 0.0,
            ..PpoConfig::default()
        };
        let before = actor(&n);
        let mut opt = optimiser(&n, p.lr);
        ppo_update(&n, &mut opt, &mut b, &p, &mut ChaCha8Rng::seed_from_u64(0)).unwrap();
        assert_eq!(b.advantages, vec![0.0; 16]);
        assert_eq!(actor(&n), before);
    }

    /// Positive advantages make their actions more likely, negative ones
    /// less; an update whose rollout policy is already too far away (KL
    /// above `target_kl`) stops before its first step.
    #[test]
    fn ppo_follows_the_advantages_and_stops_on_kl() {
        let cfg = tiny();
        let p = PpoConfig {
            epochs: 4,
            minibatch: 16,
            lr: 1e-2,
            entropy: 0.0,
            ..PpoConfig::default()
        };
        let n = net(&cfg, 1);
        let mut b = batch(&n, 16, |i| (i % 2) as u32);
        b.advantages = (0..16)
            .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        let advantages = b.advantages.clone();
        let (zero, one) = (batch(&n, 16, |_| 0), batch(&n, 16, |_| 1));
        let before = (probability(&n, &zero), probability(&n, &one));
        let mut opt = optimiser(&n, p.lr);
        ppo_update(&n, &mut opt, &mut b, &p, &mut ChaCha8Rng::seed_from_u64(0)).unwrap();
        let after = (probability(&n, &zero), probability(&n, &one));
        assert!(
            after.0 > before.0 && after.1 < before.1,
            "{before:?} -> {after:?}"
        );

        let m = net(&cfg, 2);
        let mut stale = batch(&m, 16, |i| (i % 2) as u32);
        stale.advantages = advantages;
        for l in &mut stale.logp {
            *l -= 1.0;
        }
        let before = actor(&m);
        let kl = PpoConfig {
            target_kl: 0.01,
            ..p
        };
        let mut opt = optimiser(&m, kl.lr);
        ppo_update(
            &m,
            &mut opt,
            &mut stale,
            &kl,
            &mut ChaCha8Rng::seed_from_u64(0),
        )
        .unwrap();
        assert_eq!(actor(&m), before);
    }
}
