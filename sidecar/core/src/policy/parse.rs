//! A policy from its command-line name (`--policy`, `--compare-policy`,
//! smartmigd's `policy` key): every spelling the simulator, the bench and
//! the daemon take, parsed in one place, with an error that names what
//! was not understood and what is known.

use super::fixed::{OnDemand, PolicyParseError, StaticLayout};
use super::{NoPartition, RepartitionPolicy};
use crate::mig::GpuModel;

/// [`parse_policy`] for a known cluster (one model per GPU, in order), which
/// also takes an admin's twice-daily schedule,
/// `twice:DAY=SPEC/NIGHT=SPEC` ([`super::search::TwiceDaily::parse`]), and
/// per-node decisions, `nodes:<GPUs per node>:<whole|claimed>:<policy>`
/// ([`super::nodes::parse_per_node`]); `start_hour` is the hour of day at
/// time 0.
pub fn parse_policy_on(
    spec: &str,
    cluster: &[GpuModel],
    start_hour: f64,
) -> Result<Box<dyn RepartitionPolicy + Send>, PolicyParseError> {
    if let Some(rest) = spec.trim().strip_prefix("twice:") {
        return Ok(Box::new(super::search::TwiceDaily::parse(
            rest, cluster, start_hour,
        )?));
    }
    if let Some(per_node) = super::nodes::parse_per_node(spec, cluster) {
        return per_node;
    }
    parse_policy(spec, &GpuModel::distinct(cluster))
}

/// Builds a policy from its command-line name: `none`, `on-demand`, `static:<index>` or
/// `static:<picture>`, checked against every model of the cluster, `greedy[:...]`,
/// `rolling-fit[:period=S&window=S&margin=X]` ([`super::rolling`]).
pub fn parse_policy(
    spec: &str,
    models: &[GpuModel],
) -> Result<Box<dyn RepartitionPolicy + Send>, PolicyParseError> {
    let s = spec.trim();
    if s.eq_ignore_ascii_case("none") {
        return Ok(Box::new(NoPartition));
    }
    if s == "on-demand" {
        return Ok(Box::new(OnDemand));
    }
    if let Some(rest) = s.strip_prefix("static:") {
        return Ok(Box::new(StaticLayout::parse(rest, models)?));
    }
    if let Some(greedy) = super::greedy::Greedy::parse(s) {
        return Ok(Box::new(greedy?));
    }
    if let Some(rolling) = super::rolling::RollingFit::parse(s) {
        return Ok(Box::new(rolling?));
    }
    if s.starts_with("twice:") || s.starts_with("nodes:") {
        return Err(PolicyParseError::NeedsCluster(s.to_string()));
    }
    if matches!(
        s,
        "static-best"
            | "twice-daily"
            | "static-hist"
            | "twice-daily-hist"
            | "static-hindsight"
            | "twice-daily-hindsight"
    ) {
        return Err(PolicyParseError::NeedsWorkload(s.to_string()));
    }
    if let Some(path) = s.strip_prefix("policy:") {
        // The learned policy acts on the GPUs of the model it was trained
        // for (or `?serve=MODEL`'s, of the same geometry); it must be one
        // of the cluster's (others keep their layouts).
        let learned_err = |reason: String| PolicyParseError::Learned {
            spec: s.to_string(),
            reason,
        };
        let learned = super::onnx::LearnedSpec::parse(path);
        let mut policy =
            super::onnx::load_any_policy(learned.path).map_err(|e| learned_err(e.to_string()))?;
        if let Some(query) = learned.guard {
            policy
                .override_guard(query)
                .map_err(|e| learned_err(e.to_string()))?;
        }
        if let Some(serve) = learned.serve() {
            policy = policy
                .serving(serve.map_err(learned_err)?)
                .map_err(|e| learned_err(e.to_string()))?;
        }
        let model = policy.served_model();
        if !models.is_empty() && !models.contains(&model) {
            return Err(learned_err(format!(
                "the policy acts on {model} GPUs, which this cluster does not have (a policy can serve a model of the same geometry: `?serve=MODEL`)"
            )));
        }
        return Ok(Box::new(policy));
    }
    Err(PolicyParseError::Unknown(spec.to_string()))
}
