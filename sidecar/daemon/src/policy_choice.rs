//! Which repartitioning policy the daemon runs, from the config's `policy`.
//!
//! Shared by config validation (`--check-config`, SIGHUP) and the server, so
//! both accept and refuse exactly the same specs. Every name of
//! [`crate::policy::parse_policy`] is accepted. A learned policy
//! (`policy:FILE.onnx`) is checked against the node's GPU model and this
//! build's feature spec: a mismatch is refused (the daemon will not run a
//! policy trained for something else), while a missing file or a missing ONNX
//! Runtime falls back to `greedy` with a warning, so a node whose runtime was
//! not installed still repartitions sensibly.

use crate::formats::policy_file::{GuardError, MetadataError};
use crate::mig::{Geometry, GpuModel};
use crate::policy::onnx::{load_any_policy, load_policy, LearnedSpec, PolicyLoadError};
use crate::policy::shadow::Toward;
use crate::policy::{self, greedy::Greedy, PolicyParseError, RepartitionPolicy};

/// A policy ready to run, with the name shown in status and logs.
pub type Built = (Box<dyn RepartitionPolicy + Send>, String);

/// Why the daemon will not run the policy its config names.
#[derive(Debug, thiserror::Error)]
pub enum PolicyChoiceError {
    /// `policy:FILE.onnx` on a node whose GPUs are of several models.
    #[error("`{spec}`: a learned policy serves one GPU model, but this node has {}", model_ids(.models))]
    SeveralModels { spec: String, models: Vec<GpuModel> },
    /// The learned policy exists but is wrong for this node or build
    /// (another GPU model, another feature spec, not an ONNX file, ...).
    #[error(transparent)]
    Learned(#[from] PolicyLoadError),
    /// A bad `?key=value` guard override after the file name.
    #[error("`{spec}`: {reason}")]
    Guard { spec: String, reason: GuardError },
    /// Not a built-in policy name (or a bad `static:`/`greedy:` spec).
    #[error(transparent)]
    Builtin(#[from] PolicyParseError),
}

fn model_ids(models: &[GpuModel]) -> String {
    models.iter().map(|m| m.id()).collect::<Vec<_>>().join(", ")
}

/// Builds the policy named by `spec` for a node with GPUs of `models`
/// (empty: not known yet, e.g. NVML before start-up).
pub fn build(spec: &str, models: &[GpuModel]) -> Result<Built, PolicyChoiceError> {
    let s = spec.trim();
    let distinct = GpuModel::distinct(models);
    if let Some(path) = s.strip_prefix("policy:") {
        let model = match distinct.as_slice() {
            [] => return Ok(fallback(s, "the node's GPU model is not known yet")),
            [one] => *one,
            many => {
                return Err(PolicyChoiceError::SeveralModels {
                    spec: s.to_string(),
                    models: many.to_vec(),
                })
            }
        };
        let learned = LearnedSpec::parse(path);
        let loaded = match learned.serve() {
            // `?serve=MODEL`: a policy of another model of the same
            // geometry, run on this node's GPUs, which must be MODEL's.
            Some(serve) => {
                let served = serve.map_err(|reason| PolicyChoiceError::Guard {
                    spec: s.to_string(),
                    reason: GuardError::Serve(reason),
                })?;
                if served != model {
                    return Err(PolicyChoiceError::Guard {
                        spec: s.to_string(),
                        reason: GuardError::Serve(format!(
                            "serve={served}, but this node's GPUs are {model}"
                        )),
                    });
                }
                load_any_policy(learned.path).and_then(|p| p.serving(model))
            }
            None => load_policy(learned.path, model),
        };
        return match loaded {
            Ok(mut p) => {
                if let Some(query) = learned.guard {
                    p.override_guard(query)
                        .map_err(|reason| PolicyChoiceError::Guard {
                            spec: s.to_string(),
                            reason,
                        })?;
                }
                Ok((Box::new(p), s.to_string()))
            }
            Err(e) if is_unavailable(&e) => Ok(fallback(s, &e.to_string())),
            Err(e) => Err(e.into()),
        };
    }
    let p = policy::parse_policy(s, &distinct)?;
    let name = p.name();
    Ok((p, name))
}

/// Builds the shadow's fallback (`[shadow] fallback`, docs/daemon.md):
/// any spec [`build`] accepts; a `static:` layout is pursued from any
/// state ([`Toward`]), since the fallback takes over in the middle of a
/// day, when a plain static policy (which only installs its layout at
/// start) would leave the GPUs as the learned policy left them.
pub fn build_fallback(spec: &str, models: &[GpuModel]) -> Result<Built, PolicyChoiceError> {
    let (mut p, name) = build(spec, models)?;
    if !spec.trim().starts_with("static:") || models.is_empty() {
        return Ok((p, name));
    }
    let layouts = models
        .iter()
        .enumerate()
        .map(|(gpu, &m)| p.initial_layout(gpu, Geometry::of(m)))
        .collect();
    let toward = Toward {
        label: name.clone(),
        layouts,
    };
    Ok((Box::new(toward), name))
}

/// Errors that mean "the learned policy cannot run here", not "it is wrong".
fn is_unavailable(e: &PolicyLoadError) -> bool {
    matches!(
        e,
        PolicyLoadError::RuntimeNotFound { .. }
            | PolicyLoadError::RuntimeEnvMissing(_)
            | PolicyLoadError::RuntimeLoad { .. }
            | PolicyLoadError::Metadata(MetadataError::Io { .. })
    )
}

fn fallback(spec: &str, why: &str) -> Built {
    tracing::warn!(
        policy = spec,
        "learned policy unavailable ({why}); running `greedy` instead"
    );
    (
        Box::new(Greedy::default()),
        format!("greedy (fallback: {spec} unavailable)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_names_and_errors() {
        let a100 = [GpuModel::A100_40gb, GpuModel::A100_40gb];
        assert!(build("none", &a100).is_ok());
        assert!(build("greedy", &a100).is_ok());
        assert!(build("static:0", &a100).is_ok());
        let err = build("magic", &a100).err();
        assert!(
            matches!(err, Some(PolicyChoiceError::Builtin(_))),
            "{err:?}"
        );
        let err = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(err.starts_with("unknown policy"), "{err}");
    }

    /// A static fallback pursues its layout from any state: from a GPU in
    /// 1g slices it asks for the whole GPU, which a plain static policy
    /// never does after start.
    #[test]
    fn a_static_fallback_is_pursued_from_any_state() {
        let a100 = [GpuModel::A100_40gb];
        let (mut p, name) = build_fallback("static:7", &a100).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            name,
            build("static:7", &a100).unwrap_or_else(|e| panic!("{e}")).1
        );
        let g = Geometry::of(GpuModel::A100_40gb);
        let whole = p.initial_layout(0, g);
        let small = *g
            .catalog()
            .iter()
            .find(|&&l| g.picture(l).starts_with("1|1|1|1|1|1|1"))
            .expect("seven 1g slices");
        let status = policy::GpuStatus::new(GpuModel::A100_40gb, small);
        let pending: policy::PendingByProfile = Default::default();
        let view = policy::ClusterView {
            now: 10.0,
            hour_of_day: 0.0,
            gpus: std::slice::from_ref(&status),
            pending: &[],
            pending_by_profile: &pending,
            arrivals: &[],
        };
        let d = p.decide(&view);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].target, whole);
        assert!(build_fallback("static:nonsense", &a100).is_err());
        assert!(build_fallback("greedy", &a100).is_ok());
    }

    #[test]
    fn missing_learned_policy_falls_back_to_greedy() {
        let (p, name) = build("policy:/nonexistent/p.onnx", &[GpuModel::A100_40gb])
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(name.starts_with("greedy (fallback"), "{name}");
        assert!(p.name().starts_with("greedy"), "{}", p.name());
    }

    #[test]
    fn learned_policy_for_another_model_is_refused() {
        let shipped =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies/a100-40gb.onnx");
        let spec = format!("policy:{}", shipped.display());
        let err = build(&spec, &[GpuModel::H100_80gb]).err();
        assert!(
            matches!(
                err,
                Some(PolicyChoiceError::Learned(PolicyLoadError::Metadata(
                    MetadataError::ModelMismatch { .. }
                )))
            ),
            "{err:?}"
        );
        let err = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("trained for a100-40gb"), "{err}");
        let err = build(&spec, &[GpuModel::A100_40gb, GpuModel::H100_80gb])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("one GPU model"), "{err}");
        // Served explicitly: the same geometry runs, another model's name
        // or another geometry is refused.
        let served = format!("{spec}?serve=h100-80gb");
        let (_, name) = build(&served, &[GpuModel::H100_80gb]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(name, served);
        let err = build(&served, &[GpuModel::B200_180gb])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("this node's GPUs are b200-180gb"), "{err}");
        let rtx = format!("{spec}?serve=rtx-pro-6000-96gb");
        let err = build(&rtx, &[GpuModel::RtxPro6000_96gb])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("slice geometry"), "{err}");
    }
}
