//! `smartmig-client`: how anything talks to `smartmigd`.
//!
//! - [`protocol`]: the wire types (one JSON object per line each way) and
//!   the request parser the daemon uses, so both ends agree on every byte.
//! - [`client`]: the blocking Unix-socket client (connect and I/O
//!   timeouts, bounded replies) used by the SPANK plugin, `smartmig
//!   status/release/reconcile` and the tests.
//! - [`told`]: the `smartmig-requeued:` word of a requeued job's
//!   `AdminComment` and the line its next run prints (issue 56).
//! - [`plugstack`]: the SPANK plugin's `plugstack.conf` arguments, parsed
//!   by the plugin and checked by `smartmig doctor`.
//!
//! It depends on serde alone, so the SPANK plugin that slurmstepd loads as
//! root into every job links no async runtime, no ML or GPU library.

#![forbid(unsafe_code)]
// The house rule: no function over 100 lines (clippy counts the lines of code).
#![warn(clippy::too_many_lines)]

pub mod client;
pub mod plugstack;
pub mod protocol;
pub mod told;

pub use client::{Client, ClientError};
pub use protocol::{ErrorKind, Request};
