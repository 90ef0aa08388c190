//! A small synchronous client of smartmigd (std `UnixStream`, no tokio), for
//! `smartmig status` and the SPANK plugin, which links this library inside
//! slurmstepd and must not start a runtime there.
//!
//! One request per connection; every step is bounded: connect (so a full
//! backlog cannot hang the caller), the write, the
//! whole reply (one deadline, so a peer that trickles a byte now and then
//! cannot hold the caller), and the reply size. Error messages quote at
//! most [`QUOTE_BYTES`] of a bad reply.

use std::io::{ErrorKind as IoErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::Value;
use socket2::{Domain, SockAddr, Socket, Type};

use crate::protocol::{
    AllocateReply, AllocateRequest, ApplyRequest, ErrorBody, HealthReply, PlanReply, PlanStatus,
    ReconcileReply, ReleaseReply, ReleaseRequest, Request, StatusReply,
};

/// Largest reply accepted (a status of 64 GPUs is ~100 KiB).
pub const MAX_REPLY_BYTES: u64 = 4 * 1024 * 1024;

/// Most bytes of a bad reply quoted in an error message (the message ends
/// up in a job's output and in slurmd.log).
pub const QUOTE_BYTES: usize = 200;

/// `reply` trimmed and cut to [`QUOTE_BYTES`] (on a char boundary), with
/// its full length when cut.
fn quote(reply: &str) -> String {
    let t = reply.trim();
    if t.len() <= QUOTE_BYTES {
        return t.to_string();
    }
    let mut end = QUOTE_BYTES;
    while !t.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &t[..end], reply.len())
}

/// What can go wrong talking to the daemon.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to smartmigd at {path}: {source} (is smartmigd running?)")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("connecting to smartmigd at {path} timed out after {ms} ms")]
    ConnectTimeout { path: PathBuf, ms: u128 },
    #[error("talking to smartmigd: {0}")]
    Io(#[from] std::io::Error),
    /// No complete reply within the I/O timeout.
    #[error("no reply from smartmigd within {ms} ms (request timed out)")]
    Timeout { ms: u128 },
    #[error("smartmigd sent an invalid reply: {0}")]
    Protocol(String),
    /// The daemon closed the connection (or it was reset) before a reply:
    /// smartmigd stopped or crashed mid-request. Whether the request took
    /// effect is unknown; allocate and release are idempotent per job and
    /// step, so the plugin asks again (`sidecar_wait`).
    #[error("smartmigd closed the connection without a reply (it stopped or crashed mid-request)")]
    Dropped,
    /// The daemon answered with an error (see [`ErrorBody::kind`]).
    #[error("smartmigd: {0}")]
    Daemon(ErrorBody),
}

/// A client bound to one socket path.
#[derive(Clone, Debug)]
pub struct Client {
    pub socket: PathBuf,
    pub connect_timeout: Duration,
    /// Read/write timeout; must exceed the daemon's `allocate_wait_s` for allocates.
    pub io_timeout: Duration,
}

impl Client {
    pub fn new(socket: impl AsRef<Path>) -> Self {
        Client {
            socket: socket.as_ref().to_path_buf(),
            connect_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(60),
        }
    }

    pub fn with_io_timeout(mut self, t: Duration) -> Self {
        self.io_timeout = t;
        self
    }

    /// Connects with `SO_SNDTIMEO` set first: on a Unix socket whose
    /// backlog is full, `connect(2)` waits for room only that long and then
    /// fails with `EAGAIN` (socket(7)), so a stuck daemon cannot hang the
    /// caller, and no helper thread is started per request (slurmstepd
    /// runs this once per job step; a thread cost ~30 us and a fifth of
    /// the client's CPU time in `smartmig bench daemon`).
    fn connect(&self) -> Result<UnixStream, ClientError> {
        let failed = |source: std::io::Error| ClientError::Connect {
            path: self.socket.clone(),
            source,
        };
        let socket = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(failed)?;
        let address = SockAddr::unix(&self.socket).map_err(failed)?;
        socket
            .set_write_timeout(Some(self.connect_timeout))
            .map_err(failed)?;
        match socket.connect(&address) {
            Ok(()) => Ok(UnixStream::from(std::os::fd::OwnedFd::from(socket))),
            Err(e) if matches!(e.kind(), IoErrorKind::WouldBlock | IoErrorKind::TimedOut) => {
                Err(ClientError::ConnectTimeout {
                    path: self.socket.clone(),
                    ms: self.connect_timeout.as_millis(),
                })
            }
            Err(source) => Err(failed(source)),
        }
    }

    /// Sends one raw line (newline added if missing) and returns the raw reply
    /// line. The write and the whole reply share one deadline of `io_timeout`.
    pub fn raw(&self, line: &str) -> Result<String, ClientError> {
        let mut stream = self.connect()?;
        let deadline = Instant::now() + self.io_timeout;
        let ms = self.io_timeout.as_millis();
        let io = |e: std::io::Error| match e.kind() {
            IoErrorKind::WouldBlock | IoErrorKind::TimedOut => ClientError::Timeout { ms },
            IoErrorKind::ConnectionReset
            | IoErrorKind::ConnectionAborted
            | IoErrorKind::BrokenPipe => ClientError::Dropped,
            _ => ClientError::Io(e),
        };
        stream.set_write_timeout(Some(self.io_timeout))?;
        let mut out = line.as_bytes().to_vec();
        if !line.ends_with('\n') {
            out.push(b'\n');
        }
        stream.write_all(&out).map_err(io)?;
        stream.flush().map_err(io)?;
        let mut reply: Vec<u8> = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClientError::Timeout { ms });
            }
            stream.set_read_timeout(Some(left))?;
            let n = match stream.read(&mut chunk) {
                Ok(n) => n,
                Err(e) if e.kind() == IoErrorKind::Interrupted => continue,
                Err(e) => return Err(io(e)),
            };
            if n == 0 {
                break;
            }
            if let Some(pos) = chunk[..n].iter().position(|&b| b == b'\n') {
                reply.extend_from_slice(&chunk[..=pos]);
                break;
            }
            reply.extend_from_slice(&chunk[..n]);
            if reply.len() as u64 > MAX_REPLY_BYTES {
                return Err(ClientError::Protocol(format!(
                    "reply longer than {MAX_REPLY_BYTES} bytes, starting `{}`",
                    String::from_utf8_lossy(&reply[..QUOTE_BYTES])
                )));
            }
        }
        if reply.is_empty() {
            return Err(ClientError::Dropped);
        }
        String::from_utf8(reply).map_err(|e| {
            ClientError::Protocol(format!(
                "reply is not UTF-8: {}",
                quote(&String::from_utf8_lossy(e.as_bytes()))
            ))
        })
    }

    /// Sends `request` and returns the reply as JSON, or the daemon's error.
    pub fn request_value(&self, request: &Request) -> Result<Value, ClientError> {
        let reply = self.raw(&request.to_line())?;
        let value: Value = serde_json::from_str(&reply)
            .map_err(|e| ClientError::Protocol(format!("{e}: {}", quote(&reply))))?;
        match value.get("ok") {
            Some(Value::Bool(true)) => Ok(value),
            Some(Value::Bool(false)) => {
                let body: ErrorBody = value
                    .get("error")
                    .cloned()
                    .and_then(|e| serde_json::from_value(e).ok())
                    .ok_or_else(|| {
                        ClientError::Protocol(format!("error without a body: {}", quote(&reply)))
                    })?;
                Err(ClientError::Daemon(body))
            }
            _ => Err(ClientError::Protocol(format!(
                "no `ok` field: {}",
                quote(&reply)
            ))),
        }
    }

    fn request<T: DeserializeOwned>(&self, request: &Request) -> Result<T, ClientError> {
        let v = self.request_value(request)?;
        serde_json::from_value(v).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    pub fn allocate(&self, req: AllocateRequest) -> Result<AllocateReply, ClientError> {
        self.request(&Request::Allocate(req))
    }

    pub fn release(&self, job_id: u64) -> Result<ReleaseReply, ClientError> {
        self.release_with(ReleaseRequest::new(job_id))
    }

    /// A release with the optional fields (`oom`, `used_memory_gb`).
    pub fn release_with(&self, req: ReleaseRequest) -> Result<ReleaseReply, ClientError> {
        self.request(&Request::Release(req))
    }

    /// Asks the daemon to read Slurm's queue now and release the
    /// instances of ended jobs.
    pub fn reconcile(&self) -> Result<ReconcileReply, ClientError> {
        self.request(&Request::Reconcile)
    }

    /// The plans the policy wants (pending) and made (applied).
    pub fn plan(&self) -> Result<PlanReply, ClientError> {
        self.request(&Request::Plan)
    }

    /// Carries out pending plan `plan` (root and slurm_user).
    pub fn apply(&self, plan: u64) -> Result<PlanStatus, ClientError> {
        self.request(&Request::Apply(ApplyRequest { plan }))
    }

    pub fn status(&self) -> Result<StatusReply, ClientError> {
        self.request(&Request::Status)
    }

    pub fn health(&self) -> Result<HealthReply, ClientError> {
        self.request(&Request::Health)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A daemon that never accepts: once its backlog is full the connect
    /// gives up after `connect_timeout` with `ConnectTimeout`, instead of
    /// hanging the job step. Connecting to nothing is `Connect`.
    #[test]
    fn a_full_backlog_times_out_and_a_missing_socket_is_named() {
        let dir = std::env::temp_dir().join(format!("smartmig-client-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("full.sock");
        let _ = std::fs::remove_file(&path);
        let listener = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
        listener.bind(&SockAddr::unix(&path).unwrap()).unwrap();
        listener.listen(1).unwrap();
        let mut client = Client::new(&path);
        client.connect_timeout = Duration::from_millis(100);
        let mut held = Vec::new();
        let outcome = loop {
            match client.connect() {
                Ok(s) if held.len() < 64 => held.push(s),
                Ok(_) => panic!("64 connections queued on a backlog of 1"),
                Err(e) => break e,
            }
        };
        assert!(
            matches!(outcome, ClientError::ConnectTimeout { ms: 100, .. }),
            "{outcome}"
        );
        assert!(!held.is_empty(), "the backlog took no connection at all");
        let missing = Client::new(dir.join("absent.sock")).connect().unwrap_err();
        assert!(
            matches!(missing, ClientError::Connect { .. })
                && missing.to_string().contains("absent.sock"),
            "{missing}"
        );
        drop(listener);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
