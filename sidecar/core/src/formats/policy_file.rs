//! The policy file: an ONNX graph with its metadata, written by `smartmig
//! train` (crate `smartmig-learn` exports the graph, the CLI writes the
//! file and a copy of the metadata as `<file>.json` for people) and read by
//! the runtime (`policy::onnx` for a repartitioning policy,
//! `sim::placement_onnx` for a learned job placement).
//!
//! Both kinds share the graph's contract (tensor names, the mask penalty,
//! ONNX IR and opset versions) and keep their metadata as JSON in the
//! model's `metadata_props`, each under a key of its own ([`Kind::key`]),
//! so that a file of one kind given as the other is refused by name. The
//! embedded copy is the one checked: it cannot get separated from the
//! weights. [`read`] is the one reader of that metadata; the checks that
//! need this build's feature encoders (the observation and action sizes,
//! the catalog, the profiles) stay with the runtime, which calls
//! [`check_header`] and [`check_space`] for the parts both kinds share.
//!
//! Versions: each kind's metadata names its format ([`POLICY_FORMAT`],
//! [`PLACEMENT_FORMAT`]) and the feature-spec version its network was
//! trained with; a file with another format or feature spec is refused
//! with a message saying what to do.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::mig::GpuModel;

/// ONNX IR version written (ONNX 1.13+, understood by every ORT >= 1.14).
pub const IR_VERSION: i64 = 8;
/// Default-domain opset written.
pub const OPSET: i64 = 17;

/// Names of the graph's inputs and outputs.
pub const INPUT_OBS: &str = "obs";
pub const INPUT_MASK: &str = "mask";
pub const OUTPUT_LOGITS: &str = "logits";
pub const OUTPUT_PROBS: &str = "probs";

/// Penalty added to the logits of masked actions (`logits + (mask - 1) x
/// penalty`), in the network and in the exported graph alike.
pub const MASK_PENALTY: f32 = 1e9;

/// Key of a repartitioning policy's metadata in the ONNX `metadata_props`.
pub const POLICY_KEY: &str = "smartmig.policy";
/// Value of [`PolicyMetadata::format`].
pub const POLICY_FORMAT: &str = "smartmig-policy/1";
/// Key of a learned placement's metadata in the ONNX `metadata_props`.
pub const PLACEMENT_KEY: &str = "smartmig.placement";
/// Value of [`PlacementMetadata::format`].
pub const PLACEMENT_FORMAT: &str = "smartmig-placement/1";
/// The job order a learned placement uses (the only one today).
pub const ORDER_EDF: &str = "edf";

/// The two kinds of policy file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A repartitioning policy (`--policy policy:FILE`).
    Repartitioning,
    /// A learned job placement (`--placement learned:FILE`).
    Placement,
}

impl Kind {
    /// The `metadata_props` key its metadata is stored under.
    pub fn key(self) -> &'static str {
        match self {
            Kind::Repartitioning => POLICY_KEY,
            Kind::Placement => PLACEMENT_KEY,
        }
    }

    /// The other kind.
    fn other(self) -> Kind {
        match self {
            Kind::Repartitioning => Kind::Placement,
            Kind::Placement => Kind::Repartitioning,
        }
    }

    /// How error messages name it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Repartitioning => "repartitioning",
            Kind::Placement => "job-placement",
        }
    }

    /// How a file of this kind is given, for a message about a file given
    /// as the other kind.
    fn how_to_give(self) -> &'static str {
        match self {
            Kind::Repartitioning => {
                "give it as `--policy policy:FILE` (daemon: `policy = \"policy:FILE\"`)"
            }
            Kind::Placement => {
                "give it as `--placement learned:FILE` (daemon: `placement = \"learned:FILE\"`)"
            }
        }
    }
}

/// What a repartitioning policy file says about itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicyMetadata {
    /// [`POLICY_FORMAT`].
    pub format: String,
    pub gpu_model: GpuModel,
    /// The feature-spec version (`policy::features::FEATURE_SPEC_VERSION`)
    /// the policy was trained with.
    pub feature_spec_version: u32,
    pub obs_dim: usize,
    pub actions: usize,
    /// The action space: catalog layouts as pictures (`smartmig layouts`),
    /// then `keep`.
    pub catalog: Vec<String>,
    pub hidden: usize,
    /// How it was trained (config, seed, data, duration): free form.
    #[serde(default)]
    pub training: serde_json::Value,
    /// Validation numbers measured at the end of training: free form.
    #[serde(default)]
    pub validation: serde_json::Value,
    /// Run-time limits that keep the policy from doing harm where it is
    /// unsure (absent in older files: no limits).
    #[serde(default)]
    pub guard: Guard,
    /// The catalog layout (index into `catalog`) every GPU starts from,
    /// the one the policy was trained from (absent: the whole GPU).
    #[serde(default)]
    pub initial_layout: usize,
}

/// Run-time limits on a learned policy ("do no harm"): a GPU moves only
/// when the network is sure enough, and never more often than a budget.
/// Stored in the policy's metadata; `policy:FILE.onnx?min_confidence=0.6`
/// overrides them for one run (`policy::onnx::LearnedSpec`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Guard {
    /// A GPU follows the network's most probable action only when that
    /// action has at least this probability; below, it keeps its layout.
    /// 0 = always follow.
    #[serde(default)]
    pub min_confidence: f32,
    /// At most this many reconfigurations of one GPU in any 24 h (a
    /// sliding window); further moves wait. 0 = no limit.
    #[serde(default)]
    pub max_reconfigurations_per_day: u32,
}

/// Why a guard override (`policy:FILE.onnx?key=value&...`) was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum GuardError {
    #[error("`{0}` is not key=value")]
    NotKeyValue(String),
    #[error("min_confidence={0}: not a number in 0..=1")]
    Confidence(String),
    #[error("max_reconfigurations_per_day={0}: not a whole number")]
    Budget(String),
    #[error("unknown guard `{0}` (known: min_confidence, max_reconfigurations_per_day, serve)")]
    Unknown(String),
    /// `serve=MODEL` names no model, or not this node's.
    #[error("{0}")]
    Serve(String),
}

impl Guard {
    /// Applies `key=value` pairs separated by `&` (the part of a
    /// `policy:FILE.onnx?...` spec after `?`).
    pub fn with_overrides(mut self, query: &str) -> Result<Guard, GuardError> {
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| GuardError::NotKeyValue(pair.to_string()))?;
            match key {
                "min_confidence" => {
                    self.min_confidence = value
                        .parse::<f32>()
                        .ok()
                        .filter(|c| (0.0..=1.0).contains(c))
                        .ok_or_else(|| GuardError::Confidence(value.to_string()))?;
                }
                "max_reconfigurations_per_day" => {
                    self.max_reconfigurations_per_day = value
                        .parse()
                        .map_err(|_| GuardError::Budget(value.to_string()))?;
                }
                // Not a guard: which GPUs the policy serves
                // (`policy::onnx::LearnedSpec::serve`).
                "serve" => {}
                other => return Err(GuardError::Unknown(other.to_string())),
            }
        }
        Ok(self)
    }

    /// Whether any limit is set.
    pub fn is_set(self) -> bool {
        self.min_confidence > 0.0 || self.max_reconfigurations_per_day > 0
    }
}

/// What a learned placement file says about itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlacementMetadata {
    /// [`PLACEMENT_FORMAT`].
    pub format: String,
    pub gpu_model: GpuModel,
    /// The placement feature-spec version
    /// (`sim::placement_features::PLACEMENT_SPEC_VERSION`) it was trained with.
    pub feature_spec_version: u32,
    pub obs_dim: usize,
    pub actions: usize,
    /// The action space: the model's profile names, in order.
    pub profiles: Vec<String>,
    pub hidden: usize,
    /// Job order ([`ORDER_EDF`]).
    pub order: String,
    /// How it was trained: free form.
    #[serde(default)]
    pub training: serde_json::Value,
    /// Validation numbers measured at the end of training: free form.
    #[serde(default)]
    pub validation: serde_json::Value,
}

/// Why a policy file's metadata was refused.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("reading policy {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("policy {} is not a valid ONNX file: {reason}", path.display())]
    Parse { path: PathBuf, reason: String },
    #[error("policy {} has no smartmig metadata (`{POLICY_KEY}`); was it written by `smartmig train`?", path.display())]
    MissingMetadata { path: PathBuf },
    #[error("{} is a {} policy, not a {} policy: {}", path.display(), found.name(), expected.name(), found.how_to_give())]
    WrongKind {
        path: PathBuf,
        found: Kind,
        expected: Kind,
    },
    #[error("policy {}: bad metadata: {reason}", path.display())]
    BadMetadata { path: PathBuf, reason: String },
    #[error("policy {} was trained for {found}, but this GPU is {expected}: use a policy trained for {expected} (`smartmig train --config` with gpu_model = \"{expected}\")", path.display())]
    ModelMismatch {
        path: PathBuf,
        found: GpuModel,
        expected: GpuModel,
    },
    #[error("policy {} uses feature spec version {found}, this smartmig encodes version {expected}: retrain it with this version (`smartmig train`)", path.display())]
    FeatureSpecMismatch {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("policy {} does not match the {model} action/observation space of this smartmig ({what}): retrain it", path.display())]
    SpaceMismatch {
        path: PathBuf,
        model: GpuModel,
        what: String,
    },
}

/// The `metadata_props` of an ONNX file (key, value), without running it.
pub fn read_metadata_props(bytes: &[u8]) -> Result<Vec<(String, String)>, onnx_rs::Error> {
    let model = onnx_rs::parse(bytes)?;
    Ok(model
        .metadata_props
        .iter()
        .map(|e| (e.key.to_string(), e.value.to_string()))
        .collect())
}

/// Reads a policy file of `kind`: its bytes and its metadata, refusing a
/// file of the other kind by name and one without metadata. The checks
/// against this build's encoders are the caller's ([`check_header`],
/// [`check_space`] and its own).
pub fn read<M: DeserializeOwned>(path: &Path, kind: Kind) -> Result<(M, Vec<u8>), MetadataError> {
    let p = || path.to_path_buf();
    let bytes = std::fs::read(path).map_err(|source| MetadataError::Io { path: p(), source })?;
    let props = read_metadata_props(&bytes).map_err(|e| MetadataError::Parse {
        path: p(),
        reason: e.to_string(),
    })?;
    let entry = |key: &str| props.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    let Some(json) = entry(kind.key()) else {
        if entry(kind.other().key()).is_some() {
            return Err(MetadataError::WrongKind {
                path: p(),
                found: kind.other(),
                expected: kind,
            });
        }
        return Err(match kind {
            Kind::Repartitioning => MetadataError::MissingMetadata { path: p() },
            Kind::Placement => MetadataError::BadMetadata {
                path: p(),
                reason: format!(
                    "no `{PLACEMENT_KEY}` entry; was it written by `smartmig train --config etc/train-placement.toml`?"
                ),
            },
        });
    };
    let meta = serde_json::from_str(json).map_err(|e| MetadataError::BadMetadata {
        path: p(),
        reason: e.to_string(),
    })?;
    Ok((meta, bytes))
}

/// A kind of file metadata with its own checks: the runtime policy's
/// (`policy::onnx`) and the learned placement's (`sim::placement_onnx`).
pub trait CheckedMetadata: DeserializeOwned {
    /// Where the metadata sits in the file.
    const KIND: Kind;
    /// Checks the metadata of the file at `path` against this build (and
    /// against `expected`, the GPU model it must be for; `None`: any).
    fn check(&self, path: &Path, expected: Option<GpuModel>) -> Result<(), MetadataError>;
}

/// Reads a file's metadata of kind `M` and checks it, without loading
/// ONNX Runtime: the one place both kinds are read. Returns it with the
/// file's bytes.
pub fn read_checked<M: CheckedMetadata>(
    path: &Path,
    expected: Option<GpuModel>,
) -> Result<(M, Vec<u8>), MetadataError> {
    let (meta, bytes) = read::<M>(path, M::KIND)?;
    meta.check(path, expected)?;
    Ok((meta, bytes))
}

/// The checks both kinds of policy file share: the metadata format, the
/// GPU model (`expected`; `None`: any) and the feature-spec version.
pub fn check_header(
    path: &Path,
    (format, want_format): (&str, &str),
    (model, expected): (GpuModel, Option<GpuModel>),
    (version, want_version): (u32, u32),
) -> Result<(), MetadataError> {
    let path = path.to_path_buf();
    if format != want_format {
        return Err(MetadataError::BadMetadata {
            path,
            reason: format!("format `{format}`, expected `{want_format}`"),
        });
    }
    if let Some(expected) = expected {
        if model != expected {
            return Err(MetadataError::ModelMismatch {
                path,
                found: model,
                expected,
            });
        }
    }
    if version != want_version {
        return Err(MetadataError::FeatureSpecMismatch {
            path,
            found: version,
            expected: want_version,
        });
    }
    Ok(())
}

/// The network's input and output sizes (`found`: the file's `(features,
/// actions)`) against what this build's feature spec makes (`want`), for
/// both kinds of policy file; `kind` names the file's kind in the error.
pub fn check_space(
    path: &Path,
    model: GpuModel,
    kind: &str,
    found: (usize, usize),
    want: (usize, usize),
) -> Result<(), MetadataError> {
    if found == want {
        return Ok(());
    }
    Err(MetadataError::SpaceMismatch {
        path: path.to_path_buf(),
        model,
        what: format!(
            "{kind} has {} features and {} actions, expected {} and {}",
            found.0, found.1, want.0, want.1
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_overrides_parse_and_refuse_nonsense() {
        let g = Guard::default()
            .with_overrides("min_confidence=0.6&max_reconfigurations_per_day=12")
            .unwrap();
        assert!((g.min_confidence - 0.6).abs() < 1e-6);
        assert_eq!(g.max_reconfigurations_per_day, 12);
        for (bad, says) in [
            ("min_confidence=2", "not a number in 0..=1"),
            ("max_reconfigurations_per_day=-1", "not a whole number"),
            ("colour=red", "unknown guard `colour`"),
            ("min_confidence", "not key=value"),
        ] {
            let e = Guard::default()
                .with_overrides(bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_file_of_the_other_kind_is_refused_by_name() {
        let e = MetadataError::WrongKind {
            path: PathBuf::from("p.onnx"),
            found: Kind::Placement,
            expected: Kind::Repartitioning,
        };
        assert_eq!(
            e.to_string(),
            "p.onnx is a job-placement policy, not a repartitioning policy: give it as \
             `--placement learned:FILE` (daemon: `placement = \"learned:FILE\"`)"
        );
    }
}
