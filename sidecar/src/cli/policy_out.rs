//! Writing a trained policy file and its metadata JSON: one writer for both
//! kinds (`train` for repartitioning, `train_placement` for placement, and
//! the merged ensembles), below the commands that train them.

use std::path::PathBuf;

use anyhow::{Context, Result};

/// Exports `net`'s actor with `meta` embedded under `key`, writes it to
/// `out` and the same metadata, pretty, next to it as `.json` (what a
/// human reads). Returns the file's bytes and the JSON's path.
pub fn write_policy(
    net: &crate::learn::model::ActorCritic,
    key: &str,
    meta: &impl serde::Serialize,
    out: &std::path::Path,
) -> Result<(Vec<u8>, PathBuf)> {
    let json = serde_json::to_string(meta).context("serialising metadata")?;
    let bytes = net.export_onnx(&[(key, json.as_str())])?;
    write_with_metadata(bytes, meta, out)
}

/// Writes a policy file's `bytes` to `out` and `meta`, pretty, next to it
/// as `.json`. Returns the bytes and the JSON's path.
pub fn write_with_metadata(
    bytes: Vec<u8>,
    meta: &impl serde::Serialize,
    out: &std::path::Path,
) -> Result<(Vec<u8>, PathBuf)> {
    std::fs::write(out, &bytes).with_context(|| format!("writing {}", out.display()))?;
    let meta_path = out.with_extension("json");
    std::fs::write(
        &meta_path,
        serde_json::to_string_pretty(meta).context("serialising metadata")? + "\n",
    )
    .with_context(|| format!("writing {}", meta_path.display()))?;
    Ok((bytes, meta_path))
}
