//! The rate-limit service inside `sluice serve`, in memory: every serving thread answers the
//! check API on one engine, the rules files are reloaded when they change with every counter
//! kept, a broken rules file leaves the running rules in force, and `sluice validate` names
//! the rule file's field.

mod common;

use common::{Client, Server, TempDir, sluice};

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
    let mut client = Client::connect(server.api.expect("api.listen is set"));
    let body =
        format!(r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#);
    let response = client.post_json("/v1/check", &body);
    assert_eq!(response.status, 200, "{response:?}");
    serde_json::from_str(&response.body).unwrap()
}

fn admitted(verdict: &serde_json::Value) -> bool {
    verdict["overall_code"] == "OK"
}

#[test]
fn every_serving_thread_answers_on_one_engine() {
    let (server, _dir) = start("2");
    assert!(server.rls.is_some());
    let admitted = (0..16).filter(|_| admitted(&check(&server, "alice"))).count();
    assert_eq!(admitted, 5);
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
