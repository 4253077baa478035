//! Test support: the real `sluice` binary on a free port, a keep-alive HTTP/1.1 client over a
//! real socket, temporary config files.

#![allow(dead_code)]

pub mod certs;
pub mod fault;
pub mod upstream;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Generous bound for anything that waits: tests never assert on speed.
pub const PATIENCE: Duration = Duration::from_secs(60);

pub fn sluice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

/// A directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "sluice-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        // Write then rename, as editors do, so the server never reads half a file.
        let file_name = path.file_name().unwrap().to_string_lossy();
        let tmp = path.with_file_name(format!(".{file_name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `sluice serve`, killed on drop if still running.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    /// The RLS listener's address, if the config has one.
    pub rls: Option<SocketAddr>,
    /// The check API's address, if the config has one.
    pub api: Option<SocketAddr>,
    /// The admin listener's address, if the config has one.
    pub admin: Option<SocketAddr>,
    pub first_line: String,
    stderr: PathBuf,
    _dir: TempDir,
}

impl Server {
    /// Starts `sluice serve --listen 127.0.0.1:0 ARGS...` and waits for its listening line.
    pub fn start(args: &[&str]) -> Self {
        Self::start_with_env(args, &[])
    }

    /// [`Server::start`], with `env` added to the server's environment.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = TempDir::new();
        let stderr = dir.path().join("stderr.log");
        let mut child = sluice()
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // The service's listeners come before the main line; the reader stops after it.
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let main = line.starts_with("listening on ");
                if tx.send(line).is_err() || main {
                    break;
                }
            }
        });
        let (mut rls, mut api, mut admin) = (None, None, None);
        let first_line = loop {
            let line = rx.recv_timeout(PATIENCE).unwrap_or_else(|_| {
                panic!(
                    "no listening line; stderr: {}",
                    std::fs::read_to_string(&stderr).unwrap_or_default()
                )
            });
            if let Some(addr) = line.strip_prefix("rls listening on ") {
                rls = Some(addr.parse().unwrap());
            } else if let Some(addr) = (line.strip_prefix("api listening on http://"))
                .or_else(|| line.strip_prefix("api listening on https://"))
            {
                api = Some(addr.trim_end_matches('/').parse().unwrap());
            } else if let Some(addr) = (line.strip_prefix("admin listening on http://"))
                .or_else(|| line.strip_prefix("admin listening on https://"))
            {
                admin = Some(addr.trim_end_matches('/').parse().unwrap());
            } else {
                break line;
            }
        };
        let addr = first_line
            .trim_end()
            .strip_prefix("listening on http://")
            .or_else(|| first_line.trim_end().strip_prefix("listening on https://"))
            .unwrap_or_else(|| {
                panic!(
                    "unexpected first line {first_line:?}; stderr: {}",
                    std::fs::read_to_string(&stderr).unwrap_or_default()
                )
            })
            .parse()
            .unwrap();
        Self {
            child,
            addr,
            rls,
            api,
            admin,
            first_line,
            stderr,
            _dir: dir,
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits until the server's log contains `text`.
    pub fn wait_for_log(&self, text: &str) {
        wait_until(&format!("log line {text:?}"), || self.stderr().contains(text));
    }

    /// Sends a signal (`TERM`, `INT`) and waits for the process to exit.
    pub fn signal(&mut self, name: &str) -> ExitStatus {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "server did not exit after SIG{name}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `sluice rules` (the rules service), killed on drop.
pub struct RulesService {
    pub child: Child,
    pub addr: SocketAddr,
}

impl RulesService {
    /// Starts `sluice rules --listen 127.0.0.1:0 ARGS...` in `dir` and waits for its listening
    /// line.
    pub fn start(dir: &TempDir, args: &[&str]) -> Self {
        let mut child = sluice()
            .current_dir(dir.path())
            .args(["rules", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim_end()
            .strip_prefix("rules listening on http://")
            .or_else(|| line.trim_end().strip_prefix("rules listening on https://"))
            .and_then(|rest| rest.strip_suffix('/'))
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .unwrap();
        Self { child, addr }
    }
}

impl Drop for RulesService {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `ready` until it holds, failing after [`PATIENCE`].
pub fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn number(&self, name: &str) -> u64 {
        self.header(name)
            .unwrap_or_else(|| panic!("no {name} in {self:?}"))
            .parse()
            .unwrap()
    }
}

/// One keep-alive HTTP/1.1 connection.
pub struct Client {
    reader: BufReader<TcpStream>,
    host: String,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        stream.set_nodelay(true).unwrap();
        Self {
            reader: BufReader::new(stream),
            host: "test".into(),
        }
    }

    /// Sends `host` as the `Host` of every request (`test` otherwise).
    pub fn with_host(mut self, host: &str) -> Self {
        self.host = host.to_owned();
        self
    }

    pub fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Response {
        self.request("GET", path, headers)
    }

    /// A GET of `/` as `account` (no header when `None`).
    pub fn as_account(&mut self, account: Option<&str>) -> Response {
        match account {
            Some(a) => self.get("/", &[("X-Account-ID", a)]),
            None => self.get("/", &[]),
        }
    }

    pub fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
        let headers: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        self.request_bytes(method, path, &headers)
    }

    /// A POST of a JSON body.
    pub fn post_json(&mut self, path: &str, body: &str) -> Response {
        self.send("POST", path, &[("content-type", "application/json")], body)
    }

    /// A request with a body.
    pub fn send(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Response {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.host);
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
        let stream = self.reader.get_mut();
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body.as_bytes()).unwrap();
        self.read_response()
    }

    /// A request whose header values are raw bytes (not necessarily text).
    pub fn request_bytes(&mut self, method: &str, path: &str, headers: &[(&str, &[u8])]) -> Response {
        let mut bytes = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.host).into_bytes();
        for (k, v) in headers {
            bytes.extend_from_slice(format!("{k}: ").as_bytes());
            bytes.extend_from_slice(v);
            bytes.extend_from_slice(b"\r\n");
        }
        bytes.extend_from_slice(b"\r\n");
        self.reader.get_mut().write_all(&bytes).unwrap();
        self.read_response()
    }

    /// Sends a GET of `/` as `account` without waiting for its answer ([`Self::response`]).
    pub fn send_as(&mut self, account: &str) {
        let head = format!(
            "GET / HTTP/1.1\r\nHost: {}\r\nX-Account-ID: {account}\r\n\r\n",
            self.host
        );
        self.reader.get_mut().write_all(head.as_bytes()).unwrap();
    }

    /// The answer to the request sent last.
    pub fn response(&mut self) -> Response {
        self.read_response()
    }

    /// The socket, to shut it down or read it raw.
    pub fn stream(&self) -> &TcpStream {
        self.reader.get_ref()
    }

    fn read_response(&mut self) -> Response {
        let mut status_line = String::new();
        self.reader.read_line(&mut status_line).unwrap();
        let status = status_line
            .split_whitespace()
            .nth(1)
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"))
            .parse()
            .unwrap();
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (k, v) = line.split_once(':').unwrap();
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        let mut response = Response {
            status,
            headers,
            body: String::new(),
        };
        let length = response
            .header("content-length")
            .map_or(0, |v| v.parse().unwrap());
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body).unwrap();
        response.body = String::from_utf8(body).unwrap();
        response
    }
}
