//! Rollouts: the simulator as the environment of the learning policy.
//! `Rollout` acts at each decision epoch (the teacher's actions, sampled
//! ones or the most probable one) and records the agents' steps, and the
//! reward ledger turns the event log into per-epoch rewards;
//! [`run_episode`] turns one simulated day into a [`Batch`] of transitions
//! with GAE advantages. [`CandlePolicy`] is the deterministic policy of a
//! network, the one validation and ES score.

use std::cell::RefCell;
use std::rc::Rc;

use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::config::TrainConfig;
pub use super::data::initial_layout;
use super::data::Day;
use super::model::{critic_dim, ActorCritic, NODE_GPUS};
use super::planner::Planner;
use super::reward::{Ledger, LedgerSink};
use super::teacher::{Base, Teacher};
use super::LearnError;
use crate::mig::{Geometry, GpuModel, Layout};
use crate::policy::features::{argmax_masked, Encoder, FeatureSpec};
use crate::policy::{ClusterView, Decision, RepartitionPolicy};
use crate::sim::{common_horizon, simulate, Metrics, Reference, RunHooks};

/// How the rollout policy acts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// The teacher acts; its actions are the labels.
    Teacher,
    /// Actions sampled from the network (PPO).
    Sample,
    /// Most probable action (evaluation).
    Greedy,
    /// Closed-loop imitation of the planning teacher (`learn::dagger`):
    /// the labels are the teacher's target layouts at the states visited;
    /// at each epoch the teacher acts with probability `beta`, the
    /// network's most probable action otherwise.
    Dagger { beta: f64 },
}

/// One agent step.
#[derive(Clone, Debug)]
struct Step {
    gpu: usize,
    epoch: usize,
    action: u32,
    logp: f32,
    value: f32,
}

/// The policy object driven by the simulator during training: it acts
/// (teacher, sampled or greedy) and records each agent step and the energy
/// and tardiness of each epoch.
struct Rollout<'m> {
    net: &'m ActorCritic,
    encoder: Encoder,
    teacher: Teacher,
    /// The planning teacher of [`Mode::Dagger`].
    planner: Option<Planner>,
    /// The layout each GPU starts from ([`Day::initial_layouts`]).
    initial: Vec<Layout>,
    mode: Mode,
    rng: ChaCha8Rng,
    ledger: Rc<RefCell<Ledger>>,
    obs: Vec<f32>,
    /// [`mean_actions`] of each step, `2 * A` per step.
    mean_actions: Vec<f32>,
    mask: Vec<f32>,
    steps: Vec<Step>,
    /// Per epoch: team energy, team tardiness, per-GPU energy, per-GPU tardiness.
    epoch_e: Vec<Vec<f64>>,
    epoch_t: Vec<Vec<f64>>,
    error: Option<LearnError>,
}

impl RepartitionPolicy for Rollout<'_> {
    fn name(&self) -> String {
        "learning".into()
    }

    fn initial_layout(&mut self, gpu: usize, geometry: &'static Geometry) -> Layout {
        crate::policy::layout_or_whole(&self.initial, gpu, geometry)
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        let (e, t) = self.ledger.borrow_mut().advance(view.now);
        self.epoch_e.push(e);
        self.epoch_t.push(t);
        let epoch = self.epoch_e.len() - 1;
        self.encoder.encode(view);
        let spec = *self.encoder.spec();
        let rows = self.encoder.gpus.len();
        let acting: Vec<usize> = (0..rows).filter(|&r| self.encoder.choices(r) > 1).collect();
        if acting.is_empty() {
            return Vec::new();
        }
        let (d, a) = (spec.obs_dim, spec.actions);
        let mut obs = Vec::with_capacity(acting.len() * d);
        let mut mask = Vec::with_capacity(acting.len() * a);
        for &r in &acting {
            obs.extend_from_slice(&self.encoder.obs[r * d..(r + 1) * d]);
            mask.extend_from_slice(&self.encoder.mask[r * a..(r + 1) * a]);
        }
        let teacher_actions = (self.mode == Mode::Teacher).then(|| self.teacher.choose(view));
        // The planner plans from every state it is shown (what it would do
        // here), whoever acts; its target is the label.
        let planned: Option<Vec<usize>> = self.planner.as_mut().map(|p| {
            p.decide(view);
            let g = spec.geometry;
            p.target()
                .iter()
                .map(|&l| g.catalog_index(l).unwrap_or(spec.keep_action()))
                .collect()
        });
        let dagger_follows = match self.mode {
            Mode::Dagger { beta } => self.rng.random::<f64>() < beta,
            _ => false,
        };
        let probs = match self.net.act(&obs, &mask, acting.len()) {
            Ok((_, p)) => p,
            Err(e) => {
                self.error.get_or_insert(e);
                return Vec::new();
            }
        };
        let mut chosen = Vec::with_capacity(acting.len());
        let mut labels = Vec::with_capacity(acting.len());
        for (i, &r) in acting.iter().enumerate() {
            let gpu = self.encoder.gpus[r];
            let p = &probs[i * a..(i + 1) * a];
            let m = &mask[i * a..(i + 1) * a];
            let label = planned
                .as_ref()
                .and_then(|t| t.get(r).copied())
                .filter(|&act| m[act] > 0.5);
            labels.push(label);
            chosen.push(match self.mode {
                Mode::Dagger { .. } => match label {
                    Some(act) if dagger_follows => act,
                    _ => argmax_masked(p, m),
                },
                Mode::Greedy => argmax_masked(p, m),
                Mode::Sample => sample(&mut self.rng, p, m),
                Mode::Teacher => teacher_actions
                    .as_ref()
                    .and_then(|t| t.iter().find(|(g, _)| *g == gpu))
                    .and_then(|&(_, act)| act)
                    .filter(|&act| m[act] > 0.5)
                    .unwrap_or(spec.keep_action()),
            });
        }
        let Some(values) = self.critic_values(&obs, &acting, &chosen, rows) else {
            return Vec::new();
        };
        let mut decisions = Vec::new();
        for (i, &r) in acting.iter().enumerate() {
            let gpu = self.encoder.gpus[r];
            let action = chosen[i];
            let p = &probs[i * a..(i + 1) * a];
            self.obs.extend_from_slice(&obs[i * d..(i + 1) * d]);
            self.mask.extend_from_slice(&mask[i * a..(i + 1) * a]);
            // DAgger records the teacher's label, every other mode the
            // action taken.
            let recorded = labels[i].unwrap_or(action);
            self.steps.push(Step {
                gpu,
                epoch,
                action: recorded as u32,
                logp: p[recorded].max(1e-30).ln(),
                value: values[i],
            });
            if let Some(dec) = spec.decode(gpu, &view.gpus[gpu], action) {
                decisions.push(dec);
            }
        }
        decisions
    }
}

impl Rollout<'_> {
    /// The critic's values of the acting rows (`chosen`: their actions),
    /// each seeing its observation with the mean action of the others
    /// (GPUs that cannot act "keep"); `None` after an error (kept in
    /// `self.error`).
    fn critic_values(
        &mut self,
        obs: &[f32],
        acting: &[usize],
        chosen: &[usize],
        rows: usize,
    ) -> Option<Vec<f32>> {
        let spec = *self.encoder.spec();
        let (d, a) = (spec.obs_dim, spec.actions);
        // The mean-field critic's input: each agent's observation with the
        // mean action of the others (GPUs that cannot act "keep").
        let mut actions = vec![spec.keep_action(); rows];
        for (&r, &act) in acting.iter().zip(chosen) {
            actions[r] = act;
        }
        let mf = mean_actions(a, acting, &actions, &self.encoder.gpus);
        let critic_in = critic_inputs(obs, &mf, d, a);
        let values =
            match Tensor::from_slice(&critic_in, (acting.len(), critic_dim(d, a)), &Device::Cpu)
                .map_err(LearnError::from)
                .and_then(|t| Ok(self.net.values(&t)?.to_vec1::<f32>()?))
            {
                Ok(v) => v,
                Err(e) => {
                    self.error.get_or_insert(e);
                    return None;
                }
            };
        self.mean_actions.extend_from_slice(&mf);
        Some(values)
    }
}

/// The mean-field part of the critic's input for the `acting` rows: the
/// mean one-hot action of the *other* GPUs of the row's node
/// ([`NODE_GPUS`], by GPU number), then of all GPUs of the model (`2 * a`
/// per row; `actions[r]` for every encoded row `r`, whose GPU is `gpus[r]`).
/// A GPU alone in its node or cluster sees zeros there.
pub(crate) fn mean_actions(
    a: usize,
    acting: &[usize],
    actions: &[usize],
    gpus: &[usize],
) -> Vec<f32> {
    let node_of = |r: usize| gpus[r] / NODE_GPUS;
    let node_count = gpus.iter().max().map_or(0, |g| g / NODE_GPUS + 1);
    let mut cluster = vec![0.0f32; a];
    let mut nodes = vec![(vec![0.0f32; a], 0.0f32); node_count];
    for (r, &act) in actions.iter().enumerate() {
        cluster[act] += 1.0;
        let node = &mut nodes[node_of(r)];
        node.0[act] += 1.0;
        node.1 += 1.0;
    }
    let n = actions.len() as f32;
    let mut out = Vec::with_capacity(acting.len() * 2 * a);
    for &r in acting {
        let own = actions[r];
        let (node, count) = &nodes[node_of(r)];
        for (sums, others) in [(node, count - 1.0), (&cluster, n - 1.0)] {
            out.extend((0..a).map(|k| {
                let s = sums[k] - if k == own { 1.0 } else { 0.0 };
                if others > 0.0 {
                    s / others
                } else {
                    0.0
                }
            }));
        }
    }
    out
}

/// The critic's input rows: each observation row (`d` wide) followed by its
/// row of [`mean_actions`] (`2 * a` wide).
pub(crate) fn critic_inputs(obs: &[f32], mean_actions: &[f32], d: usize, a: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(obs.len() + mean_actions.len());
    for (o, m) in obs.chunks_exact(d).zip(mean_actions.chunks_exact(2 * a)) {
        out.extend_from_slice(o);
        out.extend_from_slice(m);
    }
    out
}

pub(crate) fn sample(rng: &mut ChaCha8Rng, probs: &[f32], mask: &[f32]) -> usize {
    let total: f32 = probs
        .iter()
        .zip(mask)
        .filter(|(_, &m)| m > 0.5)
        .map(|(p, _)| p)
        .sum();
    let mut x = rng.random::<f32>() * total;
    let mut last = probs.len() - 1;
    for (a, (&p, &m)) in probs.iter().zip(mask).enumerate() {
        if m > 0.5 {
            last = a;
            if x < p {
                return a;
            }
            x -= p;
        }
    }
    last
}

/// The transitions of one or more episodes, ready for an update.
#[derive(Default, Debug)]
pub struct Batch {
    pub obs: Vec<f32>,
    /// The mean-field part of the critic's input ([`mean_actions`]), one
    /// row of `2 * A` per transition (the rest is `obs`).
    pub mean_actions: Vec<f32>,
    pub mask: Vec<f32>,
    pub actions: Vec<u32>,
    pub logp: Vec<f32>,
    pub advantages: Vec<f32>,
    pub returns: Vec<f32>,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.actions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }
}

/// What one episode gave.
#[derive(Clone, Debug)]
pub struct Episode {
    /// The run, charged with the day's `none` run at their common horizon.
    pub metrics: Metrics,
    pub et: f64,
    /// Sum of team rewards (= -ET when every job ran).
    pub team_return: f64,
}

/// Runs one episode with `net` in `mode`, appending its transitions to
/// `batch` (advantages and returns computed with `ppo`'s gamma and lambda).
pub fn run_episode(
    cfg: &TrainConfig,
    net: &ActorCritic,
    day: &Day,
    mode: Mode,
    base: &Base,
    rng_seed: u64,
    batch: &mut Batch,
) -> Result<Episode, LearnError> {
    let sim_cfg = day.sim_config(cfg);
    let ledger = Rc::new(RefCell::new(Ledger::new(&day.cluster, &sim_cfg)));
    let planner = matches!(mode, Mode::Dagger { .. })
        .then(|| planner_for(cfg, day))
        .transpose()?;
    let mut rollout = Rollout {
        net,
        encoder: Encoder::new(cfg.gpu_model),
        teacher: Teacher::new(cfg.gpu_model, base.clone()),
        planner,
        initial: day.initial_layouts(cfg),
        mode,
        rng: ChaCha8Rng::seed_from_u64(rng_seed),
        ledger: Rc::clone(&ledger),
        obs: Vec::new(),
        mean_actions: Vec::new(),
        mask: Vec::new(),
        steps: Vec::new(),
        epoch_e: Vec::new(),
        epoch_t: Vec::new(),
        error: None,
    };
    let mut sink = LedgerSink(Rc::clone(&ledger));
    let mut h = cfg.heuristic()?.build(day.seed);
    let result = simulate(
        &day.cluster,
        &day.jobs,
        h.as_mut(),
        &mut rollout,
        &sim_cfg,
        RunHooks {
            sink: Some(&mut sink),
            progress: None,
        },
    )?;
    if let Some(e) = rollout.error.take() {
        return Err(e);
    }
    // The yardstick's books close the episode: the run charged with
    // `none` at their common horizon (GPUs idle until then, the jobs that
    // never ran charged from there; `sim::metrics`).
    let m = result.metrics;
    let m = m.at_horizon(common_horizon([&m, &day.reference]));
    rollout.close(&m);
    let et = day.rate.et_of(&m, 1.0);
    let rewards = Rewards::new(
        &rollout.epoch_e,
        &rollout.epoch_t,
        day.cluster.len(),
        &day.rate,
        day.jobs.len(),
        cfg.local_weight,
    );
    let (adv, ret) = advantages(
        &rollout.steps,
        day.cluster.len(),
        rollout.epoch_e.len(),
        |k, g| rewards.agent(k, g),
        cfg.ppo.gamma,
        cfg.ppo.gae_lambda,
    );
    let team_return = rewards.team_return();
    batch.obs.extend_from_slice(&rollout.obs);
    batch.mean_actions.extend_from_slice(&rollout.mean_actions);
    batch.mask.extend_from_slice(&rollout.mask);
    for (i, s) in rollout.steps.iter().enumerate() {
        batch.actions.push(s.action);
        batch.logp.push(s.logp);
        batch.advantages.push(adv[i]);
        batch.returns.push(ret[i]);
    }
    debug_assert_eq!(batch.obs.len(), batch.actions.len() * net.obs_dim);
    debug_assert_eq!(batch.mask.len(), batch.actions.len() * net.actions);
    Ok(Episode {
        metrics: m,
        et,
        team_return,
    })
}

impl Rollout<'_> {
    /// Closes the episode's books: what accrued after the last epoch (up to
    /// the horizon) is added to the last epoch, with the gap to the
    /// simulator's totals and the charge for jobs that never ran, so the
    /// rewards add up to the run's energy and tardiness.
    fn close(&mut self, m: &Metrics) {
        let epochs = self.epoch_e.len();
        if epochs == 0 {
            return;
        }
        let (tail_e, tail_t) = self.ledger.borrow_mut().advance(m.horizon_s);
        let e_sum: f64 = self.epoch_e.iter().flatten().sum::<f64>() + tail_e.iter().sum::<f64>();
        let t_sum: f64 = self.epoch_t.iter().flatten().sum::<f64>() + tail_t.iter().sum::<f64>();
        let last = epochs - 1;
        for (g, (&e, &t)) in tail_e.iter().zip(&tail_t).enumerate() {
            self.epoch_e[last][g] += e;
            self.epoch_t[last][g] += t;
        }
        // Tiny gaps (energy of jobs still running at the end, counted in the
        // ledger by construction) are reconciled onto the last epoch so the
        // return matches the simulator's totals.
        let de = m.energy_j - e_sum;
        let dt = m.total_tardiness_s - t_sum;
        self.epoch_e[last][0] += de;
        self.epoch_t[last][0] += dt;
        // The charge of the jobs that never ran is in `m` (the yardstick's
        // rule); on top, a fixed penalty stands in for its ranking (a run
        // that leaves a job unserved ranks behind every run that serves
        // them all), which a sum of rewards cannot express.
        let starved = self.ledger.borrow().starved_penalty();
        self.epoch_t[last][0] += starved;
    }
}

/// The rewards of an episode from its per-epoch, per-GPU energy and
/// tardiness (the formula is in the `train` module docs).
struct Rewards<'e> {
    epoch_e: &'e [Vec<f64>],
    epoch_t: &'e [Vec<f64>],
    /// GPUs (the local part is scaled by their number).
    agents: usize,
    e_ref: f64,
    t_ref: f64,
    local_weight: f64,
    /// Team reward of the step at each epoch.
    team: Vec<f64>,
}

impl<'e> Rewards<'e> {
    /// `reference` is the day's exchange rate (its `none` run, `T_ref`
    /// floored as in the yardstick) and `jobs` its jobs: the tardiness of
    /// an interval is over `T_ref` times the jobs (a total, as the ledger's).
    fn new(
        epoch_e: &'e [Vec<f64>],
        epoch_t: &'e [Vec<f64>],
        agents: usize,
        reference: &Reference,
        jobs: usize,
        local_weight: f64,
    ) -> Self {
        let e_ref = reference.energy_j.max(1.0);
        let t_ref = (reference.tardiness_s * jobs as f64).max(1.0);
        // Rewards are known for epoch k once epoch k+1 happened: reward of
        // the step at epoch k = what accrued in (t_k, t_{k+1}], i.e.
        // epoch_x[k + 1].
        let team = (0..epoch_e.len())
            .map(|k| {
                let (e, t) = next_interval(epoch_e, epoch_t, k);
                -(e.iter().sum::<f64>() / e_ref + t.iter().sum::<f64>() / t_ref) / 2.0
            })
            .collect();
        Rewards {
            epoch_e,
            epoch_t,
            agents,
            e_ref,
            t_ref,
            local_weight,
            team,
        }
    }

    /// The sum of the team rewards, the interval before the first epoch
    /// included (= -ET when every job ran).
    fn team_return(&self) -> f64 {
        self.team.iter().sum::<f64>()
            - (self.epoch_e.first().map_or(0.0, |e| e.iter().sum::<f64>()) / self.e_ref
                + self.epoch_t.first().map_or(0.0, |t| t.iter().sum::<f64>()) / self.t_ref)
                / 2.0
    }

    /// The reward of GPU `g`'s step at epoch `k`: `(1 - w) * team + w *
    /// local`, the local part over its own energy and jobs, times the
    /// number of GPUs.
    fn agent(&self, k: usize, g: usize) -> f64 {
        let (e, t) = next_interval(self.epoch_e, self.epoch_t, k);
        let local = -(self.agents as f64)
            * (e.get(g).copied().unwrap_or(0.0) / self.e_ref
                + t.get(g).copied().unwrap_or(0.0) / self.t_ref)
            / 2.0;
        (1.0 - self.local_weight) * self.team[k] + self.local_weight * local
    }
}

/// GAE per agent: each agent's steps in epoch order, the reward of a step
/// being `reward(k, gpu)` summed over every epoch `k` from it to the
/// agent's next step (exclusive; to `epochs` for the last). Returns the
/// advantages and the returns, indexed like `steps`.
fn advantages(
    steps: &[Step],
    agents: usize,
    epochs: usize,
    reward: impl Fn(usize, usize) -> f64,
    gamma: f64,
    lambda: f64,
) -> (Vec<f32>, Vec<f32>) {
    let mut by_gpu: Vec<Vec<usize>> = vec![Vec::new(); agents];
    for (i, s) in steps.iter().enumerate() {
        by_gpu[s.gpu].push(i);
    }
    let mut adv = vec![0.0f32; steps.len()];
    let mut ret = vec![0.0f32; steps.len()];
    for (g, idx) in by_gpu.iter().enumerate() {
        let mut next_value = 0.0f64;
        let mut next_adv = 0.0f64;
        for (j, &i) in idx.iter().enumerate().rev() {
            let s = &steps[i];
            let until = idx.get(j + 1).map_or(epochs, |&k| steps[k].epoch);
            let r: f64 = (s.epoch..until).map(|k| reward(k, g)).sum();
            let delta = r + gamma * next_value - f64::from(s.value);
            next_adv = delta + gamma * lambda * next_adv;
            adv[i] = next_adv as f32;
            ret[i] = (next_adv + f64::from(s.value)) as f32;
            next_value = f64::from(s.value);
        }
    }
    (adv, ret)
}

fn next_interval<'a>(e: &'a [Vec<f64>], t: &'a [Vec<f64>], k: usize) -> (&'a [f64], &'a [f64]) {
    match (e.get(k + 1), t.get(k + 1)) {
        (Some(e), Some(t)) => (e, t),
        _ => (&[], &[]),
    }
}

/// The planning teacher of `day` (its jobs, its past days, its rate),
/// starting from the day's initial layouts.
pub fn planner_for(cfg: &TrainConfig, day: &Day) -> Result<Planner, LearnError> {
    let n = day.cluster.iter().filter(|&&m| m == cfg.gpu_model).count();
    Ok(Planner::new(
        cfg.gpu_model,
        cfg.dagger.planner.clone(),
        day.planner_rate(),
        cfg.heuristic()?,
        cfg.reconfig_time_s,
        day.jobs.clone(),
    )
    .with_past(day.past.clone())
    .with_initial(day.initial_layouts(cfg).into_iter().take(n).collect()))
}

/// A deterministic evaluation policy over a candle network (same decisions
/// as the exported ONNX policy, up to float ties).
pub struct CandlePolicy<'m> {
    pub net: &'m ActorCritic,
    encoder: Encoder,
    /// Catalog index every GPU starts from, unless `layouts` says.
    initial: usize,
    /// The layout each GPU starts from (empty: catalog layout `initial`).
    layouts: Vec<Layout>,
}

impl<'m> CandlePolicy<'m> {
    pub fn new(net: &'m ActorCritic, model: GpuModel) -> Self {
        CandlePolicy {
            net,
            encoder: Encoder::new(model),
            initial: 0,
            layouts: Vec::new(),
        }
    }

    /// Every GPU starts the day at catalog layout `index` (the trainer's
    /// `initial_layout`), as the exported policy does.
    pub fn starting_at(mut self, index: usize) -> Self {
        self.initial = index;
        self
    }

    /// Each GPU starts the day from its entry of `layouts` (a day's
    /// [`Day::initial_layouts`]: the fitted start when training had one),
    /// as the suite starts the exported policy (`policy::start`).
    pub fn starting_from(mut self, layouts: Vec<Layout>) -> Self {
        self.layouts = layouts;
        self
    }
}

impl RepartitionPolicy for CandlePolicy<'_> {
    fn name(&self) -> String {
        "candle".into()
    }

    fn initial_layout(&mut self, gpu: usize, geometry: &'static Geometry) -> Layout {
        if self.layouts.is_empty() {
            initial_layout(geometry, self.initial)
        } else {
            crate::policy::layout_or_whole(&self.layouts, gpu, geometry)
        }
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        self.encoder.encode(view);
        let rows = self.encoder.gpus.len();
        if rows == 0 {
            return Vec::new();
        }
        let spec: FeatureSpec = *self.encoder.spec();
        let Ok((_, probs)) = self.net.act(&self.encoder.obs, &self.encoder.mask, rows) else {
            return Vec::new();
        };
        let a = spec.actions;
        (0..rows)
            .filter_map(|r| {
                let act = argmax_masked(
                    &probs[r * a..(r + 1) * a],
                    &self.encoder.mask[r * a..(r + 1) * a],
                );
                let gpu = self.encoder.gpus[r];
                spec.decode(gpu, &view.gpus[gpu], act)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{day, net, tiny};
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    /// The critic sees each agent's observation, then the mean action of the
    /// other GPUs of its node and of the cluster (zeros when alone).
    #[test]
    fn mean_actions_leave_the_agent_out() {
        // GPUs 0, 1, 2 share node 0, GPU 8 is alone in node 1; 3 actions.
        let gpus = [0, 1, 2, 8];
        let actions = [0, 1, 1, 2];
        let got = mean_actions(3, &[0, 3], &actions, &gpus);
        let third = 1.0 / 3.0;
        let want = [
            [0.0, 1.0, 0.0, 0.0, 2.0 * third, third],
            [0.0, 0.0, 0.0, third, 2.0 * third, 0.0],
        ];
        assert_eq!(got.len(), 2 * 6);
        for (g, w) in got.iter().zip(want.iter().flatten()) {
            assert!((g - w).abs() < 1e-6, "{got:?}");
        }
        // The critic's rows: each observation, then its mean actions.
        let rows = critic_inputs(&[10.0, 20.0], &got, 1, 3);
        assert_eq!(rows.len(), 2 * critic_dim(1, 3));
        assert_eq!(rows[0], 10.0);
        assert_eq!(rows[1..7], got[..6]);
        assert_eq!(rows[7], 20.0);
        assert_eq!(rows[8..], got[6..]);
    }

    /// Masked actions are never drawn, allowed ones at their renormalised
    /// probabilities, the same seed draws the same, and with nothing
    /// allowed the last action ("keep") comes out.
    #[test]
    fn sample_follows_the_masked_probabilities() {
        let probs = [0.5, 0.1, 0.3, 0.1];
        let mask = [0.0, 1.0, 1.0, 0.0];
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut counts = [0usize; 4];
        for _ in 0..20_000 {
            counts[sample(&mut rng, &probs, &mask)] += 1;
        }
        assert_eq!(counts[0] + counts[3], 0, "{counts:?}");
        let share = counts[2] as f64 / 20_000.0;
        assert!((share - 0.75).abs() < 0.02, "{share}");
        let draws = |seed| {
            let mut r = ChaCha8Rng::seed_from_u64(seed);
            (0..50)
                .map(|_| sample(&mut r, &probs, &mask))
                .collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
        assert_eq!(sample(&mut rng, &probs, &[0.0; 4]), 3);
    }

    /// Team rewards, their return and a GPU's mixed reward, by hand: two
    /// GPUs, three epochs, references E = 100 J and T = 10 s.
    #[test]
    fn rewards_by_hand() {
        let e = vec![vec![10.0, 30.0], vec![20.0, 20.0], vec![0.0, 40.0]];
        let t = vec![vec![0.0, 0.0], vec![5.0, 0.0], vec![0.0, 15.0]];
        // 5 jobs with a T_ref of 2 s: 10 s of total tardiness.
        let reference = Reference {
            energy_j: 100.0,
            tardiness_s: 2.0,
            floor_s: 1.0,
        };
        let r = Rewards::new(&e, &t, 2, &reference, 5, 0.25);
        // The step at epoch k earns what accrued up to epoch k + 1.
        assert!(close(r.team[0], -(0.4 + 0.5) / 2.0));
        assert!(close(r.team[1], -(0.4 + 1.5) / 2.0));
        assert!(close(r.team[2], 0.0));
        // All of it, before the first epoch included: -(E/E_ref + T/T_ref) / 2.
        assert!(close(r.team_return(), -(1.2 + 2.0) / 2.0));
        // GPU 0 at epoch 0: local = -2 (20/100 + 5/10) / 2 = -0.7.
        assert!(close(r.agent(0, 0), 0.75 * -0.45 + 0.25 * -0.7));
        // GPU 1 at epoch 1: local = -2 (40/100 + 15/10) / 2 = -1.9.
        assert!(close(r.agent(1, 1), 0.75 * -0.95 + 0.25 * -1.9));
        assert!(close(r.agent(2, 0), 0.0));
    }

    /// GAE by hand: GPU 0 acts at epochs 0 and 2 of 4 (its steps earn the
    /// rewards up to its next step), GPU 1 never does.
    #[test]
    fn advantages_by_hand() {
        let step = |epoch, value| Step {
            gpu: 0,
            epoch,
            action: 0,
            logp: 0.0,
            value,
        };
        let steps = [step(0, 1.0), step(2, 0.5)];
        let reward = |k: usize, g: usize| {
            assert_eq!(g, 0);
            [1.0, 2.0, 3.0, 4.0][k]
        };
        let (adv, ret) = advantages(&steps, 2, 4, reward, 0.5, 0.8);
        // Last step: r = 3 + 4, delta = 7 - 0.5.
        // First: r = 1 + 2, delta = 3 + 0.5 * 0.5 - 1 = 2.25, plus
        // gamma * lambda * 6.5.
        let want_adv = [2.25 + 0.4 * 6.5, 6.5];
        for i in 0..2 {
            assert!((adv[i] - want_adv[i] as f32).abs() < 1e-6, "{adv:?}");
            assert!((ret[i] - (want_adv[i] + f64::from(steps[i].value)) as f32).abs() < 1e-6);
        }
    }

    /// A teacher episode on a tiny day: the batch is consistent, every
    /// recorded action was allowed, and (every job ran) the team return is
    /// exactly -ET.
    #[test]
    fn a_teacher_episode_returns_minus_et() {
        let cfg = tiny();
        let d = day(&cfg, 3);
        let n = net(&cfg, 1);
        let mut batch = Batch::default();
        let ep = run_episode(&cfg, &n, &d, Mode::Teacher, &Base::default(), 5, &mut batch).unwrap();
        assert!(!batch.is_empty());
        assert_eq!(batch.obs.len(), batch.len() * n.obs_dim);
        assert_eq!(batch.mask.len(), batch.len() * n.actions);
        for v in [&batch.logp, &batch.advantages, &batch.returns] {
            assert_eq!(v.len(), batch.len());
            assert!(v.iter().all(|x| x.is_finite()));
        }
        for (i, &a) in batch.actions.iter().enumerate() {
            assert!(batch.mask[i * n.actions + a as usize] > 0.5);
        }
        assert_eq!(ep.metrics.unserved, 0);
        let et = ep.et;
        assert!(
            (ep.team_return + et).abs() < 1e-9,
            "{} vs {et}",
            ep.team_return
        );
    }

    /// Sampled episodes depend on the seed and on nothing else; the greedy
    /// rollout decides as [`CandlePolicy`] does.
    #[test]
    fn episodes_are_seeded_and_greedy_matches_the_candle_policy() {
        let cfg = tiny();
        let d = day(&cfg, 4);
        let n = net(&cfg, 2);
        let sampled = |seed| {
            let mut b = Batch::default();
            run_episode(&cfg, &n, &d, Mode::Sample, &Base::default(), seed, &mut b).unwrap();
            b
        };
        let (a, b, c) = (sampled(9), sampled(9), sampled(10));
        assert_eq!(a.actions, b.actions);
        assert_eq!(a.advantages, b.advantages);
        assert_ne!(a.actions, c.actions);

        let mut batch = Batch::default();
        let greedy =
            run_episode(&cfg, &n, &d, Mode::Greedy, &Base::default(), 0, &mut batch).unwrap();
        let (m, et) = d
            .evaluate(&cfg, &mut CandlePolicy::new(&n, cfg.gpu_model))
            .unwrap();
        assert!(m.reconfigurations > 0, "the policy acts");
        assert_eq!(greedy.metrics, m);
        assert_eq!(greedy.et, et);
    }

    /// A day's start (the trainer's fitted start) is where its episode
    /// begins: a greedy episode on a day started from a split layout runs
    /// as the candle policy started there, not as from whole GPUs.
    #[test]
    fn episodes_begin_from_the_days_start() {
        let cfg = tiny();
        let g = Geometry::of(cfg.gpu_model);
        let split = g.catalog()[g.catalog().len() - 1];
        assert_ne!(split, g.whole_gpu());
        let whole = day(&cfg, 4);
        let d = day(&cfg, 4).with_start(vec![split; 3]);
        assert_eq!(whole.initial_layouts(&cfg), vec![g.whole_gpu(); 3]);
        assert_eq!(d.initial_layouts(&cfg), vec![split; 3]);
        let n = net(&cfg, 2);
        let greedy = |d: &Day| {
            let mut b = Batch::default();
            run_episode(&cfg, &n, d, Mode::Greedy, &Base::default(), 0, &mut b).unwrap()
        };
        let mut started = CandlePolicy::new(&n, cfg.gpu_model).starting_from(vec![split; 3]);
        assert_eq!(started.initial_layout(2, g), split);
        let (m, et) = d.evaluate(&cfg, &mut started).unwrap();
        let ep = greedy(&d);
        assert_eq!(ep.metrics, m);
        assert_eq!(ep.et, et);
        assert_ne!(ep.metrics, greedy(&whole).metrics);
        // The planning teacher starts there too.
        let mut planner = planner_for(&cfg, &d).unwrap();
        assert_eq!(planner.initial_layout(1, g), split);
    }
}
