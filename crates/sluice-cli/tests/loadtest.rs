//! `sluice loadtest --spawn`: the binary loads a `sluice serve` it starts itself and writes the
//! three result files.

mod common;

use common::{TempDir, sluice};

/// `sluice loadtest --spawn --trials 1 --no-progress ARGS --out DIR`: its output and the
/// directory it wrote (removed when the `TempDir` goes).
fn loadtest(args: &[&str]) -> (std::process::Output, TempDir, std::path::PathBuf) {
    let dir = TempDir::new();
    let out = dir.path().join("run");
    let output = sluice()
        .args(["loadtest", "--spawn", "--trials", "1", "--no-progress"])
        .args(args)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    (output, dir, out)
}

#[test]
fn loadtest_spawns_the_server_and_writes_results_and_charts() {
    let (output, _dir, out) = loadtest(&["--profiles", "demo", "--duration", "3s", "--connections", "1"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Every verdict passes against an exact limiter, however slow the machine: the steady
    // window runs from denial to denial (exit 1 is a failed verdict, 2 a failed run).
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
    for profile in [
        "invalidN@example.com",
        "ANONYMOUS",
        "alice@example.com",
        "admin@example.com",
    ] {
        assert!(stdout.contains(profile), "summary names {profile}: {stdout}");
    }
    let tsv = std::fs::read_to_string(out.join("results.tsv")).unwrap();
    let mut lines = tsv.lines();
    let header: Vec<&str> = lines.next().unwrap().split('\t').collect();
    assert_eq!(header[0], "account ID");
    assert_eq!(lines.count(), 12, "one row per demo profile and trial: {tsv}");
    for chart in ["rates.png", "latencies.png"] {
        let bytes = std::fs::read(out.join(chart)).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{chart} is a PNG");
    }
}

#[test]
fn loadtest_without_a_target_says_what_to_give() {
    let output = sluice().args(["loadtest", "--no-progress"]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--url"), "{stderr}");
}

#[test]
fn a_client_offering_twice_its_quota_with_on_excess_wait_is_served_its_quota_all_200() {
    let bench = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/wait");
    let (config, profiles) = (format!("{bench}/sluice.yaml"), format!("{bench}/profiles.yaml"));
    let (output, _dir, out) = loadtest(&["--config", &config, "--profiles", &profiles, "--duration", "4s"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    let tsv = std::fs::read_to_string(out.join("results.tsv")).unwrap();
    let mut lines = tsv.lines();
    let header: Vec<&str> = lines.next().unwrap().split('\t').collect();
    let column = |row: &[&str], name: &str| -> u64 {
        let i = header.iter().position(|h| *h == name).unwrap();
        row[i].parse::<f64>().unwrap() as u64
    };
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split('\t').collect()).collect();
    let waiter = rows.iter().find(|r| r[0] == "waiter").unwrap();
    let rejecter = rows.iter().find(|r| r[0] == "rejecter").unwrap();
    // Its excess waited: nothing refused, every answer within max_wait (1 s).
    assert_eq!(column(waiter, "requests denied"), 0, "{tsv}");
    assert!(column(waiter, "requests allowed") >= 30, "{tsv}");
    assert!(column(waiter, "max latency (us)") < 1_000_000, "{tsv}");
    // The same load refused instead: about half denied.
    assert!(column(rejecter, "requests denied") > 0, "{tsv}");
    assert!(stdout.contains("waiter") && !stdout.contains("FAIL"), "{stdout}");
}
