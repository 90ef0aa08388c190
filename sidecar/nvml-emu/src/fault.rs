//! Injected faults: the driver answers a chosen call with a chosen error.
//!
//! The state keeps a list; every exported call consults it
//! ([`crate::state::State::take_fault`]; this module only defines the
//! faults, so it imports nothing of the state) before doing
//! anything. The first fault naming the call (and the call's GPU, when the
//! fault names one) decides: while its `skip` is above zero the call passes
//! and `skip` goes down; then it fires `times` times (each time with
//! probability `probability`, drawn from the state's seeded generator) and
//! is removed. `after` makes the call do its work first and fail anyway,
//! like a driver that times out on a create that did happen.

use serde::{Deserialize, Serialize};

/// One injected fault (see the module doc).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fault {
    /// The NVML function, e.g. `nvmlDeviceCreateGpuInstanceWithPlacement`.
    pub call: String,
    /// Only calls on this GPU (index); `None`: any call.
    pub gpu: Option<u32>,
    /// Matching calls that pass before the fault fires.
    pub skip: u32,
    /// How many times it fires.
    pub times: u32,
    /// The NVML return code (`nvmlReturn_enum_NVML_*`); `NVML_SUCCESS`
    /// with a delay makes a slow call that succeeds.
    pub error: u32,
    /// Perform the operation, then return the error.
    pub after: bool,
    /// Sleep this long (outside the lock) before returning.
    pub delay_ms: u64,
    /// Fire with this probability only (a call that draws no error passes).
    pub probability: Option<f64>,
}

impl Fault {
    /// Fails the next call of `call` with `error`, before doing anything.
    pub fn new(call: &str, error: u32) -> Fault {
        Fault {
            call: call.to_string(),
            gpu: None,
            skip: 0,
            times: 1,
            error,
            after: false,
            delay_ms: 0,
            probability: None,
        }
    }
}

/// What a fired fault asks of the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fired {
    pub error: u32,
    pub after: bool,
    pub delay_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::State;
    use smartmig_mig::GpuModel;

    fn state() -> State {
        State::new(&[(GpuModel::A100_40gb, true, true)])
    }

    #[test]
    fn skips_then_fires_then_goes() {
        let mut s = state();
        s.faults.push(Fault {
            skip: 1,
            times: 2,
            ..Fault::new("nvmlX", 10)
        });
        assert_eq!(s.take_fault("nvmlY", None), None);
        assert_eq!(s.take_fault("nvmlX", None), None);
        assert_eq!(s.take_fault("nvmlX", None).map(|f| f.error), Some(10));
        assert_eq!(s.take_fault("nvmlX", None).map(|f| f.error), Some(10));
        assert_eq!(s.take_fault("nvmlX", None), None);
        assert!(s.faults.is_empty());
    }

    #[test]
    fn a_gpu_fault_ignores_other_gpus() {
        let mut s = state();
        s.faults.push(Fault {
            gpu: Some(1),
            ..Fault::new("nvmlX", 3)
        });
        assert_eq!(s.take_fault("nvmlX", Some(0)), None);
        assert_eq!(s.take_fault("nvmlX", None), None);
        assert!(s.take_fault("nvmlX", Some(1)).is_some());
    }

    #[test]
    fn random_faults_fire_about_as_often_as_asked() {
        let mut s = state();
        s.faults.push(Fault {
            times: u32::MAX,
            probability: Some(0.25),
            ..Fault::new("nvmlX", 999)
        });
        let fired = (0..4000)
            .filter(|_| s.take_fault("nvmlX", None).is_some())
            .count();
        assert!((800..1200).contains(&fired), "{fired}");
    }
}
