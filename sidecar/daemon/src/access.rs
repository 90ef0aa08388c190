//! Device isolation between the jobs on one GPU: who may open an
//! instance's access files.
//!
//! A MIG instance is usable only by a process that can open its GPU
//! instance's and compute instance's capability device files
//! (`/dev/nvidia-caps/nvidia-cap<M>`, named by
//! `/proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>[/ci<C>]/access`).
//! Slurm's `ConstrainDevices` only restricts the files gres.conf names
//! (`/dev/nvidia<N>`), so without this any job holding shards of a GPU could
//! point `CUDA_VISIBLE_DEVICES` at another job's instance. The daemon keeps
//! every instance's access files owned by the user of the job that holds it
//! (mode 0600) and by root (0600) while it is idle, after every change of a
//! GPU's assignments and at start (which repairs whatever a crash left).
//! The backends name the files ([`crate::backend::Backend::access_files`]);
//! this module only sets owners and modes.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The mode of every access file: read/write for its owner only.
pub const MODE: u32 = 0o600;

/// Who may open an instance's access files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// Nobody but root: the instance is idle.
    Root,
    /// The user of the job that holds the instance.
    User(u32),
}

impl Holder {
    fn uid(self) -> u32 {
        match self {
            Holder::Root => 0,
            Holder::User(uid) => uid,
        }
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Root => write!(f, "root"),
            Holder::User(uid) => write!(f, "uid {uid}"),
        }
    }
}

/// An access file that could not be given to its holder.
#[derive(Debug, thiserror::Error)]
#[error("cannot restrict {path} to {holder}: {reason}")]
pub struct AccessError {
    pub path: PathBuf,
    pub holder: Holder,
    pub reason: String,
}

/// Why an instance's access files could not be given to their holder.
#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    /// The backend cannot name the files (unknown instance, driver file).
    #[error("GPU {gpu}: access files of {uuid} unknown: {source}")]
    Files {
        gpu: u32,
        uuid: String,
        source: crate::backend::BackendError,
    },
    #[error(transparent)]
    Access(#[from] AccessError),
}

/// Makes `path` owned by `holder` (group root) with mode 0600, changing only
/// what differs; returns whether anything changed. A symbolic link is
/// refused, never followed: the files live in directories only root can
/// write, so a link there is not ours to trust.
pub fn restrict(path: &Path, holder: Holder) -> Result<bool, AccessError> {
    let err = |reason: String| AccessError {
        path: path.to_path_buf(),
        holder,
        reason,
    };
    let meta = std::fs::symlink_metadata(path).map_err(|e| err(e.to_string()))?;
    if meta.file_type().is_symlink() {
        return Err(err("it is a symbolic link".into()));
    }
    let mut changed = false;
    if meta.uid() != holder.uid() || meta.gid() != 0 {
        std::os::unix::fs::lchown(path, Some(holder.uid()), Some(0))
            .map_err(|e| err(format!("chown: {e}")))?;
        changed = true;
    }
    if meta.mode() & 0o7777 != MODE {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(MODE))
            .map_err(|e| err(format!("chmod: {e}")))?;
        changed = true;
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restricts_owner_and_mode_and_refuses_links() {
        let dir = std::env::temp_dir().join(format!("smartmig-access-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("nvidia-cap1");
        std::fs::write(&f, b"").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(restrict(&f, Holder::Root).unwrap());
        let m = std::fs::metadata(&f).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (0, 0, MODE));
        assert!(
            !restrict(&f, Holder::Root).unwrap(),
            "nothing left to change"
        );
        assert!(restrict(&f, Holder::User(65534)).unwrap());
        assert_eq!(std::fs::metadata(&f).unwrap().uid(), 65534);
        let link = dir.join("link");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        let e = restrict(&link, Holder::Root).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(
            std::fs::metadata(&f).unwrap().uid(),
            65534,
            "the target is untouched"
        );
        let e = restrict(&dir.join("absent"), Holder::User(7)).unwrap_err();
        assert!(
            e.to_string().contains("absent") && e.to_string().contains("uid 7"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
