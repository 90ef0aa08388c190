//! Which socket the admin commands (`status`, `release`, `reconcile`) talk
//! to: `--socket` when given, else the `socket` of smartmigd's config file
//! (`--config`, default `/etc/smartmig/smartmig.toml` when it exists), else
//! the built-in default. An admin who moved the socket in the config does
//! not have to repeat it on every command.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::daemon::config::Config;
use crate::daemon::protocol::DEFAULT_SOCKET;

/// smartmigd's default config file.
pub const DEFAULT_CONFIG: &str = "/etc/smartmig/smartmig.toml";

#[derive(Debug, Clone, clap::Args)]
pub struct SocketArgs {
    /// smartmigd's socket (default: the `socket` of --config, else
    /// /run/smartmig/smartmig.sock).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// smartmigd's config file, read for its socket path.
    #[arg(long, default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
}

impl SocketArgs {
    /// The socket to use. A config file named with `--config` must be
    /// readable and valid; the default one may be absent, or broken: an
    /// admin's typo in it must not keep every user from asking the running
    /// smartmigd (which keeps its last good config on SIGHUP) for `status`.
    pub fn socket(&self) -> anyhow::Result<PathBuf> {
        if let Some(s) = &self.socket {
            return Ok(s.clone());
        }
        socket_of(&self.config, self.config == Path::new(DEFAULT_CONFIG))
    }
}

/// The socket named by `config`: strictly from a valid config file; for
/// the default file (`lenient`) none means the built-in default, and a file
/// that does not load gives its `socket` key if that alone reads, else the
/// built-in default, each with a warning naming the error.
fn socket_of(config: &Path, lenient: bool) -> anyhow::Result<PathBuf> {
    if lenient && !config.exists() {
        return Ok(PathBuf::from(DEFAULT_SOCKET));
    }
    let loaded = Config::load(config)
        .with_context(|| format!("reading the socket path from {}", config.display()));
    match loaded {
        Ok(c) => Ok(c.socket),
        Err(e) if lenient => {
            let socket = std::fs::read_to_string(config)
                .ok()
                .and_then(|text| text.parse::<toml::Table>().ok())
                .and_then(|t| t.get("socket")?.as_str().map(PathBuf::from))
                .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
            tracing::warn!(
                "{e:#}; asking the socket {} (a running smartmigd keeps its last good config)",
                socket.display()
            );
            Ok(socket)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_socket_then_config_then_default() {
        let dir = std::env::temp_dir().join(format!("smartmig-socketargs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("smartmig.toml");
        std::fs::write(
            &conf,
            "socket = \"/tmp/elsewhere.sock\"\n[[gpus]]\nmodel = \"a100-40gb\"\ncount = 1\n",
        )
        .unwrap();
        let args = SocketArgs {
            socket: None,
            config: conf.clone(),
        };
        assert_eq!(args.socket().unwrap(), PathBuf::from("/tmp/elsewhere.sock"));
        let args = SocketArgs {
            socket: Some("/x.sock".into()),
            config: conf.clone(),
        };
        assert_eq!(args.socket().unwrap(), PathBuf::from("/x.sock"));
        let missing = SocketArgs {
            socket: None,
            config: dir.join("missing.toml"),
        };
        let e = format!("{:#}", missing.socket().unwrap_err());
        assert!(e.contains("missing.toml"), "{e}");
        std::fs::write(&conf, "socket = 3\n").unwrap();
        let bad = SocketArgs {
            socket: None,
            config: conf,
        };
        assert!(bad.socket().is_err());
        // The default file, broken: its socket key if that alone reads,
        // else the built-in default; never an error.
        let conf = dir.join("broken.toml");
        std::fs::write(
            &conf,
            "socket = \"/tmp/kept.sock\"\n[[gpus]]\nmodel = \"a99\"\n",
        )
        .unwrap();
        assert_eq!(
            socket_of(&conf, true).unwrap(),
            PathBuf::from("/tmp/kept.sock")
        );
        assert!(socket_of(&conf, false).is_err());
        std::fs::write(&conf, "socket = [unclosed\n").unwrap();
        assert_eq!(
            socket_of(&conf, true).unwrap(),
            PathBuf::from(DEFAULT_SOCKET)
        );
        assert_eq!(
            socket_of(&dir.join("absent.toml"), true).unwrap(),
            PathBuf::from(DEFAULT_SOCKET)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
