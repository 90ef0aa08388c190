//! A small synchronous client of smartmigd (std `UnixStream`, no tokio), for
//! `smartmig status` and the SPANK plugin, which links this library inside
//! slurmstepd and must not start a runtime there.
//!
//! One request per connection; every step is bounded: connect (done on a
//! helper thread so a full backlog cannot hang the caller), write and read
//! timeouts, and a cap on the reply size.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::protocol::{
    AllocateReply, AllocateRequest, ErrorBody, HealthReply, ReleaseReply, ReleaseRequest, Request,
    StatusReply,
};

/// Largest reply accepted (a status of 64 GPUs is ~100 KiB).
pub const MAX_REPLY_BYTES: u64 = 4 * 1024 * 1024;

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
    #[error("smartmigd sent an invalid reply: {0}")]
    Protocol(String),
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

    fn connect(&self) -> Result<UnixStream, ClientError> {
        let (tx, rx) = mpsc::channel();
        let path = self.socket.clone();
        std::thread::spawn(move || {
            let _ = tx.send(UnixStream::connect(&path));
        });
        match rx.recv_timeout(self.connect_timeout) {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(source)) => Err(ClientError::Connect {
                path: self.socket.clone(),
                source,
            }),
            Err(_) => Err(ClientError::ConnectTimeout {
                path: self.socket.clone(),
                ms: self.connect_timeout.as_millis(),
            }),
        }
    }

    /// Sends one raw line (newline added if missing) and returns the raw reply line.
    pub fn raw(&self, line: &str) -> Result<String, ClientError> {
        let mut stream = self.connect()?;
        stream.set_read_timeout(Some(self.io_timeout))?;
        stream.set_write_timeout(Some(self.io_timeout))?;
        stream.write_all(line.as_bytes())?;
        if !line.ends_with('\n') {
            stream.write_all(b"\n")?;
        }
        stream.flush()?;
        let mut reply = String::new();
        BufReader::new((&stream).take(MAX_REPLY_BYTES)).read_line(&mut reply)?;
        if reply.is_empty() {
            return Err(ClientError::Protocol(
                "connection closed without a reply".into(),
            ));
        }
        Ok(reply)
    }

    /// Sends `request` and returns the reply as JSON, or the daemon's error.
    pub fn request_value(&self, request: &Request) -> Result<Value, ClientError> {
        let reply = self.raw(&request.to_line())?;
        let value: Value = serde_json::from_str(&reply)
            .map_err(|e| ClientError::Protocol(format!("{e}: {}", reply.trim())))?;
        match value.get("ok") {
            Some(Value::Bool(true)) => Ok(value),
            Some(Value::Bool(false)) => {
                let body: ErrorBody = value
                    .get("error")
                    .cloned()
                    .and_then(|e| serde_json::from_value(e).ok())
                    .ok_or_else(|| {
                        ClientError::Protocol(format!("error without a body: {}", reply.trim()))
                    })?;
                Err(ClientError::Daemon(body))
            }
            _ => Err(ClientError::Protocol(format!(
                "no `ok` field: {}",
                reply.trim()
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

    pub fn status(&self) -> Result<StatusReply, ClientError> {
        self.request(&Request::Status)
    }

    pub fn health(&self) -> Result<HealthReply, ClientError> {
        self.request(&Request::Health)
    }
}
