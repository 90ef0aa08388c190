//! The learned job placement, evaluated through ONNX Runtime
//! (`--placement learned:FILE.onnx`).
//!
//! A placement file is an actor network written by `smartmig train --config
//! etc/train-placement.toml` (crate `smartmig-learn`): the same graph shape
//! as a repartitioning policy (inputs `obs [n, D]` and `mask [n, A]`,
//! outputs `logits` and `probs`), over the observation of
//! [`super::placement_features`], with its own metadata
//! ([`crate::formats::policy_file`]). It is loaded with the checks of the repartitioning
//! policy: the file must name this GPU model, this feature-spec version and
//! this action space (the model's profile names), and a repartitioning file
//! given as a placement (or the reverse) is refused with a message saying
//! which it is.
//!
//! Job order is earliest deadline first (as `edf`); for the job at the
//! head of the queue the network picks the profile of its free instance,
//! or defers the job behind the others of this placement round (a job that
//! will be late anyway, so that jobs that can still make their deadlines
//! go first), the most probable allowed action. Candidates of other GPU models, and any
//! inference failure (counted in [`OnnxPlacement::failures`]), fall back to
//! `best-fit`.

use std::path::Path;

use ort::session::Session;
use ort::value::TensorRef;

use crate::formats::policy_file::{
    self, check_header, check_space, CheckedMetadata, Kind, MetadataError, PlacementMetadata,
    INPUT_MASK, INPUT_OBS, ORDER_EDF, OUTPUT_PROBS, PLACEMENT_FORMAT,
};
use crate::mig::GpuModel;
use crate::policy::features::argmax_masked;
use crate::policy::onnx::{session_from_bytes, PolicyLoadError};
use crate::workload::Job;

use super::heuristics::{best_fit, Candidate, Pick, PlacementContext, PlacementHeuristic};
use super::placement_features::{PlacementFeatures, PLACEMENT_SPEC_VERSION};

impl PlacementMetadata {
    /// Metadata for a network over `features`.
    pub fn new(features: &PlacementFeatures, hidden: usize) -> Self {
        PlacementMetadata {
            format: PLACEMENT_FORMAT.to_string(),
            gpu_model: features.model,
            feature_spec_version: PLACEMENT_SPEC_VERSION,
            obs_dim: features.obs_dim,
            actions: features.actions,
            profiles: features.action_names(),
            hidden,
            order: ORDER_EDF.to_string(),
            training: serde_json::Value::Null,
            validation: serde_json::Value::Null,
        }
    }
}

/// Reads and checks a placement file's metadata without loading ONNX
/// Runtime. `expected`: the GPU model it must be for (`None`: any).
pub fn read_metadata(
    path: &Path,
    expected: Option<GpuModel>,
) -> Result<(PlacementMetadata, Vec<u8>), PolicyLoadError> {
    Ok(policy_file::read_checked(path, expected)?)
}

impl CheckedMetadata for PlacementMetadata {
    const KIND: Kind = Kind::Placement;

    fn check(&self, path: &Path, expected: Option<GpuModel>) -> Result<(), MetadataError> {
        check_metadata(path, self, expected)
    }
}

/// The checks of [`read_metadata`], on already-read metadata.
pub fn check_metadata(
    path: &Path,
    meta: &PlacementMetadata,
    expected: Option<GpuModel>,
) -> Result<(), MetadataError> {
    check_header(
        path,
        (&meta.format, PLACEMENT_FORMAT),
        (meta.gpu_model, expected),
        (meta.feature_spec_version, PLACEMENT_SPEC_VERSION),
    )?;
    let path = path.to_path_buf();
    let f = PlacementFeatures::new(meta.gpu_model);
    let mismatch = |what: String| MetadataError::SpaceMismatch {
        path: path.clone(),
        model: meta.gpu_model,
        what,
    };
    check_space(
        &path,
        meta.gpu_model,
        "placement",
        (meta.obs_dim, meta.actions),
        (f.obs_dim, f.actions),
    )?;
    if meta.profiles != f.action_names() {
        return Err(mismatch(format!(
            "its profiles {:?} differ from {:?}",
            meta.profiles,
            f.action_names()
        )));
    }
    if meta.order != ORDER_EDF {
        return Err(mismatch(format!(
            "job order `{}`, this smartmig knows `{ORDER_EDF}`",
            meta.order
        )));
    }
    Ok(())
}

/// A learned placement running in ONNX Runtime (module docs).
pub struct OnnxPlacement {
    meta: PlacementMetadata,
    session: Session,
    features: PlacementFeatures,
    obs: Vec<f32>,
    mask: Vec<f32>,
    /// Decisions the network made, and inference failures (best-fit then).
    pub decisions: u64,
    pub failures: u64,
}

impl std::fmt::Debug for OnnxPlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxPlacement")
            .field("meta", &self.meta)
            .finish_non_exhaustive()
    }
}

impl OnnxPlacement {
    /// Loads a placement file, refusing one made for another model
    /// (`expected`; `None`: whatever model it names), feature spec or
    /// action space.
    pub fn load(path: &Path, expected: Option<GpuModel>) -> Result<Self, PolicyLoadError> {
        let (meta, bytes) = read_metadata(path, expected)?;
        let session = session_from_bytes(path, &bytes)?;
        Ok(OnnxPlacement {
            features: PlacementFeatures::new(meta.gpu_model),
            meta,
            session,
            obs: Vec::new(),
            mask: Vec::new(),
            decisions: 0,
            failures: 0,
        })
    }

    pub fn metadata(&self) -> &PlacementMetadata {
        &self.meta
    }

    /// Probabilities of the actions for one encoded row.
    pub fn infer(&mut self, obs: &[f32], mask: &[f32]) -> Result<Vec<f32>, ort::Error> {
        let obs_t = TensorRef::from_array_view(([1, self.meta.obs_dim], obs))?;
        let mask_t = TensorRef::from_array_view(([1, self.meta.actions], mask))?;
        let out = self.session.run(ort::inputs![
            INPUT_OBS => obs_t,
            INPUT_MASK => mask_t,
        ])?;
        let (_, probs) = out[OUTPUT_PROBS].try_extract_tensor::<f32>()?;
        Ok(probs.to_vec())
    }
}

impl PlacementHeuristic for OnnxPlacement {
    fn name(&self) -> &'static str {
        "learned"
    }

    fn priority(&self, job: &Job) -> f64 {
        job.deadline
    }

    fn choose(&mut self, job: &Job, candidates: &[Candidate]) -> Pick {
        Pick {
            candidate: best_fit(job, candidates),
            gpu_hint: 0,
            defer: false,
        }
    }

    fn choose_in(
        &mut self,
        job: &Job,
        candidates: &[Candidate],
        ctx: &PlacementContext<'_>,
    ) -> Pick {
        let (mut obs, mut mask) = (
            std::mem::take(&mut self.obs),
            std::mem::take(&mut self.mask),
        );
        let mut pick = None;
        let mut defer = false;
        if self
            .features
            .encode(job, candidates, ctx, &mut obs, &mut mask)
        {
            match self.infer(&obs, &mask) {
                Ok(probs) => {
                    self.decisions += 1;
                    let action = argmax_masked(&probs, &mask);
                    defer = action == self.features.defer_action();
                    pick = self.features.candidate_of(candidates, action);
                }
                Err(e) => {
                    self.failures += 1;
                    if self.failures == 1 {
                        tracing::warn!("learned placement failed ({e}); best-fit instead");
                    }
                }
            }
        }
        self.obs = obs;
        self.mask = mask;
        match pick {
            Some(candidate) => Pick {
                candidate,
                gpu_hint: 0,
                defer: false,
            },
            None => Pick {
                defer,
                ..self.choose(job, candidates)
            },
        }
    }
}
