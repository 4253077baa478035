//! The server under test: a URL given by the user, or a `sluice serve` started for the run.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::LoadtestError;

/// Where requests go: the socket address, the `Host` header and the request path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub addr: SocketAddr,
    pub host: String,
    pub path: String,
}

impl Target {
    /// Parses `http://HOST[:PORT][/PATH]` and resolves the host.
    pub async fn resolve(url: &str) -> Result<Self, LoadtestError> {
        let bad = |reason: String| LoadtestError::Url {
            url: url.to_string(),
            reason,
        };
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| bad("only http:// URLs are supported".into()))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, "/"),
        };
        if authority.is_empty() {
            return Err(bad("no host".into()));
        }
        if path.bytes().any(|b| b.is_ascii_control() || b == b' ') {
            return Err(bad("the path has spaces or control characters".into()));
        }
        let with_port = if authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        let addr = tokio::net::lookup_host(&with_port)
            .await
            .map_err(|e| bad(format!("cannot resolve `{authority}`: {e}")))?
            .next()
            .ok_or_else(|| bad(format!("`{authority}` resolves to no address")))?;
        Ok(Target {
            addr,
            host: authority.to_string(),
            path: path.to_string(),
        })
    }

    /// Opens one connection, so a wrong URL is an error before the run rather than a trial
    /// full of failed connections.
    pub async fn check_reachable(&self) -> Result<(), LoadtestError> {
        let reason = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(self.addr)).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => format!("cannot connect to {}: {e}", self.addr),
            Err(_) => format!("cannot connect to {} within {CONNECT_TIMEOUT:?}", self.addr),
        };
        Err(LoadtestError::Url {
            url: format!("http://{}{}", self.host, self.path),
            reason,
        })
    }
}

/// How long the reachability check may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a spawned server may take to say where it listens.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines of the server's stderr kept to explain an early exit.
const STDERR_TAIL: usize = 5;

/// A `sluice serve` started for the run; killed when stopped or dropped.
pub(crate) struct SpawnedServer {
    child: Child,
    /// `http://ADDR/`
    pub url: String,
}

impl SpawnedServer {
    /// Runs `<exe> serve --listen 127.0.0.1:0 [--config FILE]` and waits for its
    /// `listening on http://ADDR` line.
    pub async fn start(exe: &Path, config: Option<&Path>) -> Result<Self, LoadtestError> {
        let mut command = Command::new(exe);
        command.args(["serve", "--listen", "127.0.0.1:0"]);
        if let Some(config) = config {
            command.arg("--config").arg(config);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| LoadtestError::Spawn {
                exe: exe.to_path_buf(),
                source,
            })?;
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(stderr) = child.stderr.take() {
            // Drained all along, so the server never blocks on a full pipe.
            let tail = Arc::clone(&tail);
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!(target: "sluice_loadtest::server", "{line}");
                    let mut tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
                    if tail.len() == STDERR_TAIL {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
            });
        }
        let Some(stdout) = child.stdout.take() else {
            return Err(LoadtestError::Spawn {
                exe: exe.to_path_buf(),
                source: std::io::Error::other("no stdout pipe"),
            });
        };
        let mut lines = BufReader::new(stdout).lines();
        let wait_for_address = async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(addr) = line.trim().strip_prefix("listening on http://") {
                    return Some(addr.trim_end_matches('/').to_string());
                }
                tracing::debug!(target: "sluice_loadtest::server", "{line}");
            }
            None
        };
        let addr = match tokio::time::timeout(STARTUP_TIMEOUT, wait_for_address).await {
            Ok(Some(addr)) => addr,
            Ok(None) => {
                let status = child.wait().await.map_err(|source| LoadtestError::Spawn {
                    exe: exe.to_path_buf(),
                    source,
                })?;
                // Let the stderr reader catch the last lines.
                tokio::time::sleep(Duration::from_millis(50)).await;
                let tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
                let stderr = if tail.is_empty() {
                    String::new()
                } else {
                    format!(": {}", tail.iter().cloned().collect::<Vec<_>>().join(" | "))
                };
                return Err(LoadtestError::ServerExited {
                    exe: exe.to_path_buf(),
                    status,
                    stderr,
                });
            }
            Err(_) => {
                return Err(LoadtestError::ServerSilent {
                    exe: exe.to_path_buf(),
                    waited: STARTUP_TIMEOUT,
                });
            }
        };
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(SpawnedServer {
            child,
            url: format!("http://{addr}/"),
        })
    }

    /// Kills the server and waits for it to end.
    pub async fn stop(mut self) {
        if let Err(e) = self.child.kill().await {
            tracing::warn!("stopping the spawned server: {e}");
        }
    }
}

/// The executable given to `--spawn`, or the error saying none was.
pub(crate) fn server_exe(exe: Option<&Path>) -> Result<PathBuf, LoadtestError> {
    exe.map(Path::to_path_buf)
        .ok_or(LoadtestError::NoServerExecutable)
}
