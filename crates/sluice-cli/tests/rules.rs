//! `sluice rules`: the rules service on a database file, its import and export, over real
//! processes and sockets.

mod common;

use common::{Client, RulesService, TempDir, sluice};

const EDGE: &str =
    "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 60}\n";
const API: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {quota: 5/s}\n";

fn run(dir: &TempDir, args: &[&str]) -> (bool, String, String) {
    let out = sluice().current_dir(dir.path()).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn import_checks_every_file_first_and_export_gives_a_domain_back() {
    let dir = TempDir::new();
    std::fs::create_dir(dir.path().join("ratelimit")).unwrap();
    dir.write("ratelimit/edge.yaml", EDGE);
    dir.write("ratelimit/api.yaml", API);
    dir.write("ratelimit/zz-broken.yaml", "domain: broken\ndescriptors:\n  - key: ip\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n");
    let (ok, _, stderr) = run(&dir, &["rules", "import", "ratelimit"]);
    assert!(!ok);
    assert!(
        stderr.contains("zz-broken.yaml") && stderr.contains("rate_limit.unit"),
        "{stderr}"
    );
    // Nothing was stored.
    let (ok, _, stderr) = run(&dir, &["rules", "export", "edge"]);
    assert!(!ok && stderr.contains("domain 'edge' not found"), "{stderr}");

    std::fs::remove_file(dir.path().join("ratelimit/zz-broken.yaml")).unwrap();
    let (ok, stdout, stderr) = run(&dir, &["rules", "import", "ratelimit"]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "api: revision 1\nedge: revision 2\n");
    let (ok, stdout, _) = run(&dir, &["rules", "export", "edge"]);
    assert!(ok);
    assert_eq!(stdout, EDGE);
    // The default database is a file in the working directory.
    assert!(dir.path().join("sluice-rules.db").exists());
}

#[test]
fn the_service_serves_the_imported_rules_and_answers_304_while_unchanged() {
    let dir = TempDir::new();
    dir.write("edge.yaml", EDGE);
    assert!(run(&dir, &["rules", "import", "edge.yaml"]).0);
    let rules = RulesService::start(&dir, &[]);
    let mut client = Client::connect(rules.addr);
    let snapshot = client.get("/v1/rules", &[]);
    assert_eq!(snapshot.status, 200);
    assert_eq!(snapshot.header("etag"), Some("\"1\""));
    assert!(snapshot.body.contains("\"domain\":\"edge\""), "{}", snapshot.body);
    let unchanged = client.get("/v1/rules", &[("if-none-match", "\"1\"")]);
    assert_eq!(unchanged.status, 304);
}

#[test]
fn without_tokens_only_loopback_and_with_them_writes_need_one() {
    let dir = TempDir::new();
    let (ok, _, stderr) = run(&dir, &["rules", "--listen", "0.0.0.0:0"]);
    assert!(!ok);
    assert!(stderr.contains("loopback"), "{stderr}");

    dir.write("tokens", "ci write 0123456789abcdef-write\n");
    let rules = RulesService::start(&dir, &["--tokens", "tokens"]);
    let mut client = Client::connect(rules.addr);
    assert_eq!(client.get("/v1/rules", &[]).status, 401);
    let allowed = client.get("/v1/rules", &[("authorization", "Bearer 0123456789abcdef-write")]);
    assert_eq!(allowed.status, 200);
}
