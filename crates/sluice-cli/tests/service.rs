//! The rate-limit service inside `sluice serve`, in memory: every serving thread answers the
//! check API on one engine, the rules files are reloaded when they change with every counter
//! kept, a broken rules file leaves the running rules in force, and `sluice validate` names
//! the rule file's field.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Client, Response, Server, TempDir, sluice};

const RULES: &str = "
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
";

const CONFIG: &str = "
rules: rules/
api: {listen: 127.0.0.1:0}
rls: {listen: 127.0.0.1:0}
";

fn start(threads: &str) -> (Server, TempDir) {
    let dir = TempDir::new();
    std::fs::create_dir(dir.path().join("rules")).unwrap();
    dir.write("rules/edge.yaml", RULES);
    let file = dir.write("sluice.yaml", CONFIG);
    let server = Server::start(&["--config", file.to_str().unwrap(), "--threads", threads]);
    (server, dir)
}

/// One check on a new connection (so the kernel may hand it to any serving thread).
fn check(server: &Server, user: &str) -> serde_json::Value {
    serde_json::from_str(&check_answer(server, user).body).unwrap()
}

/// [`check`]'s whole answer.
fn check_answer(server: &Server, user: &str) -> Response {
    let mut client = Client::connect(server.api.expect("api.listen is set"));
    let body =
        format!(r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#);
    let response = client.post_json("/v1/check", &body);
    assert_eq!(response.status, 200, "{response:?}");
    response
}

/// The bytes each serving thread of `server` has written so far, by thread, from the kernel's
/// account of each thread's I/O (`/proc/PID/task/TID/io`). The first serving thread is the
/// process's main thread; the others are named `sluice-serve-N`.
fn written_per_serving_thread(server: &Server) -> BTreeMap<String, u64> {
    let pid = server.child.id().to_string();
    let mut written = BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let tid = task.file_name().unwrap().to_string_lossy().into_owned();
        // Other threads (tokio's blocking pool) may come and go.
        let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        let name = name.trim();
        if tid != pid && !name.starts_with("sluice-serve-") {
            continue;
        }
        let io = std::fs::read_to_string(task.join("io")).unwrap();
        let wchar = io.lines().find_map(|line| line.strip_prefix("wchar: "));
        written.insert(format!("{name} ({tid})"), wchar.unwrap().parse().unwrap());
    }
    written
}

fn admitted(verdict: &serde_json::Value) -> bool {
    verdict["overall_code"] == "OK"
}

#[test]
fn every_serving_thread_answers_on_one_engine() {
    let (server, _dir) = start("2");
    assert!(server.rls.is_some());
    // The start-up's last log line is written by the first thread once the others serve; from
    // then on, what the threads write is answers.
    server.wait_for_log("serving;");
    let mut written = written_per_serving_thread(&server);
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = written_per_serving_thread(&server);
        if now == written {
            break;
        }
        written = now;
    }
    assert_eq!(written.len(), 2, "two serving threads: {written:?}");
    let mut answered: BTreeMap<String, usize> = written.keys().map(|t| (t.clone(), 0)).collect();
    // The kernel spreads new connections over the threads' listeners by a hash of the client's
    // address, so checks go on until each thread has answered some: all of the first 16 on one
    // thread is a chance in 2^15, all of 200 one in 2^199.
    let (mut checks, mut admissions) = (0, 0);
    while checks < 16 || answered.values().any(|&n| n == 0) {
        assert!(
            checks < 200,
            "{checks} checks, a serving thread answered none: {answered:?}"
        );
        let answer = check_answer(&server, "alice");
        let verdict = serde_json::from_str(&answer.body).unwrap();
        admissions += usize::from(admitted(&verdict));
        // The thread that answered wrote the answer: its count grew by at least the body. The
        // client may read the answer before the kernel counts the write, so look again a while.
        let grew = |now: &BTreeMap<String, u64>| -> Vec<String> {
            let body = answer.body.len() as u64;
            now.iter()
                .filter(|(thread, n)| **n >= written[*thread] + body)
                .map(|(thread, _)| thread.clone())
                .collect()
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        let (now, by) = loop {
            let now = written_per_serving_thread(&server);
            let by = grew(&now);
            if !by.is_empty() || Instant::now() > deadline {
                break (now, by);
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(
            by.len(),
            1,
            "check {checks}: an answer of {} bytes; written before {written:?}, after {now:?}",
            answer.body.len()
        );
        *answered.get_mut(&by[0]).unwrap() += 1;
        written = now;
        checks += 1;
    }
    // Whichever thread answered, one engine counted: 5 admitted in all.
    assert_eq!(admissions, 5, "{checks} checks answered by thread: {answered:?}");
}

#[test]
fn a_changed_rules_file_is_reloaded_keeping_the_counts_and_a_broken_one_is_refused() {
    let (server, dir) = start("1");
    for left in [4, 3] {
        let verdict = check(&server, "bob");
        assert_eq!(verdict["statuses"][0]["limit_remaining"], left, "{verdict}");
    }
    // A lower limit: bob's two stay taken, so one is left of 3.
    dir.write(
        "rules/edge.yaml",
        &RULES.replace("requests_per_unit: 5", "requests_per_unit: 3"),
    );
    server.wait_for_log("rules reloaded; counters kept");
    let verdict = check(&server, "bob");
    assert!(admitted(&verdict), "{verdict}");
    assert_eq!(
        verdict["statuses"][0]["current_limit"]["quota"], "3/h",
        "{verdict}"
    );
    assert_eq!(verdict["statuses"][0]["limit_remaining"], 0, "{verdict}");
    assert!(!admitted(&check(&server, "bob")));
    // A broken file: refused, named, and the running rules (3/h) stay.
    dir.write("rules/edge.yaml", "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n");
    server.wait_for_log("rules not reloaded, the running rules stay");
    assert!(server.stderr().contains("rate_limit.unit"), "{}", server.stderr());
    let verdict = check(&server, "carol");
    assert_eq!(verdict["statuses"][0]["limit_remaining"], 2, "{verdict}");
}

#[test]
fn validate_names_the_rule_files_field() {
    let dir = TempDir::new();
    std::fs::create_dir(dir.path().join("rules")).unwrap();
    dir.write(
        "rules/edge.yaml",
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: many}\n",
    );
    let file = dir.write("sluice.yaml", CONFIG);
    let out = sluice().arg("validate").arg(&file).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("rules"), "{stderr}");
    assert!(
        stderr.contains("descriptors[0].rate_limit.requests_per_unit"),
        "{stderr}"
    );
    dir.write("rules/edge.yaml", RULES);
    let out = sluice().arg("validate").arg(&file).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
