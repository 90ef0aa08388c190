//! The out-of-memory marker (`oom_requeue=yes`).
//!
//! A job says it ran out of GPU memory by writing anything into the file
//! `$SMARTMIG_OOM_FILE` (conventionally the error line, e.g. `CUDA out of
//! memory`) and exiting non-zero. Why a file and not the job's output or
//! exit code: the epilog, which reports the job's end to the sidecar, sees
//! neither the job's output (its path and format are the user's) nor its
//! exit code (22.05 gives it only to `EpilogSlurmctld`), and exit codes
//! collide with the application's own. A file the plugin prepares is
//! unambiguous and survives the job.
//!
//! Lifecycle, all as root:
//!
//! 1. slurmstepd (`init_post_opt` of the batch step): create
//!    `<oom_dir>/job<ID>` empty, owned by the job's user, mode 0600, in a
//!    root-owned 0711 directory (users can write their own file but cannot
//!    list, create, rename or link entries there, so root never follows a
//!    user's symlink); set `SMARTMIG_OOM_FILE`. Other steps of the job only
//!    get the variable.
//! 2. slurmstepd (`task_exit` of the batch step): a batch script that
//!    exited 0 did not fail, whatever it wrote: the marker is emptied.
//! 3. slurmd's epilog: a non-empty marker means "out of memory"; the file
//!    is removed and the release says `oom: true`.
//!
//! Every function returns an [`OomMarkerError`]; the callers log it and
//! never fail the job or the node over a marker.

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The variable that tells the job where its marker is.
pub const ENV: &str = "SMARTMIG_OOM_FILE";

/// Bytes of a marker read by the epilog (its content is only logged).
const MAX_READ: u64 = 4096;

/// Why a marker (or its directory) could not be prepared, cleared or read.
/// Every variant names the path.
#[derive(Debug, thiserror::Error)]
pub enum OomMarkerError {
    #[error("cannot create {}: {source}", .path.display())]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot set the mode of {}: {source}", .path.display())]
    SetMode {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot give {} to uid {uid}: {source}", .path.display())]
    Chown {
        path: PathBuf,
        uid: u32,
        source: std::io::Error,
    },
    #[error("cannot empty {}: {source}", .path.display())]
    Empty {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Opening or inspecting the path failed.
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The directory could be changed by someone else than `owner` (us).
    #[error(
        "{} must be a directory owned by uid {owner} that no one else can write \
         (found uid {uid}, mode {mode:o})",
        .path.display()
    )]
    UnsafeDir {
        path: PathBuf,
        owner: u32,
        uid: u32,
        mode: u32,
    },
    /// A symlink, directory, FIFO... where the marker should be.
    #[error("{} is not a regular file", .path.display())]
    NotAFile { path: PathBuf },
}

/// `OomMarkerError::$variant` for `path`, for `map_err`.
macro_rules! at {
    ($variant:ident, $path:expr) => {
        |source| OomMarkerError::$variant {
            path: $path.to_path_buf(),
            source,
        }
    };
}

/// `<dir>/job<ID>`.
pub fn marker_path(dir: &Path, job_id: u32) -> PathBuf {
    dir.join(format!("job{job_id}"))
}

/// Creates the marker directory (0711) if needed and checks that nobody but
/// its owner (us, root) can change its entries.
fn checked_dir(dir: &Path) -> Result<(), OomMarkerError> {
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o711)
                .create(dir)
                .map_err(at!(Create, dir))?;
            fs::set_permissions(dir, fs::Permissions::from_mode(0o711))
                .map_err(at!(SetMode, dir))?;
        }
        Err(e) => return Err(at!(Io, dir)(e)),
        Ok(_) => {}
    }
    let md = fs::symlink_metadata(dir).map_err(at!(Io, dir))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !md.is_dir() || md.uid() != me || md.mode() & 0o022 != 0 {
        return Err(OomMarkerError::UnsafeDir {
            path: dir.to_path_buf(),
            owner: me,
            uid: md.uid(),
            mode: md.mode() & 0o7777,
        });
    }
    Ok(())
}

/// Prepares the job's marker (empties it when `fresh`, i.e. at the start of
/// a run of the batch script) and returns its path.
pub fn prepare(
    dir: &Path,
    job_id: u32,
    uid: u32,
    gid: u32,
    fresh: bool,
) -> Result<PathBuf, OomMarkerError> {
    checked_dir(dir)?;
    let path = marker_path(dir, job_id);
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(fresh)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .map_err(at!(Create, path))?;
    let md = file.metadata().map_err(at!(Io, path))?;
    if !md.is_file() {
        return Err(OomMarkerError::NotAFile { path });
    }
    std::os::unix::fs::fchown(&file, Some(uid), Some(gid)).map_err(|source| {
        OomMarkerError::Chown {
            path: path.clone(),
            uid,
            source,
        }
    })?;
    file.set_permissions(fs::Permissions::from_mode(0o600))
        .map_err(at!(SetMode, path))?;
    Ok(path)
}

fn open_existing(path: &Path, write: bool) -> Result<Option<File>, OomMarkerError> {
    match OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => {
            let md = f.metadata().map_err(at!(Io, path))?;
            if md.is_file() {
                Ok(Some(f))
            } else {
                Err(OomMarkerError::NotAFile {
                    path: path.to_path_buf(),
                })
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(at!(Io, path)(e)),
    }
}

/// Empties the marker (the batch script exited 0). A missing marker is fine.
pub fn clear(dir: &Path, job_id: u32) -> Result<(), OomMarkerError> {
    let path = marker_path(dir, job_id);
    if let Some(f) = open_existing(&path, true)? {
        f.set_len(0).map_err(at!(Empty, path))?;
    }
    Ok(())
}

/// The epilog's reading: `Some(first line)` when the job wrote the marker
/// (it ran out of memory), `None` otherwise. The file is removed either way.
pub fn take(dir: &Path, job_id: u32) -> Result<Option<String>, OomMarkerError> {
    let path = marker_path(dir, job_id);
    let Some(f) = open_existing(&path, false)? else {
        return Ok(None);
    };
    let mut bytes = Vec::new();
    let read = f.take(MAX_READ).read_to_end(&mut bytes);
    let _ = fs::remove_file(&path);
    read.map_err(at!(Read, path))?;
    let text = String::from_utf8_lossy(&bytes);
    if text.trim().is_empty() {
        return Ok(None);
    }
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    Ok(Some(first))
}

/// Largest file system the markers may live on without a warning. A job
/// owns its marker and can write it until its file system is full, so
/// `oom_dir` belongs on a small file system of its own (a 1 MiB tmpfs,
/// docs/slurm-integration.md section 2a), not on `/run`, which slurmd,
/// munge and smartmigd need.
pub const MAX_MARKER_FS_BYTES: u64 = 16 << 20;

/// Size of the file system holding `dir`, in bytes.
pub fn fs_bytes(dir: &Path) -> Result<u64, OomMarkerError> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|_| OomMarkerError::Io {
        path: dir.to_path_buf(),
        source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
    })?;
    // SAFETY: a plain C struct of integers, for which all zeroes is valid.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a zeroed out-struct of the right type.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(OomMarkerError::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok((st.f_blocks as u64).saturating_mul(st.f_bsize as u64))
}

/// A warning when a job could fill a file system others need through its
/// marker in `dir` (bigger than [`MAX_MARKER_FS_BYTES`]); `None` when the
/// directory's own small file system bounds what a job can write.
pub fn unbounded_warning(dir: &Path) -> Option<String> {
    match fs_bytes(dir) {
        Ok(bytes) if bytes <= MAX_MARKER_FS_BYTES => None,
        Ok(bytes) => Some(format!(
            "{} is on a {} MiB file system: a job can fill it by writing its out-of-memory \
             marker; mount a small tmpfs there (e.g. `mount -t tmpfs -o size=1m,mode=0711 \
             tmpfs {}`, docs/slurm-integration.md section 2a)",
            dir.display(),
            bytes >> 20,
            dir.display()
        )),
        Err(e) => Some(format!("cannot tell how much a marker can fill: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("smartmig-oom-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn me() -> (u32, u32) {
        // SAFETY: no preconditions.
        unsafe { (libc::geteuid(), libc::getegid()) }
    }

    #[test]
    fn marker_lifecycle() {
        let dir = tmp("life").join("oom");
        let (uid, gid) = me();
        let p = prepare(&dir, 42, uid, gid, true).unwrap();
        assert_eq!(p, dir.join("job42"));
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o711);
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // Nothing written: no OOM, and the file is gone.
        assert_eq!(take(&dir, 42).unwrap(), None);
        assert!(!p.exists());
        // Written: OOM with its first line.
        prepare(&dir, 42, uid, gid, true).unwrap();
        fs::write(
            &p,
            "\n  CUDA out of memory. Tried to allocate 2 GiB\nmore\n",
        )
        .unwrap();
        assert_eq!(
            take(&dir, 42).unwrap().as_deref(),
            Some("CUDA out of memory. Tried to allocate 2 GiB")
        );
        assert_eq!(take(&dir, 42).unwrap(), None);
        // A run that exited 0 has its marker cleared.
        prepare(&dir, 43, uid, gid, true).unwrap();
        fs::write(marker_path(&dir, 43), "SMARTMIG_OOM").unwrap();
        clear(&dir, 43).unwrap();
        assert_eq!(take(&dir, 43).unwrap(), None);
        clear(&dir, 44).unwrap();
        // A later step keeps what the batch step's run wrote.
        prepare(&dir, 45, uid, gid, true).unwrap();
        fs::write(marker_path(&dir, 45), "oom").unwrap();
        prepare(&dir, 45, uid, gid, false).unwrap();
        assert_eq!(take(&dir, 45).unwrap().as_deref(), Some("oom"));
        fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    #[test]
    fn refuses_a_writable_dir_and_symlinks() {
        let base = tmp("unsafe");
        let dir = base.join("oom");
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let (uid, gid) = me();
        let err = prepare(&dir, 1, uid, gid, true).unwrap_err();
        assert!(matches!(err, OomMarkerError::UnsafeDir { .. }), "{err:?}");
        assert!(err.to_string().contains("no one else can write"), "{err}");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o711)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", marker_path(&dir, 2)).unwrap();
        assert!(prepare(&dir, 2, uid, gid, true).is_err());
        assert!(take(&dir, 2).is_err());
        fs::remove_dir_all(&base).unwrap();
    }

    /// A marker directory on `/dev/shm` (GBs) is flagged; on its own 1 MiB
    /// tmpfs it is not, and a job writing its marker there stops at 1 MiB.
    #[test]
    fn a_marker_is_bounded_only_by_a_small_file_system_of_its_own() {
        assert_eq!(
            // SAFETY: geteuid has no preconditions.
            unsafe { libc::geteuid() },
            0,
            "mounting a tmpfs needs root (scripts/test runs as root)"
        );
        let big = Path::new("/dev/shm");
        let w = unbounded_warning(big).expect("/dev/shm is larger than 16 MiB here");
        assert!(
            w.contains("/dev/shm") && w.contains("mount a small tmpfs"),
            "{w}"
        );
        let dir = std::env::temp_dir().join(format!("smartmig-oom-fs-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m,mode=0711", "tmpfs"])
            .arg(&dir)
            .status()
            .expect("run mount");
        assert!(st.success(), "mount a 1 MiB tmpfs on {}", dir.display());
        let bounded = unbounded_warning(&dir);
        let path = prepare(&dir, 9, 65534, 65534, true);
        let written = path.as_ref().ok().map(|p| {
            let mut f = OpenOptions::new().append(true).open(p).unwrap();
            let chunk = vec![b'x'; 64 * 1024];
            let mut n = 0u64;
            while std::io::Write::write_all(&mut f, &chunk).is_ok() && n < 64 << 20 {
                n += chunk.len() as u64;
            }
            n
        });
        let _ = std::process::Command::new("umount").arg(&dir).status();
        let _ = fs::remove_dir(&dir);
        assert_eq!(bounded, None);
        let written = written.expect("marker prepared on the small tmpfs");
        assert!(
            written <= 1 << 20,
            "wrote {written} bytes into a 1 MiB file system"
        );
    }
}
