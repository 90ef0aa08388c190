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
//! with every MIG instance and job it describes ([`Durability`]).
//!
//! **Group commit**: concurrent savers share one `write` and one
//! `fdatasync`. The log file is owned by one writer thread; a saver sends
//! it the record and waits for the answer, and the writer takes every
//! record queued while it was writing the previous batch into the next one
//! (`docs/reliability.md` has the measurements that motivated this; the
//! previous format rewrote a file per GPU with fsync + rename + directory
//! fsync on every change). No lock: the thread owns the file, the sequence
//! numbers and the durable state, and callers reach them only by message.
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

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

/// Writes one batch at the end of the log. Production writes it whole;
/// tests pass their own at construction ([`Journal::open_with`]) to hold
/// the writer or fail a write, so no test switch lives in the writer.
type WriteFn = Box<dyn FnMut(&File, &[u8]) -> std::io::Result<()> + Send>;

/// The journal directory, shared by every GPU.
///
/// The log file belongs to one writer thread (an I/O actor at the edge,
/// like the XID watcher): savers hand it their record over a channel and
/// wait for its answer, and it writes everything queued meanwhile in one
/// `write` + `fdatasync`, so concurrent savers share a sync (group commit)
/// without sharing a lock. It alone numbers the records, appends them and
/// keeps the durable state that a compaction snapshots.
pub struct Journal {
    dir: PathBuf,
    durability: Durability,
    log_path: PathBuf,
    to_writer: Sender<Request>,
    counts: Arc<Counts>,
    /// Joined on drop, so that the file is closed when the journal is.
    writer: Option<JoinHandle<()>>,
}

/// What a caller asks the writer thread.
enum Request {
    /// "GPU `gpu` has exactly `entries`": answered once it is durable (or
    /// failed).
    Commit {
        gpu: u32,
        entries: Vec<Entry>,
        done: SyncSender<Result<(), JournalError>>,
    },
    /// The durable assignments of `gpu`.
    Load {
        gpu: u32,
        reply: SyncSender<Vec<Entry>>,
    },
    /// Finish what is queued and end (the journal is dropped).
    Stop,
}

/// Counters the writer keeps for the callers to read (atomics: telling
/// them needs no turn of the writer's).
#[derive(Default)]
struct Counts {
    /// Records handed to the writer since open.
    sent: AtomicU64,
    /// Batches written (one `write` + one `fdatasync` each) since open.
    syncs: AtomicU64,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("dir", &self.dir).finish()
    }
}

impl Journal {
    /// Opens (creating it 0700) the journal in `dir`, replays it, drops a
    /// torn tail, compacts everything into a fresh snapshot and starts its
    /// writer thread.
    pub fn open(dir: &Path) -> Result<Journal, JournalError> {
        Journal::open_with(dir, Box::new(|mut log: &File, batch| log.write_all(batch)))
    }

    /// [`Journal::open`], with `write` appending each batch.
    fn open_with(dir: &Path, write: WriteFn) -> Result<Journal, JournalError> {
        let dir = dir.to_path_buf();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| JournalError::Io { path, source }
        };
        ensure_dir(&dir, 0o700).map_err(io(&dir))?;
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
        let log = open_log(&log_path).map_err(io(&log_path))?;
        let durability = Durability::of(&dir);
        let counts = Arc::new(Counts::default());
        let mut writer = Writer {
            dir: dir.clone(),
            log_path: log_path.clone(),
            log,
            durability,
            write,
            seq: r.seq,
            durable: r.gpus,
            log_len: r.log_len,
            failed: None,
            counts: counts.clone(),
        };
        writer.compact()?;
        // Version 1 files are now in the snapshot.
        for (_, path) in v1_files(&dir).unwrap_or_default() {
            let _ = std::fs::remove_file(path);
        }
        let (to_writer, requests) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("journal".into())
            .spawn(move || writer.run(&requests))
            .map_err(io(&log_path))?;
        Ok(Journal {
            dir,
            durability,
            log_path,
            to_writer,
            counts,
            writer: Some(thread),
        })
    }

    /// The error of a journal whose writer thread is gone (it panicked).
    fn writer_gone(&self) -> JournalError {
        JournalError::Failed {
            path: self.log_path.clone(),
            message: "the journal's writer thread stopped".into(),
        }
    }

    /// The assignments recorded for `gpu` (none if it has no record): what
    /// a replay would give now. Read at start, before the books hold them;
    /// from then on the books' GPU state is the truth and the journal its
    /// durable copy.
    pub fn load(&self, gpu: u32) -> Result<Vec<Entry>, JournalError> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.to_writer
            .send(Request::Load { gpu, reply })
            .map_err(|_| self.writer_gone())?;
        answer.recv().map_err(|_| self.writer_gone())
    }

    /// What an acknowledged record survives.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Batches written (one `write` + one `fdatasync` each) since open.
    pub fn syncs(&self) -> u64 {
        self.counts.syncs.load(Ordering::Acquire)
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
    /// disk (on a tmpfs: written), together with every record queued
    /// meanwhile (group commit). Records of one GPU are written in the
    /// order they are committed: its books' transaction serialises them.
    pub fn commit(&self, gpu: u32, entries: Vec<Entry>) -> Result<(), JournalError> {
        let (done, answer) = mpsc::sync_channel(1);
        self.to_writer
            .send(Request::Commit { gpu, entries, done })
            .map_err(|_| self.writer_gone())?;
        self.counts.sent.fetch_add(1, Ordering::AcqRel);
        answer.recv().map_err(|_| self.writer_gone())?
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        // Queued records are still written: their savers wait for them.
        let _ = self.to_writer.send(Request::Stop);
        if let Some(thread) = self.writer.take() {
            if thread.join().is_err() {
                tracing::error!(dir = %self.dir.display(), "the journal's writer thread panicked");
            }
        }
    }
}

/// Opens (creating it 0600) the log for appending.
fn open_log(path: &Path) -> std::io::Result<File> {
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .mode(0o600)
        .open(path)?;
    // `mode` applies only to a new file: tighten one left with looser
    // permissions (created by hand or by an older version).
    log.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(log)
}

/// One record waiting in a batch, with the saver waiting for it.
struct Pending {
    gpu: u32,
    entries: Vec<Entry>,
    done: SyncSender<Result<(), JournalError>>,
}

/// The writer thread's state: the only owner of the log file.
struct Writer {
    dir: PathBuf,
    log_path: PathBuf,
    log: File,
    durability: Durability,
    write: WriteFn,
    /// Sequence number of the last record on disk.
    seq: u64,
    /// The durable state (what a replay would give), for compaction.
    durable: BTreeMap<u32, Vec<Entry>>,
    log_len: u64,
    /// Set when a failed write could not be undone: the log's tail is
    /// unknown, so nothing more is written until a restart replays it.
    failed: Option<String>,
    counts: Arc<Counts>,
}

impl Writer {
    /// Serves requests until [`Request::Stop`] or until every sender is
    /// gone: takes the first one waiting, then everything queued behind
    /// it, and writes their records as one batch.
    fn run(mut self, requests: &Receiver<Request>) {
        let mut stop = false;
        while !stop {
            let Ok(first) = requests.recv() else { return };
            let mut batch = Vec::new();
            let mut next = Some(first);
            while let Some(request) = next {
                match request {
                    Request::Commit { gpu, entries, done } => {
                        batch.push(Pending { gpu, entries, done });
                    }
                    Request::Load { gpu, reply } => {
                        // Whoever saw its commit answered finds it here.
                        let entries = self.durable.get(&gpu).cloned().unwrap_or_default();
                        let _ = reply.send(entries);
                    }
                    Request::Stop => stop = true,
                }
                next = requests.try_recv().ok();
            }
            if !batch.is_empty() {
                self.commit(batch);
            }
        }
    }

    /// Writes `batch` (one `write`, one `fdatasync` on disk) and answers
    /// each of its savers.
    fn commit(&mut self, batch: Vec<Pending>) {
        if let Some(message) = &self.failed {
            for p in batch {
                let _ = p.done.send(Err(JournalError::Failed {
                    path: self.log_path.clone(),
                    message: message.clone(),
                }));
            }
            return;
        }
        let (records, savers): (Vec<Record>, Vec<_>) = batch
            .into_iter()
            .zip(self.seq + 1..)
            .map(|(p, seq)| {
                let record = Record {
                    seq,
                    gpu: p.gpu,
                    entries: p.entries,
                };
                (record, p.done)
            })
            .unzip();
        let mut bytes = Vec::new();
        for r in &records {
            bytes.extend_from_slice(&encode(r));
        }
        let written = self.append(&bytes);
        self.counts.syncs.fetch_add(1, Ordering::AcqRel);
        let outcome = match written {
            Ok(()) => {
                self.applied(records, bytes.len() as u64);
                Ok(())
            }
            Err(e) => Err(self.undo(&e)),
        };
        for done in savers {
            let _ = done.send(match &outcome {
                Ok(()) => Ok(()),
                Err(message) => Err(JournalError::Io {
                    path: self.log_path.clone(),
                    source: std::io::Error::other(message.clone()),
                }),
            });
        }
    }

    /// Appends `bytes` and makes them durable (on a tmpfs: written).
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        (self.write)(&self.log, bytes)?;
        match self.durability {
            Durability::Disk => self.log.sync_data(),
            Durability::Memory => Ok(()),
        }
    }

    /// Takes `records` (`len` bytes, now durable) into the durable state,
    /// compacting the log when it grew past [`COMPACT_BYTES`].
    fn applied(&mut self, records: Vec<Record>, len: u64) {
        for r in records {
            self.seq = r.seq;
            self.durable.insert(r.gpu, r.entries);
        }
        self.log_len += len;
        if self.log_len > COMPACT_BYTES {
            if let Err(e) = self.compact() {
                // The log is still valid: keep appending to it.
                tracing::warn!("journal compaction failed: {e}");
            }
        }
    }

    /// Cuts a failed batch off the log again, so that a replay never sees
    /// it; returns the error to answer. If the cut fails too, the journal
    /// stops writing ([`JournalError::Failed`]).
    fn undo(&mut self, e: &std::io::Error) -> String {
        let message = e.to_string();
        tracing::error!("journal write failed: {message}");
        let cut = self
            .log
            .set_len(self.log_len)
            .and_then(|()| self.log.sync_all());
        if let Err(u) = cut {
            self.failed = Some(format!("{message}; undo failed: {u}"));
        }
        message
    }

    /// Writes the durable state as the snapshot and empties the log.
    fn compact(&mut self) -> Result<(), JournalError> {
        write_snapshot(&self.dir, self.seq, self.durable.clone())?;
        self.log
            .set_len(0)
            .and_then(|()| self.log.sync_all())
            .map_err(|source| JournalError::Io {
                path: self.log_path.clone(),
                source,
            })?;
        self.log_len = 0;
        Ok(())
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
                    billed: None,
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
    /// A batch writer that writes, the first time only after the test
    /// released it (holding the writer), signalling when it got there, and
    /// tells the test how many records each batch held.
    fn held_first_write(
        entered: std::sync::mpsc::Sender<()>,
        release: std::sync::mpsc::Receiver<()>,
        sizes: std::sync::mpsc::Sender<usize>,
    ) -> WriteFn {
        let mut first = Some((entered, release));
        Box::new(move |mut log, batch| {
            if let Some((entered, release)) = first.take() {
                entered.send(()).unwrap();
                release.recv().unwrap();
            }
            sizes
                .send(batch.iter().filter(|&&b| b == b'\n').count())
                .unwrap();
            log.write_all(batch)
        })
    }

    /// Group commit, deterministically: while the writer's first write is
    /// held, seven more savers queue; they then go out as one batch, so 8
    /// saves take 2 syncs.
    #[test]
    fn savers_queued_behind_a_held_write_share_one_sync() {
        use std::sync::{mpsc, Arc};
        use std::time::{Duration, Instant};
        let d = dir("group-held");
        let (entered_tx, entered_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel();
        let (sizes_tx, sizes_rx) = mpsc::channel();
        let hook = held_first_write(entered_tx, release_rx, sizes_tx);
        let j = Arc::new(Journal::open_with(&d.join("journal"), hook).unwrap());
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
        while j.counts.sent.load(Ordering::Acquire) < 8 {
            assert!(Instant::now() < deadline, "the savers did not queue");
            std::thread::yield_now();
        }
        assert_eq!(j.syncs(), 0, "the held write already finished");
        release_tx.send(()).unwrap();
        leader.join().unwrap().unwrap();
        for f in followers {
            f.join().unwrap().unwrap();
        }
        assert_eq!(
            j.syncs(),
            2,
            "8 saves: the first one's batch, then one of 7"
        );
        assert_eq!(sizes_rx.try_iter().collect::<Vec<_>>(), [1, 7]);
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
        // The second batch is cut off halfway by a full disk.
        let mut calls = 0;
        let hook: WriteFn = Box::new(move |mut log, batch| {
            calls += 1;
            if calls == 2 {
                log.write_all(&batch[..batch.len() / 2])?;
                return Err(std::io::Error::other("injected: no space left on device"));
            }
            log.write_all(batch)
        });
        let j = Journal::open_with(&d.join("journal"), hook).unwrap();
        let log = d.join("journal/log");
        j.save(&book(&[1])).unwrap();
        let len = std::fs::metadata(&log).unwrap().len();
        let e = j.save(&book(&[1, 2])).unwrap_err();
        assert!(
            matches!(e, JournalError::Io { .. }) && e.to_string().contains("injected"),
            "{e}"
        );
        assert_eq!(std::fs::metadata(&log).unwrap().len(), len, "not undone");
        let r = replay(&d.join("journal")).unwrap();
        assert_eq!((r.records, r.dropped_bytes, r.gpus[&0].len()), (1, 0, 1));
        assert_eq!(j.load(0).unwrap().len(), 1, "the failed record counts");
        j.save(&book(&[1, 3])).unwrap();
        let r = replay(&d.join("journal")).unwrap();
        assert_eq!((r.records, r.dropped_bytes), (2, 0));
        let jobs: Vec<u64> = r.gpus[&0].iter().map(|e| e.assignment.job_id).collect();
        assert_eq!(jobs, [1, 3]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
