//! smartmigd's journal of assignments (job -> instance) in
//! `<journal_dir>/`: what its files hold and how a log line is framed. The
//! daemon's `journal` module does the IO (group commit, snapshots,
//! compaction, moving the directory); this is the format it writes and
//! replays.
//!
//! Files:
//! - [`SNAPSHOT_FILE`], the state after record `seq` ([`Snapshot`]):
//!   `{"version":2,"seq":N,"gpus":{"0":[entries],...}}`;
//! - [`LOG_FILE`]: records with `seq > snapshot.seq`, one per line,
//!   `<crc32 of the JSON, 8 hex digits> <JSON>\n` ([`encode`], [`decode`]);
//!   each record holds one GPU's whole assignment list ([`Record`]), so
//!   replay is "last record per GPU wins";
//! - `gpu<N>.json` ([`FileV1`], [`v1_gpu`]): version 1, one snapshot per
//!   GPU, still read when no snapshot exists.
//!
//! Versions: [`SNAPSHOT_VERSION`] is written; fields added to an
//! [`Assignment`] must be optional (`#[serde(default)]`) so that an older
//! journal replays after an upgrade.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The snapshot's name in the journal directory.
pub const SNAPSHOT_FILE: &str = "snapshot.json";
/// The log's name in the journal directory.
pub const LOG_FILE: &str = "log";
/// The snapshot version written.
pub const SNAPSHOT_VERSION: u32 = 2;

/// Who holds an instance (the daemon's books keep it per instance).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    pub job_id: u64,
    #[serde(default)]
    pub step: Option<u32>,
    pub uid: u32,
    /// Unix seconds when the job got the instance.
    pub since: u64,
    #[serde(default)]
    pub deadline: Option<i64>,
    #[serde(default)]
    pub time_limit_s: Option<u64>,
    /// Seconds the job waited in smartmigd for this instance.
    #[serde(default)]
    pub wait_s: u64,
    /// Shards Slurm billed the job (the allocate's `slices`), fewer than
    /// the instance's compute slices when it was lent a bigger one (issue
    /// 55): the holds count Slurm's free shards from them. `None` (records
    /// before issue 55): the instance's compute slices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub billed: Option<u8>,
}

/// One journaled assignment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub uuid: String,
    pub profile: String,
    pub start: u8,
    #[serde(flatten)]
    pub assignment: Assignment,
}

/// Version 1 per-GPU file (read for migration only).
#[derive(Debug, Deserialize)]
pub struct FileV1 {
    pub entries: Vec<Entry>,
}

/// The snapshot: every GPU's assignments after record `seq`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u32,
    pub seq: u64,
    pub gpus: BTreeMap<u32, Vec<Entry>>,
}

/// One log record: GPU `gpu` now has exactly `entries`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Record {
    pub seq: u64,
    pub gpu: u32,
    pub entries: Vec<Entry>,
}

/// The GPU of a version 1 file name (`gpu<N>.json`).
pub fn v1_gpu(file_name: &str) -> Option<u32> {
    file_name
        .strip_prefix("gpu")
        .and_then(|r| r.strip_suffix(".json"))
        .and_then(|n| n.parse::<u32>().ok())
}

/// CRC-32 (IEEE 802.3, reflected, as zlib) of `bytes`.
pub fn crc32(bytes: &[u8]) -> u32 {
    const fn table() -> [u32; 256] {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    }
    const TABLE: [u32; 256] = table();
    let mut c = !0u32;
    for &b in bytes {
        c = TABLE[((c ^ u32::from(b)) & 0xFF) as usize] ^ (c >> 8);
    }
    !c
}

/// Encodes one record line.
pub fn encode(record: &Record) -> Vec<u8> {
    let json = serde_json::to_string(record).unwrap_or_default();
    let mut line = format!("{:08x} ", crc32(json.as_bytes())).into_bytes();
    line.extend_from_slice(json.as_bytes());
    line.push(b'\n');
    line
}

/// Decodes one record line (without its newline); None if torn or garbled.
pub fn decode(line: &[u8]) -> Option<Record> {
    if line.len() < 10 || line[8] != b' ' {
        return None;
    }
    let crc = u32::from_str_radix(std::str::from_utf8(&line[..8]).ok()?, 16).ok()?;
    let json = &line[9..];
    if crc32(json) != crc {
        return None;
    }
    serde_json::from_slice(json).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_zlib() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn a_line_round_trips_and_a_torn_one_is_refused() {
        let r = Record {
            seq: 3,
            gpu: 1,
            entries: Vec::new(),
        };
        let line = encode(&r);
        assert_eq!(line.last(), Some(&b'\n'));
        let back = decode(&line[..line.len() - 1]).expect("decodes");
        assert_eq!((back.seq, back.gpu), (3, 1));
        assert!(decode(&line[..line.len() - 3]).is_none(), "torn");
        let mut flipped = line.clone();
        flipped[12] ^= 1;
        assert!(decode(&flipped[..flipped.len() - 1]).is_none(), "garbled");
        assert_eq!(v1_gpu("gpu12.json"), Some(12));
        assert_eq!(v1_gpu("snapshot.json"), None);
    }
}
