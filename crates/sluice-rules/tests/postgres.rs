//! The PostgreSQL rules store on a real server from Debian's packages (installed by
//! `scripts/ensure-postgres.sh`), started by each test in a temporary directory and stopped
//! at its end: the same store cases as SQLite, the schema's version guarded when replicas
//! start together, and a store that finds its server again after a restart.

mod cases;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_rules::{PostgresStore, RuleStore, StoreError};

use cases::rules;

/// A PostgreSQL server in a temporary directory, stopped on drop.
struct Server {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    /// Who the server runs as: PostgreSQL refuses root.
    user: Option<(u32, u32)>,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

/// The newest installed server's programs.
fn bin_dir() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| entries.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    found.retain(|bin| bin.join("initdb").exists());
    found.sort_by_key(|bin| {
        bin.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
    });
    found
        .pop()
        .expect("no PostgreSQL server under /usr/lib/postgresql: run scripts/ensure-postgres.sh")
}

/// The uid and gid of `postgres` when running as root (the package makes that user).
fn server_user() -> Option<(u32, u32)> {
    let id = |args: &[&str]| -> u32 {
        let out = Command::new("id").args(args).output().expect("id runs");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a number")
    };
    (id(&["-u"]) == 0).then(|| (id(&["-u", "postgres"]), id(&["-g", "postgres"])))
}

fn as_user(command: &mut Command, user: Option<(u32, u32)>) -> &mut Command {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid);
    }
    command
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Server {
    fn start() -> Self {
        let bin = bin_dir();
        let dir = tempfile::tempdir().unwrap();
        let user = server_user();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        }
        let data = dir.path().join("data");
        let status = as_user(&mut Command::new(bin.join("initdb")), user)
            .args(["-D"])
            .arg(&data)
            .args([
                "-U",
                "sluice",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "initdb failed");
        let mut server = Self {
            bin,
            data,
            port: free_port(),
            user,
            child: None,
            _dir: dir,
        };
        server.run();
        server
    }

    /// Starts the server on its data directory and waits until it answers.
    fn run(&mut self) {
        let child = as_user(&mut Command::new(self.bin.join("postgres")), self.user)
            .arg("-D")
            .arg(&self.data)
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(self.data.parent().unwrap_or(Path::new("/tmp")))
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while postgres::Client::connect(&self.url("postgres"), postgres::NoTls).is_err() {
            assert!(Instant::now() < deadline, "postgres did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server (a fast shutdown) and waits for it.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }

    fn url(&self, database: &str) -> String {
        format!("postgres://sluice@127.0.0.1:{}/{database}", self.port)
    }

    /// A new, empty database's URL.
    fn database(&self, name: &str) -> String {
        let mut admin = postgres::Client::connect(&self.url("postgres"), postgres::NoTls).unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
        self.url(name)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn every_store_case_passes_on_postgres() {
    let server = Server::start();
    let on_a_database = |name: &str, case: fn(&dyn Fn() -> PostgresStore)| {
        let url = server.database(name);
        case(&|| PostgresStore::connect(&url).unwrap());
    };
    on_a_database(
        "writes",
        cases::writes_make_one_revision_each_and_the_history_keeps_before_and_after,
    );
    on_a_database("refused", cases::refused_writes_change_nothing);
    on_a_database("pages", cases::domains_are_listed_by_prefix_in_pages);
    on_a_database(
        "replicas",
        cases::two_stores_on_one_database_share_the_rules_and_one_revision,
    );
    on_a_database(
        "concurrent",
        cases::concurrent_writers_get_distinct_revisions_and_lose_nothing,
    );
}

#[test]
fn replicas_starting_together_migrate_once_and_a_newer_schema_is_refused() {
    let server = Server::start();
    let url = server.database("schema");
    let replicas: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || PostgresStore::connect(&url).map(|_| ()))
        })
        .collect();
    for replica in replicas {
        replica.join().unwrap().unwrap();
    }
    let store = PostgresStore::connect(&url).unwrap();
    store.create(&rules("edge", 60), "alice").unwrap();
    drop(store);
    // Connecting again migrates nothing and keeps everything.
    assert_eq!(PostgresStore::connect(&url).unwrap().revision().unwrap(), 1);
    let mut raw = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    raw.batch_execute("UPDATE sluice_schema SET version = 99")
        .unwrap();
    let error = PostgresStore::connect(&url).unwrap_err();
    assert!(
        matches!(error, StoreError::NewerSchema { found: 99, known: 1 }),
        "{error:?}"
    );
    // Not a connection string; a server that is not there.
    assert!(PostgresStore::connect("postgres://sluice@127.0.0.1:notaport/x").is_err());
    let nowhere = format!("postgres://sluice@127.0.0.1:{}/x?connect_timeout=2", free_port());
    let error = PostgresStore::connect(&nowhere).unwrap_err();
    assert!(error.to_string().starts_with("postgres: "), "{error}");
}

#[test]
fn a_store_finds_its_server_again_after_a_restart() {
    let mut server = Server::start();
    let url = server.database("restart");
    let store = PostgresStore::connect(&url).unwrap();
    store.create(&rules("edge", 60), "alice").unwrap();
    server.stop();
    let down = store.get("edge").unwrap_err();
    assert!(matches!(down, StoreError::Postgres(_)), "{down:?}");
    server.run();
    assert_eq!(store.get("edge").unwrap().revision, 1);
    assert_eq!(store.revision().unwrap(), 1);
}
