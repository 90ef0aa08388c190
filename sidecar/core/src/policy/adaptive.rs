//! `adaptive`: a load-driven split/merge rule with three parameters.
//!
//! Every decision epoch it measures the load of each GPU model as jobs
//! (running plus waiting) per GPU, and keeps `k` of the model's GPUs split
//! into one `split` layout and the others whole, with
//!
//! `k = round(N * clamp((load - threshold) * gain, 0, 1))`.
//!
//! The split GPUs are the lowest-numbered ones (where the engine packs
//! jobs, so where a second instance is used first). A GPU that must change
//! moves as far as its busy instances allow ([`super::step_toward`]), as
//! `twice-daily` does. The rule reacts to the load it sees rather than to
//! the clock, so a light afternoon stays whole and a busy night is split;
//! its parameters are searched on training days (`learn::teacher`) and it is
//! the resting rule of the trainer's teacher.

use super::{step_toward, ClusterView, Decision, RepartitionPolicy};
use crate::mig::{Geometry, GpuModel, Layout};

/// The rule's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adaptive {
    /// Catalog index of the split layout (in each model's own catalog).
    pub split: usize,
    /// Jobs per GPU below which every GPU stays whole.
    pub threshold: f64,
    /// Share of GPUs split per job per GPU above the threshold.
    pub gain: f64,
}

impl Adaptive {
    /// Target layout of every GPU (index = GPU), from the view's load.
    pub fn targets(&self, view: &ClusterView<'_>) -> Vec<Layout> {
        let mut out: Vec<Layout> = view.gpus.iter().map(|s| s.layout).collect();
        for model in GpuModel::ALL {
            let gpus: Vec<usize> = (0..view.gpus.len())
                .filter(|&i| view.gpus[i].model == model)
                .collect();
            if gpus.is_empty() {
                continue;
            }
            let n = gpus.len() as f64;
            let running: usize = gpus.iter().map(|&i| view.gpus[i].busy.len()).sum();
            let waiting = view
                .pending
                .iter()
                .filter(|j| j.shape(model).is_some())
                .count();
            let load = (running as f64 + waiting as f64) / n;
            let share = ((load - self.threshold) * self.gain).clamp(0.0, 1.0);
            let k = (share * n).round() as usize;
            let split = super::search::catalog_layout(model, self.split);
            let whole = Geometry::of(model).whole_gpu();
            for (rank, &i) in gpus.iter().enumerate() {
                out[i] = if rank < k { split } else { whole };
            }
        }
        out
    }
}

impl RepartitionPolicy for Adaptive {
    fn name(&self) -> String {
        format!("adaptive:{}:{}:{}", self.split, self.threshold, self.gain)
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        self.targets(view)
            .into_iter()
            .enumerate()
            .filter_map(|(gpu, target)| {
                step_toward(&view.gpus[gpu], target).map(|target| Decision { gpu, target })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::Shape;
    use crate::policy::{GpuStatus, PendingByProfile, PendingJob, MODEL_COUNT};
    use crate::workload::SpeedupCurve;

    const M: GpuModel = GpuModel::A100_40gb;

    fn waiting(n: usize) -> Vec<PendingJob> {
        let mut shapes = [None; MODEL_COUNT];
        shapes[M as usize] = Some(Shape {
            compute: 1,
            memory: 1,
        });
        (0..n as u64)
            .map(|id| PendingJob {
                id,
                arrival: 0.0,
                deadline: 100.0,
                work: 10.0,
                memory_gb: 4.0,
                min_compute: 1,
                speedup: SpeedupCurve::new(0.5, 0.5).unwrap(),
                shapes,
            })
            .collect()
    }

    #[test]
    fn splits_the_lowest_gpus_in_proportion_to_the_load() {
        let g = Geometry::of(M);
        let gpus = vec![GpuStatus::new(M, g.whole_gpu()); 4];
        let counts = PendingByProfile::default();
        let rule = Adaptive {
            split: 1,
            threshold: 1.0,
            gain: 0.5,
        };
        let split = g.catalog()[1];
        for (jobs, k) in [(0, 0), (4, 0), (8, 2), (12, 4), (40, 4)] {
            let pending = waiting(jobs);
            let view = ClusterView {
                now: 0.0,
                hour_of_day: 0.0,
                gpus: &gpus,
                pending: &pending,
                pending_by_profile: &counts,
                arrivals: &[],
            };
            let t = rule.targets(&view);
            let want: Vec<Layout> = (0..4)
                .map(|i| if i < k { split } else { g.whole_gpu() })
                .collect();
            assert_eq!(t, want, "{jobs} waiting jobs");
            let decisions = rule.clone().decide(&view);
            assert_eq!(decisions.len(), k, "{jobs} waiting jobs");
            assert!(decisions.iter().all(|d| d.gpu < k && d.target == split));
        }
    }
}
