//! The files smartmig writes and reads back, one module each, with their
//! versions: the one place a reader looks up a format, and the one
//! definition the writer and every reader share.
//!
//! | format | file | written by | read by | version |
//! |---|---|---|---|---|
//! | [`advice`] | `<state_dir>/advice.jsonl` (`.1` after rotation) | smartmigd in `mode = "advise"` | `smartmig advise report` (the lab's replay) | none: fields added only as optional, kinds added (old readers refuse them by line) |
//! | [`journal`] | `<journal_dir>/snapshot.json` and `log` (`gpu<N>.json` of version 1 still read) | smartmigd | smartmigd (replay at start), tests | snapshot `version` 2; assignment fields added only as optional |
//! | [`summary`] | `<summary_dir>/<node>.json`, one per smartmig node | `smartmig publish` | smartmigd | `version` 1, refused by name when another |
//! | [`policy_file`] | `policies/<model>.onnx`, `<model>-placement.onnx` (metadata in the ONNX `metadata_props`, a copy beside as `.json`) | `smartmig train` | smartmigd, the simulator, `smartmig doctor`, the lab | `format` (`smartmig-policy/1`, `smartmig-placement/1`) and the feature-spec version |
//!
//! Pure data and (de)serialisation: no sockets, no Slurm, no hardware;
//! the IO is the writer's and the reader's, except [`policy_file::read`],
//! which reads the file it is given.

pub mod advice;
pub mod journal;
pub mod policy_file;
pub mod summary;
