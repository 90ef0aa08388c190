//! The two fixed policies: `none` (MIG off in effect) and `static` (one
//! admin-chosen layout forever). They are the references every dynamic
//! policy is measured against, and they never reconfigure.

use std::collections::BTreeMap;

use super::{layout_or_whole, ClusterView, Decision, RepartitionPolicy};
use crate::mig::{Geometry, GpuModel, Layout};

/// Why a `--policy` value was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyParseError {
    #[error("unknown policy `{0}` (known: none, static:<catalog index>, static:<picture>, static:<N>x<layout>+<M>x<layout>..., twice:<hour>=<layout>/<hour>=<layout>, greedy, greedy:window=<s>,init=<index>, rolling-fit, rolling-fit:period=<s>&window=<s>&margin=<x>, e.g. static:0 or static:4444|3333)")]
    Unknown(String),
    #[error("static layout `{given}`: catalog index {index} is out of range for {model} (its catalog has {len} layouts; see `smartmig layouts --catalog --gpu {model}`)")]
    IndexOutOfRange {
        given: String,
        index: usize,
        len: usize,
        model: GpuModel,
    },
    #[error("static mix `{given}`: `{part}` is not `N x LAYOUT` with N >= 1 GPUs and LAYOUT a catalog index or a picture (e.g. `static:7x1|1|22|3333+1x0`)")]
    BadMix { given: String, part: String },
    #[error("static layout `{given}` is not a valid {model} layout picture (e.g. `4444|3333`, `2|2|2|1|.`; see `smartmig layouts --gpu {model}`)")]
    BadPicture { given: String, model: GpuModel },
    #[error("twice-daily schedule `{given}`: {why} (e.g. `twice:8=1|1|22|3333/20=4444|3333`: from 08 h every GPU 1|1|22|3333, from 20 h 4444|3333)")]
    BadTwice { given: String, why: String },
    #[error(
        "`{0}` needs the cluster's GPUs: `smartmig simulate`, `compare` and `bench sim` take it"
    )]
    NeedsCluster(String),
    #[error(transparent)]
    Greedy(#[from] super::greedy::GreedyParseError),
    #[error(transparent)]
    PerNode(#[from] super::nodes::NodesError),
    #[error(transparent)]
    Rolling(#[from] super::rolling::RollingParseError),
    #[error("`{0}` is searched on days of a workload: run `smartmig simulate --compare` or `smartmig bench suite` (they print the assignment the search chose; pass it back as static:<N>x<layout>+...)")]
    NeedsWorkload(String),
    /// A `policy:FILE.onnx` that could not be loaded (the message of
    /// [`super::onnx::PolicyLoadError`], which says why and what to do).
    #[error("`{spec}`: {reason}")]
    Learned { spec: String, reason: String },
}

/// No repartitioning, every instance made on demand: what smartmigd does
/// with `policy = "none"` (each job's instance is created, reused or made
/// by re-shaping idle ones when it starts). Both engines serve it on
/// demand (the central one since issue 54; the Slurm-like mode,
/// [`crate::sim::SlurmLike`], places by shards first): smartmigd's
/// on-demand allocation alone, the baseline of the real-Slurm busy mix.
#[derive(Clone, Copy, Debug, Default)]
pub struct OnDemand;

impl RepartitionPolicy for OnDemand {
    fn name(&self) -> String {
        "on-demand".to_string()
    }

    fn describe(&self) -> String {
        "smartmigd's allocate alone: no repartitioning, each job's instance built (or re-shaped from idle ones) when it starts, from whole GPUs".to_string()
    }

    fn installs_initial_layout(&self) -> bool {
        false
    }

    fn decide(&mut self, _view: &ClusterView<'_>) -> Vec<Decision> {
        Vec::new()
    }
}

/// Fixed layouts as smartmigd runs them (`policy = "static:..."` in
/// smartmig.toml): installed when the day starts and never moved by the
/// policy, while each job reaches its instance through shards and
/// smartmigd's allocate (reuse, lend, create, re-shape: `mig::serve`), whose
/// builds may change them. This is what the do-no-harm fallback tells a
/// site to install; the `static-hist` *opponent* is the same layouts under
/// Slurm's own typed GRES with no smartmigd ([`StaticLayout`],
/// [`crate::policy::search::StaticMix`]), and the two score differently.
#[derive(Clone, Debug)]
pub struct StaticThroughSmartmigd {
    /// The row's name for the layouts (`static-hist`).
    pub label: String,
    /// One per GPU; a missing or invalid one is a whole GPU.
    pub layouts: Vec<Layout>,
}

impl RepartitionPolicy for StaticThroughSmartmigd {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn describe(&self) -> String {
        format!(
            "{}: the fixed layouts installed by smartmigd (`policy = \"static:...\"`), each job served through shards on demand",
            self.label
        )
    }

    fn initial_layout(&mut self, gpu: usize, geometry: &'static Geometry) -> Layout {
        layout_or_whole(&self.layouts, gpu, geometry)
    }

    fn decide(&mut self, _view: &ClusterView<'_>) -> Vec<Decision> {
        Vec::new()
    }
}

/// Fixed layouts, installed before time 0 and never changed (today's Slurm
/// practice): one layout on every GPU (`static:4444|3333`, `static:1`), or
/// a mix in GPU order (`static:7x1|1|22|3333+1x0`: the first seven GPUs
/// `1|1|22|3333`, the eighth catalog layout 0, the whole GPU), which is how
/// the searched baselines print the assignment they chose, so it can be
/// replayed. GPUs past a mix's count are whole GPUs.
#[derive(Clone, Debug)]
pub struct StaticLayout {
    spec: String,
    /// `(GPUs, layout per model)` in GPU order; `None` GPUs: all the rest.
    segments: Vec<(Option<usize>, BTreeMap<GpuModel, Layout>)>,
}

impl StaticLayout {
    /// Resolves `spec` on every model in `models`: a catalog index such as
    /// `3` or a picture such as `4444|3333` (as printed by `smartmig
    /// layouts`), or a mix `N x SPEC + M x SPEC ...` of those. A picture
    /// must be a valid layout of each model; an index refers to each
    /// model's own catalog.
    pub fn parse(spec: &str, models: &[GpuModel]) -> Result<Self, PolicyParseError> {
        let spec = spec.trim();
        let mut segments = Vec::new();
        if spec.contains('x') {
            for part in spec.split('+') {
                let bad = || PolicyParseError::BadMix {
                    given: spec.to_string(),
                    part: part.trim().to_string(),
                };
                let (count, layout) = part.split_once('x').ok_or_else(bad)?;
                let count: usize = count.trim().parse().map_err(|_| bad())?;
                if count == 0 {
                    return Err(bad());
                }
                segments.push((Some(count), Self::resolve(layout.trim(), models)?));
            }
        } else {
            segments.push((None, Self::resolve(spec, models)?));
        }
        Ok(StaticLayout {
            spec: spec.to_string(),
            segments,
        })
    }

    /// One catalog index or picture on every model.
    fn resolve(
        spec: &str,
        models: &[GpuModel],
    ) -> Result<BTreeMap<GpuModel, Layout>, PolicyParseError> {
        let mut layouts = BTreeMap::new();
        for &model in models {
            let g = Geometry::of(model);
            // A picture first: the whole GPU's (`77777777`) is all digits.
            let picture = g.layouts().iter().copied().find(|&l| g.picture(l) == spec);
            let layout =
                match (picture, spec.parse::<usize>()) {
                    (Some(l), _) => l,
                    (None, Ok(index)) => *g.catalog().get(index).ok_or_else(|| {
                        PolicyParseError::IndexOutOfRange {
                            given: spec.to_string(),
                            index,
                            len: g.catalog().len(),
                            model,
                        }
                    })?,
                    (None, Err(_)) => {
                        return Err(PolicyParseError::BadPicture {
                            given: spec.to_string(),
                            model,
                        })
                    }
                };
            layouts.insert(model, layout);
        }
        Ok(layouts)
    }

    /// The layout of the first GPUs on `model` (whole GPU for a model not
    /// given to `parse`).
    pub fn layout(&self, model: GpuModel) -> Layout {
        self.layout_of(0, model)
    }

    /// The layout of GPU `gpu` (of `model`).
    pub fn layout_of(&self, gpu: usize, model: GpuModel) -> Layout {
        let mut first = 0;
        for (count, layouts) in &self.segments {
            if count.is_none_or(|n| gpu < first + n) {
                if let Some(&l) = layouts.get(&model) {
                    return l;
                }
                break;
            }
            first += count.unwrap_or(0);
        }
        Geometry::of(model).whole_gpu()
    }
}

impl RepartitionPolicy for StaticLayout {
    fn name(&self) -> String {
        format!("static:{}", self.spec)
    }

    fn initial_layout(&mut self, gpu: usize, geometry: &'static Geometry) -> Layout {
        self.layout_of(gpu, geometry.model())
    }

    fn decide(&mut self, _view: &ClusterView<'_>) -> Vec<Decision> {
        Vec::new()
    }

    /// A fixed layout is what a site runs with Slurm's typed MIG GRES.
    fn served_through_shards(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::parse_policy;

    #[test]
    fn parses_indices_and_pictures() {
        let m = [GpuModel::A100_40gb];
        let g = Geometry::of(GpuModel::A100_40gb);
        let p = StaticLayout::parse("0", &m).unwrap();
        assert_eq!(p.layout(GpuModel::A100_40gb), g.whole_gpu());
        let p = StaticLayout::parse("77777777", &m).unwrap();
        assert_eq!(p.layout(GpuModel::A100_40gb), g.whole_gpu());
        let p = StaticLayout::parse("4444|3333", &m).unwrap();
        assert_eq!(g.picture(p.layout(GpuModel::A100_40gb)), "4444|3333");
        assert!(matches!(
            StaticLayout::parse("99", &m),
            Err(PolicyParseError::IndexOutOfRange { .. })
        ));
        assert!(matches!(
            StaticLayout::parse("4444|4444", &m),
            Err(PolicyParseError::BadPicture { .. })
        ));
        assert!(parse_policy("none", &m).is_ok());
        // A mix in GPU order, as the searches print it; the rest whole.
        let mut p = StaticLayout::parse("2x 1|1|22|3333 + 1x4444|3333", &m).unwrap();
        let pics: Vec<String> = (0..4).map(|i| g.picture(p.initial_layout(i, g))).collect();
        assert_eq!(
            pics,
            ["1|1|22|3333", "1|1|22|3333", "4444|3333", "77777777"]
        );
        for bad in ["0x1", "x1", "2x", "2x4444|4444", "ax1", "2x1+"] {
            assert!(StaticLayout::parse(bad, &m).is_err(), "{bad}");
        }
        let e = parse_policy("static:2x1+zx2", &m)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("`zx2`"), "{e}");
        assert_eq!(parse_policy("static:1", &m).unwrap().name(), "static:1");
        let err = parse_policy("greedy-ish", &m).err().unwrap();
        assert!(err.to_string().contains("unknown policy"), "{err}");
    }
}
