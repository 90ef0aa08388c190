//! Who may do what: root and `slurm_user` write (allocate, release,
//! reconcile, apply), they and the `operators` see every job in `status`,
//! and unprivileged users hold a bounded number of connections.

use super::books::Connections;
use crate::config::Config;

/// The uids with rights beyond an ordinary user's, resolved from the
/// config.
#[derive(Clone, Debug, Default)]
pub(super) struct Roles {
    /// The uid of `slurm_user` (allowed to write besides root).
    pub slurm_uid: Option<u32>,
    /// `operators`, resolved: they see every job in `status`.
    pub operators: Vec<u32>,
}

impl Roles {
    pub(super) fn of(config: &Config) -> Roles {
        Roles {
            slurm_uid: resolve_uid(&config.slurm_user),
            operators: config
                .operators
                .iter()
                .filter_map(|u| {
                    let uid = resolve_uid(u);
                    if uid.is_none() {
                        tracing::warn!(operator = %u, "operators: no such user; ignored");
                    }
                    uid
                })
                .collect(),
        }
    }

    /// Root and `slurm_user` may allocate, release, reconcile and apply.
    pub(super) fn may_write(&self, uid: u32) -> bool {
        uid == 0 || self.slurm_uid == Some(uid)
    }

    /// Whether `uid` sees every job in `status` and `plan`: root, the Slurm
    /// user and the configured `operators` (others get a redacted reply,
    /// [`super::redact`]).
    pub(super) fn sees_everything(&self, uid: u32) -> bool {
        self.may_write(uid) || self.operators.contains(&uid)
    }
}

/// The uid allowed to write besides root, from a user name or a number.
fn resolve_uid(user: &str) -> Option<u32> {
    if let Ok(uid) = user.parse::<u32>() {
        return Some(uid);
    }
    match nix::unistd::User::from_name(user) {
        Ok(Some(u)) => Some(u.uid.as_raw()),
        Ok(None) => {
            tracing::warn!(
                slurm_user = user,
                "slurm_user does not exist; only root may allocate/release"
            );
            None
        }
        Err(e) => {
            tracing::warn!(
                slurm_user = user,
                "cannot look up slurm_user ({e}); only root may allocate/release"
            );
            None
        }
    }
}

/// The user name of `uid` (the user part of a memory key, the usage log),
/// or the uid as text when it has none. May ask NSS (LDAP, SSSD): call it
/// in a blocking section.
pub(super) fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => u.name,
        _ => uid.to_string(),
    }
}

impl Connections {
    /// Takes a connection place for unprivileged `uid`, or says why not
    /// (`max_connections_per_user`, `max_connections`). Root and
    /// `slurm_user` are never counted nor refused.
    pub(super) fn admit(
        &self,
        uid: u32,
        roles: &Roles,
        cfg: &Config,
    ) -> Result<Option<Admitted>, String> {
        if roles.may_write(uid) {
            return Ok(None);
        }
        self.with(|c| {
            let mine = c.per_uid.get(&uid).copied().unwrap_or(0);
            if mine >= cfg.max_connections_per_user {
                return Err(format!(
                    "uid {uid} holds {mine} connections (max_connections_per_user {})",
                    cfg.max_connections_per_user
                ));
            }
            if c.total >= cfg.max_connections {
                return Err(format!(
                    "unprivileged users hold {} connections (max_connections {})",
                    c.total, cfg.max_connections
                ));
            }
            c.total += 1;
            *c.per_uid.entry(uid).or_default() += 1;
            Ok(Some(Admitted {
                connections: self.clone(),
                uid,
            }))
        })
    }
}

/// One admitted unprivileged connection; gives its place back when dropped.
pub(super) struct Admitted {
    connections: Connections,
    uid: u32,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.connections.with(|c| {
            c.total = c.total.saturating_sub(1);
            if let Some(n) = c.per_uid.get_mut(&self.uid) {
                *n -= 1;
                if *n == 0 {
                    c.per_uid.remove(&self.uid);
                }
            }
        });
    }
}
