//! The settings in effect, and what is built from them: one immutable
//! snapshot ([`Live`]) that SIGHUP replaces whole (together with the
//! books' [`super::books::Decider`]), so a request or an epoch that took
//! it sees the old settings or the new ones, never a mix (say the new
//! Slurm commands with the old policy).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::auth::Roles;
use super::books::SwapCell;
use crate::config::Config;
use crate::slurm::{CommandSlurm, NoSlurm, SlurmClient};

/// One snapshot of the settings. Take it once per request or epoch
/// ([`Settings::current`], or with the policy built from it through
/// [`super::books::Books::in_effect`]) and read everything from it. It
/// holds settings only: the policy and the placement rule, which have
/// state of their own, are the books' ([`super::books::Decider`]).
pub(super) struct Live {
    pub config: Arc<Config>,
    pub slurm: Arc<dyn SlurmClient>,
    /// Who may write and who sees every job.
    pub roles: Roles,
}

impl Live {
    pub(super) fn new(config: Config) -> Live {
        Live {
            slurm: slurm_client(&config),
            roles: Roles::of(&config),
            config: Arc::new(config),
        }
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
            release: Default::default(),
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
