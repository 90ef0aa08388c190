//! `smartmigd`, the per-node sidecar daemon: it owns the node's MIG layout,
//! turns "K slices on GPU i" requests from the SPANK plugin into MIG
//! instances, and re-shapes idle instances with a repartitioning policy.
//!
//! Functional core, imperative shell:
//!
//! | module | role | IO? |
//! |---|---|---|
//! | [`protocol`] | wire types (newline-delimited JSON), request parser (crate `smartmig-client`, re-exported) | no |
//! | [`config`] | TOML config, defaults, validation naming the key | reads the file |
//! | [`policy_choice`] | which repartitioning policy runs, from the config (shared by validation and the server) | loads a policy file |
//! | [`shadow`] | `[shadow]` settings; the node's day as simulator jobs, replayed to choose between the policy and its fallback | no |
//! | [`allocate`] | the allocation decision on one GPU ([`allocate::GpuBook`]) | no |
//! | [`health`] | what an NVML XID means for a GPU or a MIG instance, one GPU's health marks, the node's drain | no |
//! | [`placement`] | which waiting allocate goes first, and which profile it gets (the `placement` setting) | loads a placement file |
//! | [`access`] | device isolation: an instance's access files belong to its job's user, or to root | chown/chmod |
//! | [`backend`] | MIG backends: `sim` (persisted) and `nvml` | yes |
//! | [`journal`] | durable job -> instance assignments | yes |
//! | [`memory`] | learned memory estimates, out-of-memory ledger | `memory.json` |
//! | [`slurm`] | `squeue`/`sinfo`/`scontrol` behind [`slurm::SlurmClient`] | yes |
//! | [`hostlist`] | Slurm host lists (`gpu[01-03,07]`), read by the Slurm client and the grant check | no |
//! | [`metrics`] | Prometheus families | no |
//! | [`server`] | socket, peer credentials, per-GPU locks, signals, loops | yes |
//! | [`client`] | synchronous client for the CLI and the SPANK plugin (crate `smartmig-client`) | yes |
//!
//! Geometry (profiles, placements, re-shaping) comes from `smartmig-mig` and
//! policies from `smartmig-core`: the daemon decides exactly as the
//! simulator does. `docs/daemon.md` is the operator's guide and
//! `docs/protocol.md` the wire reference.

// The house rule: no function over 100 lines (clippy counts the lines of code).
#![warn(clippy::too_many_lines)]

pub mod access;
pub mod allocate;
pub mod backend;
pub mod config;
pub mod fsutil;
pub mod grant;
pub mod health;
pub mod holds;
pub mod hostlist;
pub mod jobmap;
pub mod journal;
pub mod make_room;
pub mod memory;
pub mod metrics;
pub mod placement;
pub mod plan;
pub mod policy_choice;
pub mod server;
pub mod shadow;
pub mod slurm;
pub mod summary;
pub mod usage;

pub use smartmig_client::{client, plugstack, protocol};

// The core crates under the names the modules use (`crate::policy::...` is the core's).
use smartmig_core::{formats, policy, sim, workload};
use smartmig_mig as mig;

pub use client::{Client, ClientError};
pub use config::Config;
pub use protocol::{ErrorKind, Request};
