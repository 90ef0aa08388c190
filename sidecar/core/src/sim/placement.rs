//! What `--placement` names: a rule-based heuristic (`edf`, `eft`, ...) or
//! a learned placement file (`learned:FILE.onnx`), and building a fresh
//! instance of it for one run.

use std::path::PathBuf;
use std::str::FromStr;

use crate::mig::GpuModel;
use crate::policy::onnx::PolicyLoadError;

use super::deferral::{DeferSpec, DeferSpecError};
use super::heuristics::{Heuristic, PlacementHeuristic, UnknownHeuristic};
use super::placement_onnx::OnnxPlacement;

/// A job placement as given on the command line or in a config.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PlacementSpec {
    Rule(Heuristic),
    /// `<heuristic>+defer-late[:K]` or `<heuristic>+rescue[:R]`
    /// ([`super::deferral`]): a rule that defers, not one of the seven.
    Deferring(DeferSpec),
    /// `learned:FILE.onnx`.
    Learned(PathBuf),
}

/// Why a `--placement` value is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementSpecError {
    #[error(transparent)]
    Unknown(#[from] UnknownHeuristic),
    #[error("`learned:` needs a file: `learned:FILE.onnx`")]
    NoFile,
    #[error(transparent)]
    Deferring(#[from] DeferSpecError),
}

impl FromStr for PlacementSpec {
    type Err = PlacementSpecError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().strip_prefix("learned:") {
            Some("") => Err(PlacementSpecError::NoFile),
            Some(path) => Ok(PlacementSpec::Learned(PathBuf::from(path))),
            None if s.contains('+') => Ok(PlacementSpec::Deferring(s.parse()?)),
            None => Ok(PlacementSpec::Rule(s.parse()?)),
        }
    }
}

impl std::fmt::Display for PlacementSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlacementSpec::Rule(h) => write!(f, "{h}"),
            PlacementSpec::Deferring(d) => write!(f, "{d}"),
            PlacementSpec::Learned(p) => write!(f, "learned:{}", p.display()),
        }
    }
}

impl From<Heuristic> for PlacementSpec {
    fn from(h: Heuristic) -> Self {
        PlacementSpec::Rule(h)
    }
}

impl PlacementSpec {
    /// A fresh instance for one run (`seed` only matters for `random`).
    /// A learned file is loaded and checked each time; `model`: the GPU
    /// model it must be for (`None`: whatever it names).
    pub fn build(
        &self,
        seed: u64,
        model: Option<GpuModel>,
    ) -> Result<Box<dyn PlacementHeuristic + Send>, PolicyLoadError> {
        match self {
            PlacementSpec::Rule(h) => Ok(h.build(seed)),
            PlacementSpec::Deferring(d) => Ok(d.build(seed)),
            PlacementSpec::Learned(path) => Ok(Box::new(OnnxPlacement::load(path, model)?)),
        }
    }

    /// The heuristic, if this is one.
    pub fn rule(&self) -> Option<Heuristic> {
        match self {
            PlacementSpec::Rule(h) => Some(*h),
            PlacementSpec::Deferring(_) | PlacementSpec::Learned(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print_back() {
        for s in [
            "edf",
            "largest-first",
            "learned:policies/a100-40gb-placement.onnx",
        ] {
            assert_eq!(s.parse::<PlacementSpec>().unwrap().to_string(), s);
        }
        assert_eq!(
            "learned:".parse::<PlacementSpec>(),
            Err(PlacementSpecError::NoFile)
        );
        let e = "fifo".parse::<PlacementSpec>().unwrap_err().to_string();
        assert!(e.contains("unknown placement heuristic `fifo`"), "{e}");
        let missing = "learned:/nonexistent.onnx"
            .parse::<PlacementSpec>()
            .unwrap()
            .build(0, None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(missing.contains("/nonexistent.onnx"), "{missing}");
    }
}
