//! The shipped learned policy as an opponent row: one rule, for
//! `simulate --compare` and the benches (`suite`, `oracle`), of when it
//! joins a table and why it is left out, owned below all of them.

use crate::mig::GpuModel;

/// The shipped learned policy of `model` as a `policy:` spec, when it and
/// ONNX Runtime exist (else says why it is left out).
pub fn shipped_learned(model: GpuModel) -> Option<String> {
    match (
        crate::policy::onnx::shipped_policy(model),
        crate::policy::onnx::find_onnxruntime(),
    ) {
        (Some(p), Ok(_)) => Some(format!("policy:{}", p.display())),
        (Some(p), Err(e)) => {
            eprintln!(
                "smartmig: leaving the learned policy {} out: {e}",
                p.display()
            );
            None
        }
        (None, _) => {
            eprintln!("smartmig: no shipped learned policy for {model}");
            None
        }
    }
}
