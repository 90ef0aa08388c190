//! The journal of assignments (job -> instance), one file per GPU in
//! `<state_dir>/journal/gpu<N>.json`.
//!
//! Written atomically (see [`atomic_write`]) under the GPU's lock *before*
//! the allocate reply is sent, so an acknowledged allocation survives a
//! crash; one file per GPU keeps GPUs independent (no global lock, smaller
//! writes). The file is a snapshot of the GPU's assignments, not an append
//! log: it is tiny (at most 7 entries) and a snapshot needs no compaction.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::allocate::{Assignment, GpuBook};
use super::fsutil::{atomic_write, ensure_dir};

/// One journaled assignment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub uuid: String,
    pub profile: String,
    pub start: u8,
    #[serde(flatten)]
    pub assignment: Assignment,
}

#[derive(Debug, Serialize, Deserialize)]
struct File {
    version: u32,
    gpu: u32,
    entries: Vec<Entry>,
}

/// Journal IO errors.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("journal {path} is corrupt: {message}")]
    Corrupt { path: PathBuf, message: String },
}

/// The journal directory.
#[derive(Clone, Debug)]
pub struct Journal {
    dir: PathBuf,
}

impl Journal {
    pub fn open(state_dir: &Path) -> Result<Journal, JournalError> {
        let dir = state_dir.join("journal");
        ensure_dir(&dir, 0o700).map_err(|source| JournalError::Io {
            path: dir.clone(),
            source,
        })?;
        Ok(Journal { dir })
    }

    fn path(&self, gpu: u32) -> PathBuf {
        self.dir.join(format!("gpu{gpu}.json"))
    }

    /// The assignments recorded for `gpu` (none if the file does not exist).
    pub fn load(&self, gpu: u32) -> Result<Vec<Entry>, JournalError> {
        let path = self.path(gpu);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice::<File>(&bytes)
                .map(|f| f.entries)
                .map_err(|e| JournalError::Corrupt {
                    path,
                    message: e.to_string(),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(source) => Err(JournalError::Io { path, source }),
        }
    }

    /// Records every assignment of `book` (durably, before returning).
    pub fn save(&self, book: &GpuBook) -> Result<(), JournalError> {
        let entries = book
            .instances
            .iter()
            .filter_map(|i| {
                let a = i.job.clone()?;
                let p = book.geometry.placement(i.placement);
                Some(Entry {
                    uuid: i.uuid.clone(),
                    profile: p.profile.name(),
                    start: p.start,
                    assignment: a,
                })
            })
            .collect();
        let file = File {
            version: 1,
            gpu: book.index,
            entries,
        };
        let path = self.path(book.index);
        let bytes = serde_json::to_vec_pretty(&file).map_err(|e| JournalError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        atomic_write(&path, &bytes).map_err(|source| JournalError::Io { path, source })
    }
}
