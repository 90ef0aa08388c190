//! Evolution-strategies fine-tuning of the actor: optimises the number the
//! policy is judged by (mean ET of the *deterministic* policy over training
//! days) directly, without a critic or sampled actions.
//!
//! Why: PPO trains the sampled policy on per-agent credit from a team
//! reward; on this problem its updates made the deterministic policy worse
//! on validation days (docs/policy.md). ES (Salimans et al. 2017) instead
//! perturbs all actor weights with Gaussian noise `theta +- sigma eps`
//! (antithetic pairs), scores each perturbation on the same training days
//! (common random numbers) and steps along the rank-weighted noise. It is
//! deterministic given the seed; the pairs are scored on two threads.

use candle_core::{Device, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

pub use super::config::EsConfig;
use super::config::TrainConfig;
use super::data::Day;
use super::model::ActorCritic;
use super::rollout::CandlePolicy;
use super::LearnError;
use crate::sim::Standing;

/// The actor's parameters as one flat vector, and back.
fn get(net: &ActorCritic) -> Result<Vec<f32>, LearnError> {
    let mut out = Vec::new();
    for v in net.actor_vars() {
        out.extend(v.as_tensor().flatten_all()?.to_vec1::<f32>()?);
    }
    Ok(out)
}

fn set(net: &ActorCritic, theta: &[f32]) -> Result<(), LearnError> {
    let mut at = 0;
    for v in net.actor_vars() {
        let shape = v.as_tensor().shape().clone();
        let n = shape.elem_count();
        let t = Tensor::from_slice(&theta[at..at + n], shape, &Device::Cpu)?;
        v.set(&t)?;
        at += n;
    }
    Ok(())
}

/// The standing (jobs left unserved, then mean ET; `sim::Standing`) of the
/// deterministic policy of `net` over `days`.
pub fn score(cfg: &TrainConfig, net: &ActorCritic, days: &[Day]) -> Result<Standing, LearnError> {
    let mut each = Vec::with_capacity(days.len());
    for day in days {
        let mut p = CandlePolicy::new(net, cfg.gpu_model).starting_from(day.initial_layouts(cfg));
        each.push(day.objective(cfg, &mut p)?);
    }
    Ok(Standing::over(each))
}

/// One ES iteration on `days`; updates `net`'s actor in place and returns
/// the mean ET of the candidates.
pub fn step(
    cfg: &TrainConfig,
    es: &EsConfig,
    net: &ActorCritic,
    days: &[Day],
    seed: u64,
) -> Result<f64, LearnError> {
    let theta = get(net)?;
    let n = theta.len();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let noise: Vec<Vec<f32>> = (0..es.pairs)
        .map(|_| {
            (0..n)
                .map(|_| StandardNormal.sample(&mut rng))
                .collect::<Vec<f32>>()
        })
        .collect();
    let sigma = es.sigma as f32;
    // Scores of theta + sigma eps_i and theta - sigma eps_i, on two threads
    // (each with its own copy of the network).
    let eval = |pairs: &[usize]| -> Result<Vec<(usize, Standing, Standing)>, LearnError> {
        let scratch = net.clone_deep()?;
        let mut out = Vec::new();
        for &i in pairs {
            let mut r = [Standing::WORST; 2];
            for (s, sign) in [1.0f32, -1.0].into_iter().enumerate() {
                let t: Vec<f32> = theta
                    .iter()
                    .zip(&noise[i])
                    .map(|(&w, &e)| w + sign * sigma * e)
                    .collect();
                set(&scratch, &t)?;
                r[s] = score(cfg, &scratch, days)?;
            }
            out.push((i, r[0], r[1]));
        }
        Ok(out)
    };
    let all: Vec<usize> = (0..es.pairs).collect();
    let (a, b) = all.split_at(es.pairs / 2);
    let results = std::thread::scope(|s| {
        let h = s.spawn(|| eval(a));
        let rb = eval(b);
        let ra = h
            .join()
            .map_err(|_| LearnError::Other("an ES worker panicked".into()))?;
        Ok::<_, LearnError>((ra?, rb?))
    })?;
    let mut scores: Vec<(usize, Standing, Standing)> = results.0;
    scores.extend(results.1);
    // Centered ranks over all 2P candidates (lower standing = higher
    // utility). Equal scores share their mean rank: a small perturbation
    // often leaves every argmax decision unchanged, and ties broken by
    // position would push the weights along pure noise.
    let mut flat: Vec<(Standing, usize, bool)> = scores
        .iter()
        .flat_map(|&(i, p, m)| [(p, i, true), (m, i, false)])
        .collect();
    flat.sort_by_key(|y| std::cmp::Reverse(y.0));
    let count = flat.len();
    let mut util = vec![[0.0f32; 2]; es.pairs];
    let mut start = 0;
    while start < count {
        let mut end = start + 1;
        while end < count && flat[end].0 == flat[start].0 {
            end += 1;
        }
        let rank = (start + end - 1) as f32 / 2.0;
        let u = rank / (count - 1).max(1) as f32 - 0.5;
        for &(_, i, plus) in &flat[start..end] {
            util[i][usize::from(!plus)] = u;
        }
        start = end;
    }
    let scale = (es.lr / (2.0 * es.pairs as f64 * es.sigma)) as f32;
    let mut next = theta.clone();
    for (i, eps) in noise.iter().enumerate() {
        let w = (util[i][0] - util[i][1]) * scale;
        for (t, &e) in next.iter_mut().zip(eps) {
            *t += w * e;
        }
    }
    set(net, &next)?;
    let mean = scores.iter().map(|&(_, p, m)| p.et + m.et).sum::<f64>() / (2 * es.pairs) as f64;
    Ok(mean)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{day, net, tiny};
    use super::*;

    /// Flattening round-trips, a step moves the weights, and a step is
    /// deterministic given its seed.
    #[test]
    fn step_moves_the_weights_deterministically() {
        let cfg = tiny();
        let days = vec![day(&cfg, 1), day(&cfg, 2)];
        let es = EsConfig {
            iterations: 1,
            pairs: 3,
            sigma: 0.5,
            lr: 0.5,
            days: 2,
        };
        let a = net(&cfg, 3);
        let b = net(&cfg, 3);
        let before = get(&a).unwrap();
        set(&a, &before).unwrap();
        assert_eq!(get(&a).unwrap(), before);
        let sa = step(&cfg, &es, &a, &days, 9).unwrap();
        let sb = step(&cfg, &es, &b, &days, 9).unwrap();
        assert_eq!(sa, sb);
        assert_eq!(get(&a).unwrap(), get(&b).unwrap());
        assert!(sa.is_finite() && sa > 0.0);
        // Every candidate may tie (then the step is zero); with sigma 0.5
        // on 3 GPUs some decision changes, and so do the weights.
        assert_ne!(get(&a).unwrap(), before);
        let s = score(&cfg, &a, &days).unwrap();
        assert!(s.et.is_finite());
    }
}
