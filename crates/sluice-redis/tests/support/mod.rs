//! Real `redis-server` processes for the tests: each on a free port, without persistence,
//! stopped when dropped.

#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("no free local port");
    listener.local_addr().expect("local address").port()
}

fn require(binary: &str) {
    let found = Command::new(binary)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    assert!(found, "{binary} is not installed: run scripts/ensure-redis.sh");
}

/// Polls `ready` every 20 ms for up to `limit`; panics with `what` if it never holds.
pub fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// As [`wait_until`], for a condition that needs the async runtime.
pub async fn wait_until_async<F: Future<Output = bool>>(
    what: &str,
    limit: Duration,
    mut ready: impl FnMut() -> F,
) {
    let start = Instant::now();
    while !ready().await {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One `redis-server`.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    /// A standalone server on a free port.
    pub fn start() -> Self {
        Self::start_with(free_port(), Vec::new())
    }

    fn start_with(port: u16, extra: Vec<String>) -> Self {
        require("redis-server");
        let dir = std::env::temp_dir().join(format!("sluice-redis-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        let mut server = Self {
            port,
            child: None,
            dir,
            extra,
        };
        server.spawn();
        server
    }

    /// Starts the server; if its port was taken meanwhile (another test picked the same free
    /// port), moves to another one.
    fn spawn(&mut self) {
        for _ in 0..5 {
            let mut child = Command::new("redis-server")
                .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&self.dir)
                .args(&self.extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start redis-server");
            let pid = format!("process_id:{}", child.id());
            let port = self.port;
            let start = Instant::now();
            let mut ours = false;
            while start.elapsed() < Duration::from_secs(10) {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break;
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok()
                    && self.cli(&["INFO", "server"]).contains(&pid)
                {
                    ours = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if ours {
                self.child = Some(child);
                return;
            }
            let _ = child.kill();
            let _ = child.wait();
            self.port = free_port();
        }
        panic!("could not start redis-server on a free port");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs `redis-cli` against this server and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (empty: nothing is persisted).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three masters forming a Redis Cluster.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        require("redis-cli");
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                let port = free_port();
                let extra = ["--cluster-enabled", "yes", "--cluster-config-file"]
                    .iter()
                    .map(|s| s.to_string())
                    .chain([format!("nodes-{port}.conf")])
                    .collect();
                RedisServer::start_with(port, extra)
            })
            .collect();
        let addresses: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        for node in &nodes {
            wait_until("the cluster to be ready", Duration::from_secs(20), || {
                node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
            });
        }
        Self { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}
