//! The bottom of the server: what every layer may name. The daemon's
//! parts ([`Daemon`]), what a request or an epoch works with ([`Cx`]), the
//! node ([`NodeId`]), a connection's peer ([`Peer`]) and the clock. It
//! imports no other server module but the books, the services and the
//! settings it composes.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use super::books::{Books, Decider};
use super::live::{Live, Settings};
use super::services::Services;
use crate::config::Config;

pub(super) use super::clock::{unix_now, unix_now_f64};

/// The node this daemon serves, and its lifetime.
pub(super) struct NodeId {
    /// The node's Slurm name (`node_name`, else the host name).
    pub name: String,
    pub started: Instant,
    /// Set once, at SIGTERM/SIGINT: waiting allocates give up, loops stop.
    pub shutdown: watch::Sender<bool>,
}

/// The running daemon: the composition of its parts. It has no behaviour
/// of its own beyond handing each request and epoch a [`Cx`].
pub struct Daemon {
    pub(super) settings: Settings,
    pub(super) books: Books,
    pub(super) svc: Services,
    pub(super) node: NodeId,
}

/// What a request or an epoch works with: the books, the services, one
/// snapshot of the settings and the decider built from them (a SIGHUP
/// meanwhile takes effect at the next request or epoch).
pub(super) struct Cx<'a> {
    pub books: &'a Books,
    pub svc: &'a Services,
    pub live: Arc<Live>,
    /// The policy, the fallback and the placement rule of `live`'s
    /// configuration (their state is the books').
    pub decider: Arc<Decider>,
    pub node: &'a NodeId,
}

impl Cx<'_> {
    pub(super) fn cfg(&self) -> &Config {
        &self.live.config
    }
}

/// The peer of a connection, from `SO_PEERCRED`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Peer {
    pub uid: u32,
    pub pid: Option<i32>,
}

impl Daemon {
    pub(super) fn cx(&self) -> Cx<'_> {
        let (live, decider) = self.books.in_effect(|| self.settings.current());
        Cx {
            books: &self.books,
            svc: &self.svc,
            live,
            decider,
            node: &self.node,
        }
    }
}
