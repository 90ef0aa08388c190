//! Without ONNX Runtime, loading a policy fails with the message that says
//! how to get it (own test binary: it sets ORT_DYLIB_PATH for the process).

use smartmig::formats::policy_file::{PolicyMetadata, POLICY_KEY};
use smartmig::learn::model::ActorCritic;
use smartmig::mig::GpuModel;
use smartmig::policy::features::FeatureSpec;
use smartmig::policy::onnx::{load_policy, PolicyLoadError};

#[test]
fn missing_runtime_says_how_to_fetch_it() {
    let dir = std::env::temp_dir().join(format!("smartmig-no-ort-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let spec = FeatureSpec::new(GpuModel::A100_40gb);
    let net = ActorCritic::new(spec.obs_dim, spec.actions, 16, 0).expect("net");
    let meta = serde_json::to_string(&PolicyMetadata::new(&spec, 16)).expect("json");
    let path = dir.join("p.onnx");
    std::fs::write(
        &path,
        net.export_onnx(&[(POLICY_KEY, meta.as_str())])
            .expect("export"),
    )
    .expect("write");
    // The only test of this binary: no other thread reads the environment.
    std::env::set_var("ORT_DYLIB_PATH", dir.join("no-such-libonnxruntime.so"));
    let err = load_policy(&path, GpuModel::A100_40gb).expect_err("no runtime");
    assert!(
        matches!(err, PolicyLoadError::RuntimeEnvMissing(_)),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("ONNX Runtime not found")
            && msg.contains("scripts/fetch-onnxruntime")
            && msg.contains("ORT_DYLIB_PATH"),
        "{msg}"
    );
}
