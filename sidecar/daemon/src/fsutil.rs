//! Crash-safe file writes for the journal and the sim backend's state, and
//! the small file operations they share.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Writes `bytes` to `path` so that a crash leaves either the old or the new
/// content, never a mix: write a temporary file in the same directory, fsync
/// it, rename it over `path`, fsync the directory (so the rename is durable).
pub fn atomic_write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    atomic_write_mode(path, bytes, 0o600)
}

/// [`atomic_write`] giving the new file `mode` (the cluster summary's
/// files are read by every node, as root, over NFS where root may be
/// squashed to nobody: 0644).
pub fn atomic_write_mode(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "state".into());
    let tmp = dir.join(format!(".{name}.tmp"));
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()
}

/// Removes `path`; one that is not there is fine.
pub fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Creates `dir` (and parents) and sets its mode, e.g. 0700 for the state dir.
pub fn ensure_dir(dir: &Path, mode: u32) -> std::io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_content() {
        let dir = std::env::temp_dir().join(format!("smartmig-fsutil-{}", std::process::id()));
        ensure_dir(&dir, 0o700).unwrap();
        let p = dir.join("x.json");
        atomic_write(&p, b"one").unwrap();
        atomic_write(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert!(!dir.join(".x.json.tmp").exists());
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        fs::remove_dir_all(&dir).unwrap();
    }
}
