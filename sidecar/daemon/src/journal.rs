//! The journal of assignments (job -> instance): an append-only log with
//! group commit, plus a snapshot, in `<state_dir>/journal/`. The files'
//! format is [`crate::formats::journal`].
//!
//! Every change of a GPU's assignments appends one record holding that GPU's
//! whole assignment list (at most 7 entries), so replay is "last record per
//! GPU wins" and needs no ordering across GPUs.
//!
//! Durability: [`Journal::save`] returns only after its record is written
//! (`write` + `fdatasync`), and the daemon replies only after `save`
//! returned, so an acknowledged allocation survives a crash of the daemon or
//! of the machine. On a tmpfs (`journal_dir = "/run/..."`) there is no disk
//! to sync: a returned `write` is in kernel memory and survives a crash of
//! the daemon (what the journal is for), and a reboot loses it together
//! with every MIG instance and job it describes ([`Durability`]). **Group commit**: concurrent savers share one `write` and
//! one `fdatasync`: the first becomes the leader and writes every record
//! queued so far; the others wait for it (`docs/reliability.md` has the
//! measurements that motivated this; the previous format rewrote a file per
//! GPU with fsync + rename + directory fsync on every change).
//!
//! Files:
//! - `snapshot.json`: `{"version":2,"seq":N,"gpus":{"0":[entries],...}}`, the
//!   state after record `seq`, written atomically (temporary file, fsync,
//!   rename, directory fsync) at open and when the log exceeds
//!   [`COMPACT_BYTES`]; the log is truncated after it.
//! - `log`: records with `seq > snapshot.seq` (older ones, left by a crash
//!   between the snapshot and the truncation, are skipped).
//! - `gpu<N>.json` (version 1, one snapshot file per GPU) is still read when
//!   no `snapshot.json` exists, and removed once a snapshot replaced it.
//!
//! Torn tail: a crash (power loss) during a write can leave a partial or
//! garbled last batch. Replay stops at the first record whose checksum or
//! JSON is wrong, drops it and everything after it (none of it was
//! acknowledged: its `fdatasync` never returned) and truncates the log there,
//! with a warning naming the bytes dropped.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard};

use super::allocate::GpuBook;
use super::fsutil::{atomic_write, ensure_dir, remove_if_present};
pub use crate::formats::journal::Entry;
use crate::formats::journal::{
    decode, encode, v1_gpu, FileV1, Record, Snapshot, LOG_FILE, SNAPSHOT_FILE, SNAPSHOT_VERSION,
};

/// The log is compacted into a new snapshot when it grows past this size.
pub const COMPACT_BYTES: u64 = 4 * 1024 * 1024;

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
    /// An earlier write failed and could not be undone: the log's tail is
    /// unknown, so nothing more is written until a restart replays it.
    #[error("journal {path} is unusable after a failed write ({message}); restart smartmigd")]
    Failed { path: PathBuf, message: String },
    /// `journal_dir` moved while both the old and the new directory hold
    /// different assignments: which one is current cannot be told.
    #[error("two journals hold different assignments: {old} (where the journal was last) and {new} (journal_dir now); keep the current one and remove the other's snapshot.json and log, then start smartmigd again")]
    Conflict { old: PathBuf, new: PathBuf },
}

/// What replaying the journal directory found.
#[derive(Debug, Default)]
pub struct Replay {
    /// The assignments of every GPU that has a record.
    pub gpus: BTreeMap<u32, Vec<Entry>>,
    /// Sequence number of the last record applied.
    pub seq: u64,
    /// Valid length of the log (bytes); anything after it is a torn tail.
    pub log_len: u64,
    /// Bytes after `log_len` that were dropped (torn or garbled tail).
    pub dropped_bytes: u64,
    /// Records read from the log (applied or skipped as older than the snapshot).
    pub records: u64,
}

/// Reads `dir` (a journal directory) without changing anything: snapshot,
/// then the log up to the first bad record. Used at open and by tests that
/// compare the journal with the daemon's and the backend's view.
pub fn replay(dir: &Path) -> Result<Replay, JournalError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| JournalError::Io { path, source }
    };
    let snap_path = dir.join(SNAPSHOT_FILE);
    let mut out = Replay::default();
    match std::fs::read(&snap_path) {
        Ok(bytes) => {
            let s: Snapshot =
                serde_json::from_slice(&bytes).map_err(|e| JournalError::Corrupt {
                    path: snap_path.clone(),
                    message: e.to_string(),
                })?;
            out.gpus = s.gpus;
            out.seq = s.seq;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Version 1: one snapshot file per GPU.
            for (gpu, path) in v1_files(dir).map_err(io(dir))? {
                let bytes = std::fs::read(&path).map_err(io(&path))?;
                let f: FileV1 =
                    serde_json::from_slice(&bytes).map_err(|e| JournalError::Corrupt {
                        path: path.clone(),
                        message: e.to_string(),
                    })?;
                out.gpus.insert(gpu, f.entries);
            }
        }
        Err(e) => return Err(io(&snap_path)(e)),
    }
    let log_path = dir.join(LOG_FILE);
    let bytes = match std::fs::read(&log_path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io(&log_path)(e)),
    };
    let mut pos = 0usize;
    while pos < bytes.len() {
        let Some(nl) = bytes[pos..].iter().position(|&b| b == b'\n') else {
            break; // no newline: torn
        };
        let Some(r) = decode(&bytes[pos..pos + nl]) else {
            break;
        };
        out.records += 1;
        if r.seq > out.seq {
            out.seq = r.seq;
            out.gpus.insert(r.gpu, r.entries);
        }
        pos += nl + 1;
    }
    out.log_len = pos as u64;
    out.dropped_bytes = (bytes.len() - pos) as u64;
    Ok(out)
}

/// The version 1 files `gpu<N>.json` in `dir`.
fn v1_files(dir: &Path) -> std::io::Result<Vec<(u32, PathBuf)>> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for entry in rd {
        let entry = entry?;
        if let Some(n) = v1_gpu(&entry.file_name().to_string_lossy()) {
            out.push((n, entry.path()));
        }
    }
    Ok(out)
}

struct Inner {
    /// Sequence number of the last record queued.
    seq: u64,
    /// Sequence number of the last record on disk.
    synced: u64,
    /// Encoded records not yet written, with what they set.
    pending: Vec<u8>,
    pending_sets: Vec<(u32, Vec<Entry>)>,
    /// A leader is writing a batch.
    writing: bool,
    /// The durable state (what a replay would give), for compaction.
    durable: BTreeMap<u32, Vec<Entry>>,
    log_len: u64,
    /// Set when a failed write could not be undone.
    failed: Option<String>,
    /// Sequence ranges of batches whose write failed (and was undone), with
    /// the error: their savers get the error, not success. Kept short.
    failed_batches: Vec<(u64, u64, String)>,
    /// Batches and fdatasyncs done (for tests and the reliability report).
    syncs: u64,
}

/// What an acknowledged record survives, from the journal's file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// On disk: `write` + `fdatasync`; survives a machine crash.
    Disk,
    /// On a tmpfs: `write` only; survives a crash of the daemon, not a
    /// reboot (nor do MIG instances and the jobs on them).
    Memory,
}

impl Durability {
    /// `Memory` if `dir` is on a tmpfs, else `Disk` (also when the file
    /// system cannot be asked: syncing is the safe side).
    pub fn of(dir: &Path) -> Durability {
        use nix::sys::statfs::{statfs, TMPFS_MAGIC};
        match statfs(dir) {
            Ok(fs) if fs.filesystem_type() == TMPFS_MAGIC => Durability::Memory,
            _ => Durability::Disk,
        }
    }
}

/// The journal directory, shared by every GPU.
pub struct Journal {
    dir: PathBuf,
    durability: Durability,
    log_path: PathBuf,
    log: File,
    inner: Mutex<Inner>,
    done: Condvar,
    /// Tests replace the batch write to hold the leader or fail it.
    #[cfg(test)]
    write_hook: Mutex<Option<WriteHook>>,
}

/// Writes a batch in place of `write_all` (tests only).
#[cfg(test)]
type WriteHook = Box<dyn FnMut(&File, &[u8]) -> std::io::Result<()> + Send>;

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("dir", &self.dir).finish()
    }
}

impl Journal {
    /// Opens (creating it 0700) the journal in `dir`, replays it, drops a
    /// torn tail and compacts everything into a fresh snapshot.
    pub fn open(dir: &Path) -> Result<Journal, JournalError> {
        let dir = dir.to_path_buf();
        ensure_dir(&dir, 0o700).map_err(|source| JournalError::Io {
            path: dir.clone(),
            source,
        })?;
        let r = replay(&dir)?;
        if r.dropped_bytes > 0 {
            tracing::warn!(
                bytes = r.dropped_bytes,
                at = r.log_len,
                "journal log ends with a torn or garbled record (a crash during a write); \
                 dropping it: it was never acknowledged"
            );
        }
        let log_path = dir.join(LOG_FILE);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .mode(0o600)
            .open(&log_path)
            .map_err(|source| JournalError::Io {
                path: log_path.clone(),
                source,
            })?;
        // `mode` applies only to a new file: tighten one left with looser
        // permissions (created by hand or by an older version).
        log.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|source| JournalError::Io {
                path: log_path.clone(),
                source,
            })?;
        let durability = Durability::of(&dir);
        let journal = Journal {
            dir,
            durability,
            log_path,
            log,
            inner: Mutex::new(Inner {
                seq: r.seq,
                synced: r.seq,
                pending: Vec::new(),
                pending_sets: Vec::new(),
                writing: false,
                durable: r.gpus,
                log_len: r.log_len,
                failed: None,
                failed_batches: Vec::new(),
                syncs: 0,
            }),
            done: Condvar::new(),
            #[cfg(test)]
            write_hook: Mutex::new(None),
        };
        {
            let mut inner = journal.lock();
            journal.compact(&mut inner)?;
        }
        // Version 1 files are now in the snapshot.
        for (_, path) in v1_files(&journal.dir).unwrap_or_default() {
            let _ = std::fs::remove_file(path);
        }
        Ok(journal)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Inner is only changed in short sections that cannot panic halfway.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn io_err(&self, source: std::io::Error) -> JournalError {
        JournalError::Io {
            path: self.log_path.clone(),
            source,
        }
    }

    /// Writes the durable state as the snapshot and empties the log.
    fn compact(&self, inner: &mut Inner) -> Result<(), JournalError> {
        write_snapshot(&self.dir, inner.synced, inner.durable.clone())?;
        self.log
            .set_len(0)
            .and_then(|()| self.log.sync_all())
            .map_err(|e| self.io_err(e))?;
        inner.log_len = 0;
        Ok(())
    }

    /// The assignments recorded for `gpu` (none if it has no record).
    pub fn load(&self, gpu: u32) -> Result<Vec<Entry>, JournalError> {
        Ok(self.lock().durable.get(&gpu).cloned().unwrap_or_default())
    }

    /// What an acknowledged record survives.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Writes one batch at the end of the log.
    fn write_batch(&self, batch: &[u8]) -> std::io::Result<()> {
        #[cfg(test)]
        if let Some(hook) = self.write_hook.lock().unwrap().as_mut() {
            return hook(&self.log, batch);
        }
        (&self.log).write_all(batch)
    }

    /// Batches written (one `write` + one `fdatasync` each) since open.
    pub fn syncs(&self) -> u64 {
        self.lock().syncs
    }

    /// Records every assignment of `book` (durably, before returning).
    pub fn save(&self, book: &GpuBook) -> Result<(), JournalError> {
        let entries = book
            .instances
            .iter()
            .filter_map(|i| {
                let a = i.job.clone()?;
                let p = book.geometry.spot(i.placement);
                Some(Entry {
                    uuid: i.uuid.clone(),
                    profile: p.profile.name(),
                    start: p.start,
                    assignment: a,
                })
            })
            .collect();
        self.commit(book.index, entries)
    }

    /// Appends "GPU `gpu` has exactly `entries`" and waits until it is on
    /// disk, writing it (and every record queued meanwhile) itself when no
    /// other thread is writing (group commit). On a tmpfs the writer keeps
    /// the lock, so every record is written by its own saver.
    pub fn commit(&self, gpu: u32, entries: Vec<Entry>) -> Result<(), JournalError> {
        let mut inner = self.lock();
        if let Some(message) = &inner.failed {
            return Err(JournalError::Failed {
                path: self.log_path.clone(),
                message: message.clone(),
            });
        }
        inner.seq += 1;
        let seq = inner.seq;
        let record = Record { seq, gpu, entries };
        let line = encode(&record);
        inner.pending.extend_from_slice(&line);
        inner.pending_sets.push((gpu, record.entries));
        loop {
            if let Some((_, _, message)) = inner
                .failed_batches
                .iter()
                .find(|(from, to, _)| (*from..=*to).contains(&seq))
            {
                return Err(JournalError::Io {
                    path: self.log_path.clone(),
                    source: std::io::Error::other(message.clone()),
                });
            }
            if inner.synced >= seq {
                return Ok(());
            }
            if let Some(message) = &inner.failed {
                return Err(JournalError::Failed {
                    path: self.log_path.clone(),
                    message: message.clone(),
                });
            }
            if inner.writing {
                inner = self
                    .done
                    .wait(inner)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            // Become the leader: write everything queued so far.
            inner.writing = true;
            let batch = std::mem::take(&mut inner.pending);
            let sets = std::mem::take(&mut inner.pending_sets);
            let first = inner.synced + 1;
            let last = inner.seq;
            let before = inner.log_len;
            let result = match self.durability {
                Durability::Disk => {
                    drop(inner);
                    let r = self.write_batch(&batch).and_then(|()| self.log.sync_data());
                    inner = self.lock();
                    r
                }
                // A write to memory takes microseconds: under the lock, so
                // no saver ever waits for a leader (no thread hand-off).
                Durability::Memory => self.write_batch(&batch),
            };
            inner.writing = false;
            inner.syncs += 1;
            match result {
                Ok(()) => {
                    inner.synced = last;
                    inner.log_len += batch.len() as u64;
                    for (g, e) in sets {
                        inner.durable.insert(g, e);
                    }
                    if inner.log_len > COMPACT_BYTES {
                        if let Err(e) = self.compact(&mut inner) {
                            // The log is still valid: keep appending to it.
                            tracing::warn!("journal compaction failed: {e}");
                        }
                    }
                }
                Err(e) => {
                    // Undo the partial batch so that a replay never sees it.
                    let undo = self.log.set_len(before).and_then(|()| self.log.sync_all());
                    let message = e.to_string();
                    tracing::error!("journal write failed: {message}");
                    inner.synced = last; // these records are settled (as failed)
                    if inner.failed_batches.len() >= 64 {
                        inner.failed_batches.remove(0);
                    }
                    inner.failed_batches.push((first, last, message.clone()));
                    if let Err(u) = undo {
                        inner.failed = Some(format!("{message}; undo failed: {u}"));
                    }
                }
            }
            self.done.notify_all();
        }
    }
}

/// Writes `dir/snapshot.json` (the state after record `seq`) atomically.
fn write_snapshot(
    dir: &Path,
    seq: u64,
    gpus: BTreeMap<u32, Vec<Entry>>,
) -> Result<(), JournalError> {
    let path = dir.join(SNAPSHOT_FILE);
    let snap = Snapshot {
        version: SNAPSHOT_VERSION,
        seq,
        gpus,
    };
    let bytes = serde_json::to_vec_pretty(&snap).map_err(|e| JournalError::Corrupt {
        path: path.clone(),
        message: e.to_string(),
    })?;
    atomic_write(&path, &bytes).map_err(|source| JournalError::Io { path, source })
}

/// The file in the state directory naming where the journal was last
/// opened, so that a changed `journal_dir` brings the assignments along.
pub const LOCATION_FILE: &str = "journal.location";

/// Where the journal was, and how many assignments came along.
#[derive(Debug, PartialEq)]
pub struct Moved {
    pub from: PathBuf,
    pub assignments: usize,
}

/// Opens the journal in `dir` ([`Journal::open`]), first moving into it the
/// journal of the directory it was last opened in: the one named by
/// `<state_dir>/journal.location`, or, before any was written, the default
/// `<state_dir>/journal`. Without this, changing `journal_dir` (for example
/// to `/run/smartmig-journal`) with jobs running would forget their
/// assignments, and their instances would look idle. The new copy is
/// written (atomically, synced) before the old files are removed; a crash
/// in between leaves two equal journals, which the next start accepts. Two
/// *different* non-empty journals are refused ([`JournalError::Conflict`]).
/// After a reboot a tmpfs journal is gone, and nothing is moved.
pub fn open_moving(dir: &Path, state_dir: &Path) -> Result<(Journal, Option<Moved>), JournalError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| JournalError::Io { path, source }
    };
    let location = state_dir.join(LOCATION_FILE);
    let last = match std::fs::read_to_string(&location) {
        Ok(text) => PathBuf::from(text.trim()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => state_dir.join("journal"),
        Err(e) => return Err(io(&location)(e)),
    };
    let mut moved = None;
    if last != dir && last.is_absolute() && last.is_dir() {
        let old = replay(&last)?;
        let assignments: usize = old.gpus.values().map(Vec::len).sum();
        if assignments > 0 {
            let new = if dir.is_dir() {
                replay(dir)?
            } else {
                Replay::default()
            };
            let here = non_empty(&new.gpus);
            if !here.is_empty() && here != non_empty(&old.gpus) {
                return Err(JournalError::Conflict {
                    old: last,
                    new: dir.to_path_buf(),
                });
            }
            ensure_dir(dir, 0o700).map_err(io(dir))?;
            write_snapshot(dir, old.seq, old.gpus)?;
            let log = dir.join(LOG_FILE);
            remove_if_present(&log).map_err(io(&log))?;
            moved = Some(Moved {
                from: last.clone(),
                assignments,
            });
        }
        // The old directory's journal files go (the directory stays: it
        // may be the admin's), moved or empty.
        let mut old_files = vec![last.join(SNAPSHOT_FILE), last.join(LOG_FILE)];
        old_files.extend(
            v1_files(&last)
                .unwrap_or_default()
                .into_iter()
                .map(|(_, p)| p),
        );
        for f in old_files {
            remove_if_present(&f).map_err(io(&f))?;
        }
    }
    let journal = Journal::open(dir)?;
    if last != dir {
        ensure_dir(state_dir, 0o700).map_err(io(state_dir))?;
        let text = format!("{}\n", dir.display());
        atomic_write(&location, text.as_bytes()).map_err(io(&location))?;
    }
    Ok((journal, moved))
}

/// The GPUs that hold assignments (an empty list and no record are alike).
fn non_empty(gpus: &BTreeMap<u32, Vec<Entry>>) -> BTreeMap<u32, &Vec<Entry>> {
    gpus.iter()
        .filter(|(_, e)| !e.is_empty())
        .map(|(&g, e)| (g, e))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocate::Assignment;
    use crate::mig::{Geometry, GpuModel, Shape};

    fn dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("smartmig-journal-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn book(jobs: &[u64]) -> GpuBook {
        let g = Geometry::of(GpuModel::A100_40gb);
        let mut b = GpuBook::new(0, g, 0);
        for (k, &job) in jobs.iter().enumerate() {
            let id = g.spot_id(Shape::new(1, 1), k as u8).unwrap();
            b.add_instance(id, format!("MIG-{k}"), 0);
            b.assign(
                &format!("MIG-{k}"),
                Assignment {
                    job_id: job,
                    step: None,
                    uid: 1,
                    since: 0,
                    deadline: None,
                    time_limit_s: None,
                    wait_s: 0,
                },
            );
        }
        b
    }

    #[test]
    fn durability_follows_the_file_system() {
        // tmpfs: written without fsync; anything else, or a path that
        // cannot be asked, is synced.
        assert_eq!(
            Durability::of(Path::new("/dev/shm")),
            Durability::Memory,
            "/dev/shm is not a tmpfs on this machine"
        );
        assert_eq!(Durability::of(Path::new("/proc")), Durability::Disk);
        assert_eq!(
            Durability::of(Path::new("/nonexistent/x")),
            Durability::Disk
        );
        // A journal on tmpfs replays like one on disk.
        let d = PathBuf::from(format!("/dev/shm/smartmig-journal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let j = Journal::open(&d).unwrap();
        assert_eq!(j.durability(), Durability::Memory);
        j.save(&book(&[7, 8])).unwrap();
        drop(j);
        assert_eq!(replay(&d).unwrap().gpus[&0].len(), 2);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_changed_journal_dir_brings_the_assignments_along() {
        let state = dir("moving");
        let default = state.join("journal");
        let tmp = state.join("run/smartmig-journal");
        let jobs = |j: &Journal| -> Vec<u64> {
            j.load(0)
                .unwrap()
                .iter()
                .map(|e| e.assignment.job_id)
                .collect()
        };
        // Jobs 1 and 2 run with the default journal.
        let (j, moved) = open_moving(&default, &state).unwrap();
        assert_eq!(moved, None);
        j.save(&book(&[1, 2])).unwrap();
        drop(j);
        // journal_dir now names a tmpfs path: they come along, once.
        let (j, moved) = open_moving(&tmp, &state).unwrap();
        assert_eq!(
            moved,
            Some(Moved {
                from: default.clone(),
                assignments: 2
            })
        );
        assert_eq!(jobs(&j), [1, 2]);
        assert!(!default.join("snapshot.json").exists() && !default.join("log").exists());
        assert_eq!(
            std::fs::read_to_string(state.join(LOCATION_FILE))
                .unwrap()
                .trim(),
            tmp.display().to_string()
        );
        j.save(&book(&[1, 2, 3])).unwrap();
        drop(j);
        let (j, moved) = open_moving(&tmp, &state).unwrap();
        assert_eq!((moved, jobs(&j)), (None, vec![1, 2, 3]));
        drop(j);
        // And back to the default (the location file says where it was).
        let (j, moved) = open_moving(&default, &state).unwrap();
        assert_eq!(moved.map(|m| m.assignments), Some(3));
        assert_eq!(jobs(&j), [1, 2, 3]);
        drop(j);
        // A crash between the new copy and the removal: two equal
        // journals, accepted.
        std::fs::create_dir_all(&tmp).unwrap();
        for f in ["snapshot.json", "log"] {
            std::fs::copy(default.join(f), tmp.join(f)).unwrap();
        }
        std::fs::write(state.join(LOCATION_FILE), format!("{}\n", tmp.display())).unwrap();
        let (j, moved) = open_moving(&default, &state).unwrap();
        assert_eq!(moved.map(|m| m.assignments), Some(3));
        assert_eq!(jobs(&j), [1, 2, 3]);
        j.save(&book(&[4])).unwrap();
        drop(j);
        // Two different journals: refused, both left as they were.
        let other = Journal::open(&tmp).unwrap();
        other.save(&book(&[9])).unwrap();
        drop(other);
        std::fs::write(state.join(LOCATION_FILE), format!("{}\n", tmp.display())).unwrap();
        let e = open_moving(&default, &state).unwrap_err();
        assert!(matches!(e, JournalError::Conflict { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains(&tmp.display().to_string()) && msg.contains("journal_dir now"),
            "{msg}"
        );
        assert_eq!(replay(&tmp).unwrap().gpus[&0].len(), 1);
        assert_eq!(replay(&default).unwrap().gpus[&0].len(), 1);
        // After a reboot the tmpfs journal is gone: nothing to move.
        std::fs::remove_dir_all(&tmp).unwrap();
        let (j, moved) = open_moving(&default, &state).unwrap();
        assert_eq!((moved, jobs(&j)), (None, vec![4]));
        std::fs::remove_dir_all(&state).unwrap();
    }

    #[test]
    fn replays_last_record_per_gpu_and_survives_reopen() {
        let d = dir("replay");
        let j = Journal::open(&d.join("journal")).unwrap();
        j.save(&book(&[1])).unwrap();
        j.save(&book(&[1, 2])).unwrap();
        drop(j);
        let r = replay(&d.join("journal")).unwrap();
        assert_eq!(r.records, 2);
        assert_eq!(r.gpus[&0].len(), 2);
        let j = Journal::open(&d.join("journal")).unwrap();
        let jobs: Vec<u64> = j
            .load(0)
            .unwrap()
            .iter()
            .map(|e| e.assignment.job_id)
            .collect();
        assert_eq!(jobs, vec![1, 2]);
        // Reopen compacted: the log is empty, the snapshot holds the state.
        assert_eq!(std::fs::metadata(d.join("journal/log")).unwrap().len(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn torn_tail_is_dropped_not_fatal() {
        let d = dir("torn");
        let j = Journal::open(&d.join("journal")).unwrap();
        j.save(&book(&[1])).unwrap();
        j.save(&book(&[1, 2])).unwrap();
        drop(j);
        let log = d.join("journal/log");
        let bytes = std::fs::read(&log).unwrap();
        // Cut the last record in half, then garble a byte of a whole one.
        std::fs::write(&log, &bytes[..bytes.len() - 20]).unwrap();
        let r = replay(&d.join("journal")).unwrap();
        assert_eq!((r.records, r.gpus[&0].len()), (1, 1));
        assert!(r.dropped_bytes > 0);
        let mut garbled = bytes.clone();
        let n = garbled.len();
        garbled[n - 30] ^= 0x01;
        std::fs::write(&log, &garbled).unwrap();
        let j = Journal::open(&d.join("journal")).unwrap();
        assert_eq!(
            j.load(0).unwrap().len(),
            1,
            "garbled record must be dropped"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn concurrent_saves_all_replay() {
        let d = dir("group");
        let j = std::sync::Arc::new(Journal::open(&d.join("journal")).unwrap());
        let handles: Vec<_> = (0..8u32)
            .map(|g| {
                let j = j.clone();
                std::thread::spawn(move || {
                    for k in 0..50u64 {
                        let mut b = book(&[u64::from(g) * 1000 + k]);
                        b.index = g;
                        j.save(&b).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let r = replay(&d.join("journal")).unwrap();
        assert_eq!(r.records, 400);
        for g in 0..8u32 {
            assert_eq!(r.gpus[&g][0].assignment.job_id, u64::from(g) * 1000 + 49);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
    /// A hook that writes the batch, the first time only after the test
    /// released it (holding that leader), signalling when it got there.
    fn held_first_write(
        entered: std::sync::mpsc::Sender<()>,
        release: std::sync::mpsc::Receiver<()>,
    ) -> WriteHook {
        let mut first = Some((entered, release));
        Box::new(move |log, batch| {
            if let Some((entered, release)) = first.take() {
                entered.send(()).unwrap();
                release.recv().unwrap();
            }
            let mut log = log;
            log.write_all(batch)
        })
    }

    /// Group commit, deterministically: while the leader's write is held,
    /// seven more savers queue; they then go out as one batch, so 8 saves
    /// take 2 syncs.
    #[test]
    fn savers_queued_behind_a_held_leader_share_one_sync() {
        use std::sync::{mpsc, Arc};
        use std::time::{Duration, Instant};
        let d = dir("group-held");
        let mut j = Journal::open(&d.join("journal")).unwrap();
        // On a tmpfs the writer keeps the lock and nobody queues.
        j.durability = Durability::Disk;
        let (entered_tx, entered_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel();
        *j.write_hook.lock().unwrap() = Some(held_first_write(entered_tx, release_rx));
        let j = Arc::new(j);
        let save = |g: u32| {
            let j = j.clone();
            std::thread::spawn(move || {
                let mut b = book(&[u64::from(g) + 100]);
                b.index = g;
                j.save(&b)
            })
        };
        let leader = save(0);
        entered_rx.recv_timeout(Duration::from_secs(60)).unwrap();
        let followers: Vec<_> = (1..8).map(save).collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        while j.lock().seq < 8 {
            assert!(Instant::now() < deadline, "the savers did not queue");
            std::thread::yield_now();
        }
        assert_eq!(j.syncs(), 0, "the held leader already finished");
        release_tx.send(()).unwrap();
        leader.join().unwrap().unwrap();
        for f in followers {
            f.join().unwrap().unwrap();
        }
        assert_eq!(j.syncs(), 2, "8 saves: the leader's batch, then one of 7");
        let r = replay(&d.join("journal")).unwrap();
        assert_eq!(r.records, 8);
        for g in 0..8u32 {
            assert_eq!(r.gpus[&g][0].assignment.job_id, u64::from(g) + 100);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A write that fails halfway (a full disk): the saver gets the error,
    /// the partial batch is cut off again (a replay sees neither the record
    /// nor a torn tail), and the journal keeps working.
    #[test]
    fn a_failed_write_is_undone_and_reported() {
        let d = dir("write-error");
        let mut j = Journal::open(&d.join("journal")).unwrap();
        j.durability = Durability::Disk;
        let log = d.join("journal/log");
        j.save(&book(&[1])).unwrap();
        let len = std::fs::metadata(&log).unwrap().len();
        *j.write_hook.lock().unwrap() = Some(Box::new(|log, batch| {
            let mut log = log;
            log.write_all(&batch[..batch.len() / 2])?;
            Err(std::io::Error::other("injected: no space left on device"))
        }));
        let e = j.save(&book(&[1, 2])).unwrap_err();
        assert!(
            matches!(e, JournalError::Io { .. }) && e.to_string().contains("injected"),
            "{e}"
        );
        assert_eq!(std::fs::metadata(&log).unwrap().len(), len, "not undone");
        let r = replay(&d.join("journal")).unwrap();
        assert_eq!((r.records, r.dropped_bytes, r.gpus[&0].len()), (1, 0, 1));
        assert_eq!(j.load(0).unwrap().len(), 1, "the failed record counts");
        *j.write_hook.lock().unwrap() = None;
        j.save(&book(&[1, 3])).unwrap();
        let r = replay(&d.join("journal")).unwrap();
        assert_eq!((r.records, r.dropped_bytes), (2, 0));
        let jobs: Vec<u64> = r.gpus[&0].iter().map(|e| e.assignment.job_id).collect();
        assert_eq!(jobs, [1, 3]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
