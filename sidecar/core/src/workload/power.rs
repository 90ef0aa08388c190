//! GPU power as a function of MIG load.
//!
//! No hardware reports power per MIG instance; only the whole board's draw is
//! measurable. So the model is per GPU: an idle floor plus a concave function
//! of how much of the GPU is busy. Concave because the first busy slice lifts
//! the shared parts of the board (clocks, memory controllers, HBM) out of
//! their idle states, while each further slice only adds its own SMs. A
//! concave curve rewards consolidation (two half-loaded GPUs draw more than
//! one full GPU and one idle one), which is the effect dynamic partitioning
//! exploits.
//!
//! ## The definition of `load` (shared by the simulator and the bounds)
//!
//! For one GPU at one instant:
//!
//! ```text
//! load = sum over RUNNING jobs j on the GPU of  compute_slices(instance of j) / total_compute_slices
//! ```
//!
//! i.e. each running job counts its instance's share of the compute slices at
//! a utilisation of 1. Instances that exist but run no job count 0 (an empty
//! instance draws no more than idle in this model). Since instances never
//! share compute slices, `0 <= load <= 1`. Use [`gpu_load`] to compute it.

use serde::{Deserialize, Serialize};

use super::WorkloadError;
use crate::mig::GpuModel;

/// `power_w(load) = idle_w + (max_w - idle_w) * load ^ exponent`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PowerModel {
    /// Draw of a GPU in MIG mode with nothing running, W.
    pub idle_w: f64,
    /// Draw with every compute slice busy (board power cap), W.
    pub max_w: f64,
    /// Concavity in (0, 1]: 1 = linear in load, smaller = the first slices cost more.
    pub exponent: f64,
}

/// Default concavity for every model. An assumption: no per-slice power
/// measurement exists (see the module docs); energy results should be
/// checked for sensitivity at 0.5 and 1.0.
pub const DEFAULT_EXPONENT: f64 = 0.7;

impl PowerModel {
    /// Documented defaults per model (see `docs/workload.md` for sources):
    ///
    /// | model | idle W | max W | source |
    /// |---|---|---|---|
    /// | A30-24GB | 21 | 165 | cap: A30 datasheet (165 W); idle: assumed 12.5 % of cap, the A100 ratio |
    /// | A100-40GB, A100-80GB | 50 | 400 | cap: A100-SXM4 (PCIe is 250/300 W); idle: brief sec. 5, A100/A800 46-60 W |
    /// | H100-80GB | 141 | 700 | cap: H100-SXM5; idle: brief sec. 5, H100 in MIG mode at little load ~141 W |
    /// | H100-94GB (NVL) | 81 | 400 | cap: H100 NVL; idle: assumed the H100-SXM ratio 141/700 |
    /// | H200-141GB | 141 | 700 | cap: H200 SXM; idle: assumed as H100-SXM |
    /// | B200-180GB | 201 | 1000 | cap: HGX B200, up to 1 kW per GPU (second-hand: NVIDIA's DGX B200 guide as quoted by others, a cloud's HGX B200 sheet); idle: assumed the H100-SXM ratio 141/700 |
    /// | GB200-186GB | 242 | 1200 | cap: the GB200 variant at 1,200 W (second-hand); idle: the same ratio |
    /// | B300-288GB | 282 | 1400 | cap: Blackwell Ultra 1,400 W (second-hand; HGX boards may be set lower); idle: the same ratio |
    /// | GB300-288GB | 282 | 1400 | cap: Blackwell Ultra 1,400 W (second-hand); idle: the same ratio |
    /// | RTX PRO 6000 Blackwell | 121 | 600 | cap: 600 W, Workstation and Server Edition (second-hand; the Max-Q edition is 300 W); idle: the same ratio |
    /// | RTX PRO 5000 Blackwell | 60 | 300 | cap: assumed 300 W (not found in the sources read); idle: the same ratio |
    ///
    /// Every Blackwell figure is second-hand or assumed: set `[power]` in
    /// the simulation config from a site's own measurements.
    pub fn default_for(model: GpuModel) -> Self {
        let (idle_w, max_w) = match model {
            GpuModel::A30_24gb => (21.0, 165.0),
            GpuModel::A100_40gb | GpuModel::A100_80gb => (50.0, 400.0),
            GpuModel::H100_80gb => (141.0, 700.0),
            GpuModel::H100_94gb => (81.0, 400.0),
            GpuModel::H200_141gb => (141.0, 700.0),
            GpuModel::B200_180gb => (201.0, 1000.0),
            GpuModel::Gb200_186gb => (242.0, 1200.0),
            GpuModel::B300_288gb | GpuModel::Gb300_288gb => (282.0, 1400.0),
            GpuModel::RtxPro6000_96gb => (121.0, 600.0),
            GpuModel::RtxPro5000_48gb => (60.0, 300.0),
        };
        PowerModel {
            idle_w,
            max_w,
            exponent: DEFAULT_EXPONENT,
        }
    }

    /// `0 <= idle_w < max_w`, both finite; `0 < exponent <= 1` (concave).
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if !(self.idle_w.is_finite() && self.idle_w >= 0.0) {
            return Err(WorkloadError::invalid(
                "power.idle_w",
                format!("{} is not a finite value >= 0", self.idle_w),
            ));
        }
        if !(self.max_w.is_finite() && self.max_w > self.idle_w) {
            return Err(WorkloadError::invalid(
                "power.max_w",
                format!(
                    "{} is not finite and > idle_w ({})",
                    self.max_w, self.idle_w
                ),
            ));
        }
        if !(self.exponent.is_finite() && self.exponent > 0.0 && self.exponent <= 1.0) {
            return Err(WorkloadError::invalid(
                "power.exponent",
                format!(
                    "{} is not in (0, 1] (the model must be concave)",
                    self.exponent
                ),
            ));
        }
        Ok(())
    }

    /// Instantaneous power in W at `load` (see the module docs for its
    /// definition). `load` is clamped to [0, 1]: rounding in a sum of
    /// fractions may overshoot 1 by an ulp. A NaN load gives idle power.
    #[inline]
    pub fn power_w(&self, load: f64) -> f64 {
        debug_assert!(
            load.is_nan() || (-1e-9..=1.0 + 1e-9).contains(&load),
            "load {load}"
        );
        let l = if load.is_nan() {
            0.0
        } else {
            load.clamp(0.0, 1.0)
        };
        if l == 0.0 {
            return self.idle_w;
        }
        self.idle_w + (self.max_w - self.idle_w) * l.powf(self.exponent)
    }

    /// Energy in J of a GPU held at `load` for `seconds`.
    #[inline]
    pub fn energy_j(&self, load: f64, seconds: f64) -> f64 {
        self.power_w(load) * seconds
    }
}

/// The `load` of one GPU: the summed compute slices of the instances that run
/// a job, over the GPU's compute slices (utilisation 1 per running job).
pub fn gpu_load<I: IntoIterator<Item = u8>>(busy_instance_slices: I, total_compute: u8) -> f64 {
    let busy: u32 = busy_instance_slices.into_iter().map(u32::from).sum();
    (f64::from(busy) / f64::from(total_compute.max(1))).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn defaults_are_valid_and_hit_the_endpoints() {
        for m in GpuModel::ALL {
            let p = PowerModel::default_for(m);
            p.validate().unwrap();
            assert_eq!(p.power_w(0.0), p.idle_w);
            assert!((p.power_w(1.0) - p.max_w).abs() < 1e-9);
        }
        let a100 = PowerModel::default_for(GpuModel::A100_40gb);
        assert_eq!((a100.idle_w, a100.max_w), (50.0, 400.0));
        // Hand check: 50 + 350 * 0.5^0.7 = 265.45 W at half load.
        assert!((a100.power_w(0.5) - 265.45).abs() < 0.01);
    }

    #[test]
    fn concavity_rewards_consolidation() {
        let p = PowerModel::default_for(GpuModel::H100_80gb);
        // One GPU at 4/7 and one idle draw less than two at 2/7.
        let packed = p.power_w(gpu_load([4], 7)) + p.power_w(0.0);
        let spread = 2.0 * p.power_w(gpu_load([2], 7));
        assert!(packed < spread, "{packed} vs {spread}");
    }

    #[test]
    fn validation_errors() {
        let ok = PowerModel::default_for(GpuModel::A100_40gb);
        for (bad, field) in [
            (PowerModel { idle_w: -1.0, ..ok }, "idle_w"),
            (PowerModel { max_w: 40.0, ..ok }, "max_w"),
            (
                PowerModel {
                    exponent: 1.5,
                    ..ok
                },
                "exponent",
            ),
            (
                PowerModel {
                    exponent: 0.0,
                    ..ok
                },
                "exponent",
            ),
            (
                PowerModel {
                    max_w: f64::INFINITY,
                    ..ok
                },
                "max_w",
            ),
        ] {
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        let parsed: Result<PowerModel, _> =
            toml::from_str("idle_w = 1\nmax_w = 2\nexponent = 1\nwatts = 3");
        assert!(parsed.is_err(), "unknown fields are rejected");
    }

    #[test]
    fn load_definition() {
        assert_eq!(gpu_load([], 7), 0.0);
        assert_eq!(gpu_load([3, 4], 7), 1.0);
        assert_eq!(gpu_load([2], 4), 0.5);
    }

    proptest! {
        #[test]
        fn monotone_and_concave(idle in 0.0f64..200.0, span in 1.0f64..600.0, e in 0.05f64..=1.0,
                                a in 0.0f64..=1.0, b in 0.0f64..=1.0) {
            let p = PowerModel { idle_w: idle, max_w: idle + span, exponent: e };
            prop_assert!(p.validate().is_ok());
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(p.power_w(lo) <= p.power_w(hi) + 1e-9);
            prop_assert!(p.power_w(hi) <= p.max_w + 1e-9 && p.power_w(lo) >= p.idle_w);
            // Midpoint concavity.
            let mid = p.power_w((lo + hi) / 2.0);
            prop_assert!(mid + 1e-9 >= (p.power_w(lo) + p.power_w(hi)) / 2.0);
        }
    }
}
