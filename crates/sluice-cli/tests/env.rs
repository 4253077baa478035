//! `sluice serve` and `sluice validate` configured from the environment, over real processes:
//! a service from variables alone, the environment over the file, and `validate --show`.

mod common;

use common::{Server, TempDir, sluice};

#[test]
fn variables_alone_run_a_real_service_not_the_demo() {
    let server = Server::start_with_env(
        &[],
        &[
            ("SLUICE_ACCOUNTS", "{carol: 2/h}"),
            ("SLUICE_ADMIN_LISTEN", "127.0.0.1:0"),
        ],
    );
    assert!(server.admin.is_some(), "SLUICE_ADMIN_LISTEN was not applied");
    let mut client = server.client();
    assert_eq!(client.as_account(Some("carol")).status, 200);
    assert_eq!(client.as_account(Some("carol")).status, 200);
    assert_eq!(client.as_account(Some("carol")).status, 429);
    // The demo's accounts are not there: admin@example.com is not bypassed.
    assert_eq!(server.client().as_account(Some("admin@example.com")).status, 429);
}

#[test]
fn the_environment_wins_over_the_file_and_flags_over_both() {
    let dir = TempDir::new();
    let file = dir.write("sluice.yaml", "accounts: {carol: 1/h}\nlisten: 127.0.0.1:1\n");
    let server = Server::start_with_env(
        &["--config", file.to_str().unwrap()],
        &[
            ("SLUICE_ACCOUNTS", "{carol: 3/h}"),
            ("SLUICE_LISTEN", "127.0.0.1:2"),
        ],
    );
    // --listen 127.0.0.1:0 (the flag) won over both.
    assert_ne!(server.addr.port(), 1);
    assert_ne!(server.addr.port(), 2);
    let mut client = server.client();
    for _ in 0..3 {
        assert_eq!(client.as_account(Some("carol")).status, 200);
    }
    assert_eq!(client.as_account(Some("carol")).status, 429);
}

#[test]
fn validate_show_prints_the_settings_in_effect_with_secrets_masked() {
    let dir = TempDir::new();
    let file = dir.write(
        "sluice.yaml",
        "redis: {url: 'redis://user:hunter2@127.0.0.1:6379'}\n",
    );
    let out = sluice()
        .args(["validate", "--show", file.to_str().unwrap()])
        .env("SLUICE_IDLE_TIMEOUT", "7s")
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("# idle_timeout set by SLUICE_IDLE_TIMEOUT"),
        "{stdout}"
    );
    assert!(stdout.contains("idle_timeout: 7s"), "{stdout}");
    // Defaults are shown too.
    assert!(stdout.contains("max_headers: 100"), "{stdout}");
    assert!(
        !stdout.contains("hunter2") && stdout.contains("redis://***@127.0.0.1:6379"),
        "{stdout}"
    );
    // A bad value names its variable.
    let out = sluice()
        .args(["validate", file.to_str().unwrap()])
        .env("SLUICE_MAX_HEADERS", "many")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("max_headers") && stderr.contains("SLUICE_MAX_HEADERS"),
        "{stderr}"
    );
}
