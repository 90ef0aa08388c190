//! The learned repartitioning policy, evaluated through ONNX Runtime.
//!
//! A policy file is an ONNX graph written by `smartmig train`
//! (crate `smartmig-learn`) with its metadata ([`PolicyMetadata`]) embedded in the
//! model's `metadata_props`; the format is [`crate::formats::policy_file`].
//!
//! [`load_policy`] is what the daemon calls: it refuses a policy made for
//! another GPU model, another feature-spec version or another catalog, with
//! a message that says which and what to do, *before* touching ONNX Runtime.
//!
//! ## Finding ONNX Runtime
//!
//! `ort` is built with `load-dynamic`: the library is opened at run time,
//! once per process, from the first of
//!
//! 1. `ORT_DYLIB_PATH`, if set and not empty (must exist);
//! 2. `.ort/libonnxruntime.so.1.31.1` in the directory of the executable or
//!    any of its ancestors (a checkout's `target/release/smartmig` finds the
//!    checkout's `.ort/`);
//! 3. the same under the source checkout this binary was built from
//!    (`CARGO_MANIFEST_DIR/../..`), for tests and `cargo run`;
//! 4. [`INSTALLED_ORT_DIR`]`/libonnxruntime.so.1.31.1`, where the packaged
//!    fetch step (`/usr/share/smartmig/fetch-onnxruntime`, docs/daemon.md,
//!    "Install") puts it on an installed node.
//!
//! Otherwise: "ONNX Runtime not found: run scripts/fetch-onnxruntime (or,
//! installed, /usr/share/smartmig/fetch-onnxruntime) or set ORT_DYLIB_PATH".
//!
//! ## Evaluation
//!
//! At each epoch the GPUs of the policy's model are encoded into one
//! `[n, D]` batch ([`super::features::Encoder`]) and run through one session
//! call; each GPU takes its most probable allowed action (deterministic).
//! GPUs of other models keep their layouts.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::TensorRef;

use super::features::{
    argmax_masked, Encoder, FeatureSpec, FEATURE_SPEC_VERSION, SUPPORTED_FEATURE_SPECS,
};
use super::{ClusterView, Decision, RepartitionPolicy};
use crate::formats::policy_file::{
    self, check_header, check_space, CheckedMetadata, GuardError, Kind, MetadataError,
    PolicyMetadata, INPUT_MASK, INPUT_OBS, OUTPUT_LOGITS, OUTPUT_PROBS, POLICY_FORMAT,
};
use crate::mig::{Geometry, GpuModel, Layout};

/// ONNX Runtime version the fetch script installs and the policy is tested with.
pub const ORT_VERSION: &str = "1.31.1";
/// File name of the runtime library under `.ort/`.
pub const ORT_LIB_NAME: &str = "libonnxruntime.so.1.31.1";
/// Where the packages' fetch step (`/usr/share/smartmig/fetch-onnxruntime`)
/// installs the runtime library on a node; searched last.
pub const INSTALLED_ORT_DIR: &str = "/usr/lib/smartmig";
/// Where the packages install the shipped policies (`policies/` below it).
pub const INSTALLED_DATA_DIR: &str = "/usr/share/smartmig";

/// The text after `policy:`: a file, and optionally `?key=value&...`
/// guard overrides (`policy:p.onnx?max_reconfigurations_per_day=12`).
#[derive(Clone, Debug, PartialEq)]
pub struct LearnedSpec<'a> {
    pub path: &'a Path,
    pub guard: Option<&'a str>,
}

impl<'a> LearnedSpec<'a> {
    /// `serve=MODEL` in the query: run the policy on the GPUs of another
    /// model with the same slice geometry ([`OnnxPolicy::serving`]).
    pub fn serve(&self) -> Option<Result<GpuModel, String>> {
        let value = self
            .guard?
            .split('&')
            .find_map(|pair| pair.strip_prefix("serve="))?;
        Some(
            value
                .parse::<GpuModel>()
                .map_err(|e| format!("serve={value}: {e}")),
        )
    }

    pub fn parse(after_prefix: &'a str) -> LearnedSpec<'a> {
        match after_prefix.rsplit_once('?') {
            Some((path, query)) => LearnedSpec {
                path: Path::new(path),
                guard: Some(query),
            },
            None => LearnedSpec {
                path: Path::new(after_prefix),
                guard: None,
            },
        }
    }
}

impl PolicyMetadata {
    /// Metadata for a network over `spec`.
    pub fn new(spec: &FeatureSpec, hidden: usize) -> Self {
        PolicyMetadata {
            format: POLICY_FORMAT.to_string(),
            gpu_model: spec.model,
            feature_spec_version: FEATURE_SPEC_VERSION,
            obs_dim: spec.obs_dim,
            actions: spec.actions,
            catalog: catalog_pictures(spec.model),
            hidden,
            training: serde_json::Value::Null,
            validation: serde_json::Value::Null,
            guard: policy_file::Guard::default(),
            initial_layout: 0,
        }
    }
}

/// The action space of `model` as stored in metadata.
pub fn catalog_pictures(model: GpuModel) -> Vec<String> {
    let g = Geometry::of(model);
    g.catalog()
        .iter()
        .map(|&l| g.picture(l))
        .chain(std::iter::once("keep".to_string()))
        .collect()
}

/// Why a policy could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PolicyLoadError {
    #[error("ONNX Runtime not found: run scripts/fetch-onnxruntime (installed: /usr/share/smartmig/fetch-onnxruntime) or set ORT_DYLIB_PATH (looked for {})", list(.searched))]
    RuntimeNotFound { searched: Vec<PathBuf> },
    #[error("ONNX Runtime not found: ORT_DYLIB_PATH={} does not exist (run scripts/fetch-onnxruntime or fix ORT_DYLIB_PATH)", .0.display())]
    RuntimeEnvMissing(PathBuf),
    #[error("loading ONNX Runtime from {}: {reason}", path.display())]
    RuntimeLoad { path: PathBuf, reason: String },
    /// The file or its metadata ([`crate::formats::policy_file`]).
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error("policy {}: ONNX Runtime refused the model: {reason}", path.display())]
    Session { path: PathBuf, reason: String },
}

fn list(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where the ONNX Runtime library is, following the order in the module docs.
pub fn find_onnxruntime() -> Result<PathBuf, PolicyLoadError> {
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.exists() {
            Ok(p)
        } else {
            Err(PolicyLoadError::RuntimeEnvMissing(p))
        };
    }
    let mut searched = Vec::new();
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
    }
    if let Some(repo) = source_checkout() {
        roots.push(repo.to_path_buf());
    }
    let candidates = roots
        .into_iter()
        .map(|root| root.join(".ort").join(ORT_LIB_NAME))
        .chain(std::iter::once(
            Path::new(INSTALLED_ORT_DIR).join(ORT_LIB_NAME),
        ));
    for candidate in candidates {
        if candidate.is_file() {
            return Ok(candidate);
        }
        if !searched.contains(&candidate) {
            searched.push(candidate);
        }
    }
    Err(PolicyLoadError::RuntimeNotFound { searched })
}

/// The root of the source checkout this crate was built from
/// (`sidecar/core/../..`), for tests and `cargo run`.
fn source_checkout() -> Option<&'static Path> {
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2)
}

/// The shipped policy for `model` (`policies/<model id>.onnx`), looked up
/// in the working directory, then above the executable, then in the source
/// checkout, then where the packages install it ([`INSTALLED_DATA_DIR`]);
/// `None` when there is none.
pub fn shipped_policy(model: GpuModel) -> Option<PathBuf> {
    shipped_file(&format!("{}.onnx", model.id()))
}

/// The shipped learned placement for `model`
/// (`policies/<model>-placement.onnx`), searched like [`shipped_policy`].
pub fn shipped_placement(model: GpuModel) -> Option<PathBuf> {
    shipped_file(&format!("{}-placement.onnx", model.id()))
}

/// `policies/<name>` in the working directory, beside the executable or
/// above it, in the source checkout, or under [`INSTALLED_DATA_DIR`].
fn shipped_file(name: &str) -> Option<PathBuf> {
    let rel = Path::new("policies").join(name);
    let mut roots: Vec<PathBuf> = vec![PathBuf::from(".")];
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
    }
    if let Some(repo) = source_checkout() {
        roots.push(repo.to_path_buf());
    }
    roots.push(PathBuf::from(INSTALLED_DATA_DIR));
    roots
        .into_iter()
        .map(|r| r.join(&rel))
        .find(|p| p.is_file())
}

/// The process-wide ONNX Runtime environment (the library is loaded once;
/// a failure is remembered and reported again).
pub fn ort_environment() -> Result<ort::environment::Environment, PolicyLoadError> {
    static ENV: OnceLock<Result<ort::environment::Environment, (PathBuf, String)>> =
        OnceLock::new();
    let path = find_onnxruntime()?;
    let result = ENV.get_or_init(|| {
        let builder = ort::init_from(&path).map_err(|e| (path.clone(), e.to_string()))?;
        builder
            .with_name("smartmig")
            .build()
            .map_err(|e| (path.clone(), e.to_string()))
    });
    match result {
        Ok(env) => Ok(env.clone()),
        Err((path, reason)) => Err(PolicyLoadError::RuntimeLoad {
            path: path.clone(),
            reason: reason.clone(),
        }),
    }
}

/// An ONNX Runtime session for a policy file's bytes (repartitioning or
/// placement): one intra-op thread, because the graphs are tiny, thread
/// hand-offs would dominate, and the daemon must not compete with jobs
/// for cores.
pub fn session_from_bytes(path: &Path, bytes: &[u8]) -> Result<Session, PolicyLoadError> {
    let env = ort_environment()?;
    let session_err = |reason: String| PolicyLoadError::Session {
        path: path.to_path_buf(),
        reason,
    };
    Session::builder(&env)
        .map_err(|e| session_err(e.to_string()))?
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(|e| session_err(e.to_string()))?
        .with_intra_threads(1)
        .map_err(|e| session_err(e.to_string()))?
        .commit_from_memory(bytes)
        .map_err(|e| session_err(e.to_string()))
}

/// Reads and checks the embedded metadata of a policy file without loading
/// ONNX Runtime. `expected`: the GPU model it must be for (`None`: any).
pub fn read_metadata(
    path: &Path,
    expected: Option<GpuModel>,
) -> Result<(PolicyMetadata, Vec<u8>), PolicyLoadError> {
    Ok(policy_file::read_checked(path, expected)?)
}

impl CheckedMetadata for PolicyMetadata {
    const KIND: Kind = Kind::Repartitioning;

    fn check(&self, path: &Path, expected: Option<GpuModel>) -> Result<(), MetadataError> {
        check_metadata(path, self, expected)
    }
}

/// The checks of [`load_policy`], on already-read metadata.
pub fn check_metadata(
    path: &Path,
    meta: &PolicyMetadata,
    expected: Option<GpuModel>,
) -> Result<(), MetadataError> {
    // An older spec this build still runs passes as itself; any other is
    // refused against the current one.
    let want_version = if SUPPORTED_FEATURE_SPECS.contains(&meta.feature_spec_version) {
        meta.feature_spec_version
    } else {
        FEATURE_SPEC_VERSION
    };
    check_header(
        path,
        (&meta.format, POLICY_FORMAT),
        (meta.gpu_model, expected),
        (meta.feature_spec_version, want_version),
    )?;
    let path = path.to_path_buf();
    let spec = FeatureSpec::with_version(meta.gpu_model, meta.feature_spec_version);
    let mismatch = |what: String| MetadataError::SpaceMismatch {
        path: path.clone(),
        model: meta.gpu_model,
        what,
    };
    check_space(
        &path,
        meta.gpu_model,
        "policy",
        (meta.obs_dim, meta.actions),
        (spec.obs_dim, spec.actions),
    )?;
    if meta.catalog != catalog_pictures(meta.gpu_model) {
        return Err(mismatch("the layout catalog differs".to_string()));
    }
    Ok(())
}

/// Loads a policy for GPUs of model `expected_model`, refusing one trained
/// for another model or feature spec (the daemon's entry point).
pub fn load_policy(path: &Path, expected_model: GpuModel) -> Result<OnnxPolicy, PolicyLoadError> {
    let (meta, bytes) = read_metadata(path, Some(expected_model))?;
    OnnxPolicy::from_bytes(path, meta, &bytes)
}

/// Loads a policy for whatever model its metadata names (the simulator's
/// `policy:FILE.onnx`; GPUs of other models keep their layouts).
pub fn load_any_policy(path: &Path) -> Result<OnnxPolicy, PolicyLoadError> {
    let (meta, bytes) = read_metadata(path, None)?;
    OnnxPolicy::from_bytes(path, meta, &bytes)
}

/// A trained policy running in ONNX Runtime. See the module docs.
pub struct OnnxPolicy {
    name: String,
    meta: PolicyMetadata,
    session: Session,
    encoder: Encoder,
    /// Output buffer of the last run (probabilities, row-major).
    probs: Vec<f32>,
    /// [`policy_file::Guard::max_reconfigurations_per_day`] at work.
    budget: MoveBudget,
    /// Inference failures (the policy then keeps every layout).
    pub failures: u64,
}

impl std::fmt::Debug for OnnxPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxPolicy")
            .field("name", &self.name)
            .field("meta", &self.meta)
            .finish_non_exhaustive()
    }
}

impl OnnxPolicy {
    fn from_bytes(
        path: &Path,
        meta: PolicyMetadata,
        bytes: &[u8],
    ) -> Result<Self, PolicyLoadError> {
        let session = session_from_bytes(path, bytes)?;
        Ok(OnnxPolicy {
            name: format!("policy:{}", path.display()),
            encoder: Encoder::for_spec(FeatureSpec::with_version(
                meta.gpu_model,
                meta.feature_spec_version,
            )),
            meta,
            session,
            probs: Vec::new(),
            budget: MoveBudget::default(),
            failures: 0,
        })
    }

    pub fn metadata(&self) -> &PolicyMetadata {
        &self.meta
    }

    /// The model whose GPUs the policy acts on: the one it was trained for,
    /// unless [`OnnxPolicy::serving`] moved it.
    pub fn served_model(&self) -> GpuModel {
        self.encoder.spec().model
    }

    /// The same network acting on the GPUs of `model` instead of its own:
    /// allowed when `model` has the policy's slice geometry (the same
    /// catalog of layouts, placements and profile count, so the same
    /// observation and action spaces, e.g. an H100-80GB policy on B200s).
    /// Its features count slices and jobs, not GB, so the question is
    /// whether what it learned carries over: `bench suite --policy
    /// policy:FILE?serve=MODEL` measures it (docs/policy.md).
    pub fn serving(mut self, model: GpuModel) -> Result<OnnxPolicy, PolicyLoadError> {
        if model == self.meta.gpu_model {
            return Ok(self);
        }
        let spec = FeatureSpec::with_version(model, self.meta.feature_spec_version);
        if catalog_pictures(model) != self.meta.catalog
            || (spec.obs_dim, spec.actions) != (self.meta.obs_dim, self.meta.actions)
        {
            return Err(PolicyLoadError::Metadata(MetadataError::SpaceMismatch {
                path: PathBuf::from(self.name.trim_start_matches("policy:")),
                model,
                what: format!(
                    "trained for {}, whose MIG geometry is not {model}'s: a policy serves only models with its slice geometry",
                    self.meta.gpu_model
                ),
            }));
        }
        self.encoder = Encoder::for_spec(spec);
        self.name = format!("{} (serving {model})", self.name);
        Ok(self)
    }

    /// Applies a spec's `?key=value&...` guard overrides ([`LearnedSpec`])
    /// on top of the metadata's guard; the one place the simulator's and
    /// the daemon's `policy:FILE.onnx?...` specs go through.
    pub fn override_guard(&mut self, query: &str) -> Result<(), GuardError> {
        let guard = self.meta.guard.with_overrides(query)?;
        self.meta.guard = guard;
        if guard.is_set() {
            self.name = format!(
                "{} (guard: min_confidence {}, max {} reconfigurations/GPU/day)",
                self.name, guard.min_confidence, guard.max_reconfigurations_per_day
            );
        }
        Ok(())
    }

    /// Whether the guard lets `gpu` move at `now`, given the probability of
    /// the move; records the move when it does.
    fn guard_allows(&mut self, gpu: usize, now: f64, confidence: f32) -> bool {
        let g = self.meta.guard;
        confidence >= g.min_confidence
            && self.budget.allows(gpu, now, g.max_reconfigurations_per_day)
    }

    /// Runs the network on row-major `obs [rows, D]` and `mask [rows, A]`;
    /// returns (masked logits, probabilities), row-major.
    pub fn infer(
        &mut self,
        obs: &[f32],
        mask: &[f32],
        rows: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), ort::Error> {
        let d = self.meta.obs_dim;
        let a = self.meta.actions;
        let obs_t = TensorRef::from_array_view(([rows, d], obs))?;
        let mask_t = TensorRef::from_array_view(([rows, a], mask))?;
        let out = self.session.run(ort::inputs![
            INPUT_OBS => obs_t,
            INPUT_MASK => mask_t,
        ])?;
        let (_, logits) = out[OUTPUT_LOGITS].try_extract_tensor::<f32>()?;
        let (_, probs) = out[OUTPUT_PROBS].try_extract_tensor::<f32>()?;
        Ok((logits.to_vec(), probs.to_vec()))
    }

    /// One batched session run over the encoded GPUs; fills `self.probs`.
    fn run_encoded(&mut self) -> Result<(), ort::Error> {
        let rows = self.encoder.gpus.len();
        let d = self.meta.obs_dim;
        let a = self.meta.actions;
        let obs_t = TensorRef::from_array_view(([rows, d], self.encoder.obs.as_slice()))?;
        let mask_t = TensorRef::from_array_view(([rows, a], self.encoder.mask.as_slice()))?;
        let out = self.session.run(ort::inputs![
            INPUT_MASK => mask_t,
            INPUT_OBS => obs_t,
        ])?;
        let (_, probs) = out[OUTPUT_PROBS].try_extract_tensor::<f32>()?;
        self.probs.clear();
        self.probs.extend_from_slice(probs);
        Ok(())
    }
}

/// Per GPU, the times of its moves in the last 24 h: a sliding-window
/// budget of reconfigurations.
#[derive(Debug, Default)]
struct MoveBudget {
    recent: Vec<std::collections::VecDeque<f64>>,
}

impl MoveBudget {
    /// Whether `gpu` may move at `now` with at most `per_day` moves in any
    /// 24 h (0 = no limit); records the move when it may.
    fn allows(&mut self, gpu: usize, now: f64, per_day: u32) -> bool {
        if per_day == 0 {
            return true;
        }
        if self.recent.len() <= gpu {
            self.recent.resize_with(gpu + 1, Default::default);
        }
        let recent = &mut self.recent[gpu];
        while recent.front().is_some_and(|&t| t <= now - 86_400.0) {
            recent.pop_front();
        }
        if recent.len() >= per_day as usize {
            return false;
        }
        recent.push_back(now);
        true
    }
}

impl RepartitionPolicy for OnnxPolicy {
    fn name(&self) -> String {
        self.name.clone()
    }

    /// The layout the policy was trained to start from (its metadata's
    /// `initial_layout`) on GPUs of its model.
    fn initial_layout(&mut self, _gpu: usize, geometry: &'static Geometry) -> Layout {
        if geometry.model() != self.meta.gpu_model {
            return geometry.whole_gpu();
        }
        geometry
            .catalog()
            .get(self.meta.initial_layout)
            .copied()
            .unwrap_or_else(|| geometry.whole_gpu())
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        self.encoder.encode(view);
        let rows = self.encoder.gpus.len();
        // Nothing to decide when no GPU has a choice besides "keep".
        if rows == 0 || (0..rows).all(|r| self.encoder.choices(r) <= 1) {
            return Vec::new();
        }
        if let Err(e) = self.run_encoded() {
            self.failures += 1;
            if self.failures == 1 {
                tracing::warn!(policy = %self.name, error = %e, "policy inference failed; keeping every layout");
            }
            return Vec::new();
        }
        let a = self.meta.actions;
        let spec = *self.encoder.spec();
        let mut decisions = Vec::new();
        for row in 0..self.encoder.gpus.len() {
            let gpu = self.encoder.gpus[row];
            let probs = &self.probs[row * a..(row + 1) * a];
            let action = argmax_masked(probs, &self.encoder.mask[row * a..(row + 1) * a]);
            if let Some(d) = spec.decode(gpu, &view.gpus[gpu], action) {
                if self.guard_allows(gpu, view.now, probs[action]) {
                    decisions.push(d);
                }
            }
        }
        decisions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_learned_spec_splits_file_and_guard_overrides() {
        let s = LearnedSpec::parse("dir/p.onnx?min_confidence=0.5");
        assert_eq!(s.path, Path::new("dir/p.onnx"));
        assert_eq!(s.guard, Some("min_confidence=0.5"));
        assert_eq!(LearnedSpec::parse("p.onnx").guard, None);
    }

    #[test]
    fn the_move_budget_is_a_sliding_day_per_gpu() {
        let mut b = MoveBudget::default();
        assert!(b.allows(3, 0.0, 2) && b.allows(3, 10.0, 2));
        assert!(!b.allows(3, 20.0, 2), "a third move within a day");
        assert!(b.allows(0, 20.0, 2), "another GPU has its own budget");
        assert!(b.allows(3, 86_400.5, 2), "the first move left the window");
        assert!(!b.allows(3, 86_401.0, 2));
        assert!(
            (0..100).all(|k| b.allows(1, f64::from(k), 0)),
            "0 = no limit"
        );
    }
}
