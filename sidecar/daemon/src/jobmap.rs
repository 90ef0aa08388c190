//! dcgm-exporter's HPC job mapping (`hpc_job_mapping_dir`): one file per
//! GPU and per GPU instance naming the Slurm jobs running there, so that
//! DCGM's series get an `hpc_job` label.
//!
//! The format is the exporter's (NVIDIA/dcgm-exporter
//! `internal/pkg/transformation/hpc.go`, read at commit 2623f7a; see
//! docs/daemon.md "DCGM job mapping"): a file's name is the GPU's index
//! (`0`), or `<gpu>.<GPU instance id>` (`0.7`) for a MIG instance (the
//! exporter reads only names matching `^\d+(\.\d+)?$`), and it holds one
//! job id per line. The exporter re-reads the directory at every scrape.
//!
//! [`wanted`] is pure (what one GPU's files should say); [`JobMap::sync`]
//! makes the directory say it: each file written whole through a temporary
//! dot-file and a rename (the exporter never reads half a file, nor the
//! temporary one), stale files of that GPU removed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::allocate::GpuBook;
use crate::fsutil::{atomic_write_mode, remove_if_present};

/// The mapping files one GPU should have now: file name -> content. The
/// GPU's own file lists every job on it, in order (its GPU-wide series, power for
/// one, are shared); each busy instance's file lists its job.
pub fn wanted(book: &GpuBook) -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    let mut gpu_jobs = std::collections::BTreeSet::new();
    for inst in &book.instances {
        let Some(a) = &inst.job else { continue };
        gpu_jobs.insert(a.job_id);
        if let Some(gi) = inst.gi {
            files.insert(format!("{}.{gi}", book.index), format!("{}\n", a.job_id));
        }
    }
    if !gpu_jobs.is_empty() {
        let lines: String = gpu_jobs.iter().map(|j| format!("{j}\n")).collect();
        files.insert(book.index.to_string(), lines);
    }
    files
}

/// Whether `name` is a mapping file of GPU `gpu` (`<gpu>` or `<gpu>.<n>`).
fn belongs_to(name: &str, gpu: u32) -> bool {
    let (head, tail) = name.split_once('.').unwrap_or((name, "0"));
    head.parse::<u32>() == Ok(gpu)
        && head.bytes().all(|b| b.is_ascii_digit())
        && !tail.is_empty()
        && tail.bytes().all(|b| b.is_ascii_digit())
}

/// The directory the exporter watches.
pub struct JobMap {
    dir: PathBuf,
}

impl JobMap {
    pub fn new(dir: &Path) -> JobMap {
        JobMap {
            dir: dir.to_path_buf(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes `book`'s GPU's files in the directory match [`wanted`]:
    /// writes what changed (mode 0644: the exporter may not run as root),
    /// removes that GPU's files no job needs any more. Creates the
    /// directory (0755) when it is missing.
    pub fn sync(&self, book: &GpuBook) -> std::io::Result<()> {
        let want = wanted(book);
        if !self.dir.is_dir() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .create(&self.dir)?;
        }
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let Some(name) = name.to_str() else { continue };
            if belongs_to(name, book.index) && !want.contains_key(name) {
                remove_if_present(&self.dir.join(name))?;
            }
        }
        for (name, content) in &want {
            let path = self.dir.join(name);
            if std::fs::read_to_string(&path).ok().as_deref() != Some(content.as_str()) {
                atomic_write_mode(&path, content.as_bytes(), 0o644)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::{Geometry, GpuModel};

    /// GPU 2 (A100-40GB) with a busy 3g (GI 1), a busy 1g (GI 11) and an
    /// idle 1g.
    fn book() -> GpuBook {
        let g = Geometry::of(GpuModel::A100_40gb);
        let mut b = GpuBook::new(2, g, 0);
        for (name, start, uuid) in [
            ("3g.20gb", 0, "MIG-a"),
            ("1g.5gb", 4, "MIG-b"),
            ("1g.5gb", 5, "MIG-c"),
        ] {
            let id = g
                .ids()
                .find(|&id| {
                    let p = g.spot(id);
                    p.profile.name() == name && p.start == start
                })
                .unwrap();
            b.add_instance(id, uuid.into(), 0);
            b.set_gpu_instance_id(uuid, Some(g.gpu_instance_id(id)));
        }
        b.assign("MIG-a", crate::allocate::test_assignment(41));
        b.assign("MIG-b", crate::allocate::test_assignment(42));
        b
    }

    #[test]
    fn one_file_per_busy_instance_and_one_for_the_gpu() {
        let w = wanted(&book());
        let got: Vec<(&str, &str)> = w.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, [("2", "41\n42\n"), ("2.1", "41\n"), ("2.11", "42\n")]);
    }

    #[test]
    fn names_follow_the_exporters_pattern() {
        assert!(belongs_to("2", 2) && belongs_to("2.11", 2));
        for other in ["3", "3.1", "2.", ".2.1.tmp", "2.x", "+2", "20.1", "x"] {
            assert!(!belongs_to(other, 2), "{other}");
        }
    }

    #[test]
    fn sync_writes_then_removes() {
        let dir = std::env::temp_dir().join(format!("smartmig-jobmap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let map = JobMap::new(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("2.5"), "stale\n").unwrap();
        std::fs::write(dir.join("3.1"), "other gpu\n").unwrap();
        let mut b = book();
        map.sync(&b).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["2", "2.1", "2.11", "3.1"]);
        assert_eq!(std::fs::read_to_string(dir.join("2.11")).unwrap(), "42\n");
        b.release(41, 1);
        b.release(42, 1);
        map.sync(&b).unwrap();
        assert!(!dir.join("2").exists() && !dir.join("2.1").exists());
        assert!(dir.join("3.1").exists(), "another GPU's file is left alone");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
