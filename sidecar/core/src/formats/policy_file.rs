//! The contract of a policy file between the exporter that writes it
//! (`learn::export`) and the runtime that runs it ([`super::onnx`]): tensor
//! names, format versions, the mask penalty, and reading the embedded
//! metadata. It lives with the runtime so the runtime does not depend on
//! the trainer.

/// ONNX IR version written (ONNX 1.13+, understood by every ORT >= 1.14).
pub const IR_VERSION: i64 = 8;
/// Default-domain opset written.
pub const OPSET: i64 = 17;

/// Names of the graph's inputs and outputs.
pub const INPUT_OBS: &str = "obs";
pub const INPUT_MASK: &str = "mask";
pub const OUTPUT_LOGITS: &str = "logits";
pub const OUTPUT_PROBS: &str = "probs";

/// Penalty added to the logits of masked actions (`logits + (mask - 1) x
/// penalty`), in the network and in the exported graph alike.
pub const MASK_PENALTY: f32 = 1e9;

/// The `metadata_props` of an ONNX file (key, value), without running it.
pub fn read_metadata_props(bytes: &[u8]) -> Result<Vec<(String, String)>, onnx_rs::Error> {
    let model = onnx_rs::parse(bytes)?;
    Ok(model
        .metadata_props
        .iter()
        .map(|e| (e.key.to_string(), e.value.to_string()))
        .collect())
}
