//! A policy that begins the day from given layouts (for example the static
//! layout fitted on past days) instead of its own initial layout, then
//! decides as usual. A learned policy trained from whole GPUs starts every
//! day unpartitioned, and on days whose work arrives at once (batch) the
//! jobs are placed before it can move (docs/policy.md, issue 39).

use super::{layout_or_whole, ClusterView, Decision, RepartitionPolicy};
use crate::mig::{Geometry, Layout};

/// `inner`, started from `layouts` (one per GPU; a missing or invalid one
/// is a whole GPU), under `inner`'s name.
pub struct StartingFrom<P> {
    pub inner: P,
    pub layouts: Vec<Layout>,
}

impl<P: RepartitionPolicy> RepartitionPolicy for StartingFrom<P> {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn describe(&self) -> String {
        format!(
            "{}, each day started from the static-hist layout (fitted on past days)",
            self.inner.describe()
        )
    }

    fn initial_layout(&mut self, gpu: usize, geometry: &'static Geometry) -> Layout {
        layout_or_whole(&self.layouts, gpu, geometry)
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        self.inner.decide(view)
    }

    fn served_through_shards(&self) -> bool {
        self.inner.served_through_shards()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::GpuModel;
    use crate::policy::{GpuStatus, PendingByProfile};

    /// Asks for one fixed target on GPU 0 and counts its calls.
    struct Fixed {
        target: Layout,
        calls: usize,
    }

    impl RepartitionPolicy for Fixed {
        fn name(&self) -> String {
            "fixed".into()
        }
        fn decide(&mut self, _view: &ClusterView<'_>) -> Vec<Decision> {
            self.calls += 1;
            vec![Decision {
                gpu: 0,
                target: self.target,
            }]
        }
        fn served_through_shards(&self) -> bool {
            false
        }
    }

    #[test]
    fn starts_from_the_given_layouts_then_decides_as_the_inner_policy() {
        let g = Geometry::of(GpuModel::A100_40gb);
        let split = g.catalog()[g.catalog().len() - 1];
        assert_ne!(split, g.whole_gpu(), "the catalog's last layout is a split");
        let mut p = StartingFrom {
            inner: Fixed {
                target: split,
                calls: 0,
            },
            // GPU 1's layout is not a valid A100 layout; GPU 2 has none.
            layouts: vec![split, Layout(u32::MAX)],
        };
        assert_eq!(p.initial_layout(0, g), split);
        assert_eq!(p.initial_layout(1, g), g.whole_gpu());
        assert_eq!(p.initial_layout(2, g), g.whole_gpu());
        assert!(p.installs_initial_layout());
        assert!(!p.served_through_shards());
        assert_eq!(p.name(), "fixed");

        let gpus = vec![GpuStatus::new(GpuModel::A100_40gb, g.whole_gpu())];
        let view = ClusterView {
            now: 0.0,
            hour_of_day: 0.0,
            gpus: &gpus,
            pending: &[],
            pending_by_profile: &PendingByProfile::default(),
            arrivals: &[],
        };
        assert_eq!(
            p.decide(&view),
            vec![Decision {
                gpu: 0,
                target: split
            }]
        );
        assert_eq!(p.inner.calls, 1);
    }
}
