//! The policy checks: the config's `policy` builds for this node's GPU
//! models exactly as smartmigd builds it (`policy_choice::build`); for a
//! learned policy (`policy:FILE.onnx`) also whether ONNX Runtime is found
//! by the same lookup (`ORT_DYLIB_PATH`, then `.ort/` above the
//! executable), since without it smartmigd falls back to `greedy`.

use super::{Check, Context};
use crate::daemon::policy_choice;
use crate::mig::GpuModel;
use crate::policy::onnx::find_onnxruntime;

pub fn check(ctx: &Context) -> Vec<Check> {
    let Some(config) = ctx.config else {
        return vec![Check::skipped(
            "policy",
            "the config did not load",
            "fix the config first",
        )];
    };
    let spec = config.policy.trim();
    let mut out = Vec::new();
    let learned = spec.starts_with("policy:");
    if learned {
        out.push(match find_onnxruntime() {
            Ok(p) => Check::ok("policy.runtime", format!("ONNX Runtime: {}", p.display())),
            Err(e) => Check::warn(
                "policy.runtime",
                format!("{e}; smartmigd runs `greedy` instead of the learned policy"),
                "install ONNX Runtime (scripts/fetch-onnxruntime) or set ORT_DYLIB_PATH in smartmigd's environment",
            ),
        });
    }
    let Some(gpus) = ctx.gpus.as_deref() else {
        out.push(Check::skipped(
            "policy",
            format!("`{spec}`: the node's GPU models are unknown"),
            "fix the GPU checks above",
        ));
        return out;
    };
    let models: Vec<GpuModel> = gpus.iter().map(|g| g.model).collect();
    out.push(verdict(
        spec,
        learned,
        &models,
        policy_choice::build(spec, &models).map(|(_, name)| name),
    ));
    out
}

/// What smartmigd would run, as a check.
pub fn verdict(
    spec: &str,
    learned: bool,
    models: &[GpuModel],
    built: Result<String, policy_choice::PolicyChoiceError>,
) -> Check {
    let ids: Vec<&str> = GpuModel::distinct(models)
        .into_iter()
        .map(GpuModel::id)
        .collect();
    match built {
        Ok(name) if name.starts_with("greedy (fallback") => Check::warn(
            "policy",
            format!(
                "`{spec}` cannot run here (file or ONNX Runtime missing): smartmigd runs {name}"
            ),
            "install the policy file and ONNX Runtime, or set policy = \"greedy\" to say so",
        ),
        Ok(name) if learned => Check::ok(
            "policy",
            format!(
                "`{spec}` loads for {}: smartmigd runs {name}",
                ids.join(", ")
            ),
        ),
        Ok(name) => Check::ok("policy", format!("`{spec}`: smartmigd runs {name}")),
        Err(e) => Check::fail(
            "policy",
            format!("`{spec}` is refused for {}: {e}", ids.join(", ")),
            "use a policy trained for this GPU model, or a built-in one (none, greedy, static:...)",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::super::Status;
    use super::*;

    #[test]
    fn builtin_missing_and_refused_policies() {
        let a100 = [GpuModel::A100_40gb];
        let built = |s: &str| policy_choice::build(s, &a100).map(|(_, n)| n);
        assert_eq!(
            verdict("greedy", false, &a100, built("greedy")).status,
            Status::Ok
        );
        let missing = "policy:/nonexistent/p.onnx";
        assert_eq!(
            verdict(missing, true, &a100, built(missing)).status,
            Status::Warn
        );
        assert_eq!(
            verdict("magic", false, &a100, built("magic")).status,
            Status::Fail
        );
    }
}
