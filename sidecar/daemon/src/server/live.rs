//! The settings in effect, and what is built from them: one immutable
//! snapshot ([`Live`]) that SIGHUP replaces whole, so a request or an
//! epoch that took it sees the old settings or the new ones, never a mix
//! (say the new Slurm commands with the old policy).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::auth::Roles;
use super::books::{PlacementCell, PolicyCell, SwapCell};
use crate::config::Config;
use crate::placement::PlacementRule;
use crate::policy_choice::Built;
use crate::slurm::{CommandSlurm, NoSlurm, SlurmClient};

/// One snapshot of the settings. Take it once per request or epoch
/// ([`Settings::current`]) and read everything from it.
pub(super) struct Live {
    pub config: Arc<Config>,
    pub slurm: Arc<dyn SlurmClient>,
    /// Who may write and who sees every job.
    pub roles: Roles,
    /// The policy has state of its own (learned, greedy's batching window),
    /// kept in the books' [`PolicyCell`]; a new one comes with a new
    /// snapshot.
    pub policy: PolicyCell,
    pub policy_name: String,
    /// The shadow's fallback and its name, while the shadow is on
    /// (`[shadow]`): it sees every epoch, its decisions apply while the
    /// shadow says it runs ([`super::shadow`]).
    pub fallback: Option<(PolicyCell, String)>,
    /// Which waiting allocate goes first (`placement`), with its own state
    /// in the books' [`PlacementCell`]; asked in a GPU's transaction.
    pub placement: Arc<PlacementCell>,
}

impl Live {
    pub(super) fn new(
        config: Config,
        policy: Built,
        fallback: Option<Built>,
        placement: PlacementRule,
    ) -> Live {
        let (policy, policy_name) = policy;
        Live {
            fallback: fallback.map(|(p, name)| (PolicyCell::new(p), name)),
            placement: Arc::new(PlacementCell::new(placement)),
            slurm: slurm_client(&config),
            roles: Roles::of(&config),
            config: Arc::new(config),
            policy: PolicyCell::new(policy),
            policy_name,
        }
    }

    /// The `placement` rule's name, as status and the log show it.
    pub(super) fn placement_name(&self) -> String {
        self.placement.with(|p| p.name())
    }
}

fn slurm_client(config: &Config) -> Arc<dyn SlurmClient> {
    if config.slurm.enabled {
        Arc::new(CommandSlurm {
            squeue: config.slurm.squeue.clone(),
            sinfo: config.slurm.sinfo.clone(),
            scontrol: config.slurm.scontrol.clone(),
            slurmd: config.slurm.slurmd.clone(),
            salloc: config.slurm.salloc.clone(),
            scancel: config.slurm.scancel.clone(),
            hold_partition: config.slurm.hold_partition.clone(),
            timeout: Duration::from_secs(config.slurm.command_timeout_s),
        })
    } else {
        Arc::new(NoSlurm)
    }
}

/// Where the snapshot lives (a [`SwapCell`] of the books), and the file
/// SIGHUP re-reads.
pub(super) struct Settings {
    live: SwapCell<Live>,
    pub path: PathBuf,
}

impl Settings {
    pub(super) fn new(live: Live, path: PathBuf) -> Settings {
        Settings {
            live: SwapCell::new(live),
            path,
        }
    }

    /// The settings in effect: one snapshot, consistent in itself.
    pub(super) fn current(&self) -> Arc<Live> {
        self.live.current()
    }

    /// Installs a new snapshot in one swap.
    pub(super) fn replace(&self, live: Live) {
        self.live.replace(live);
    }
}
