//! The load generator against a real server over real sockets, and its files.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use sluice_loadtest::{Expected, Grade, LoadtestError, TSV_COLUMNS};

fn decode_png(path: &Path) -> (u32, u32) {
    let file = std::fs::File::open(path).unwrap();
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .unwrap();
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut pixels).unwrap();
    // A chart is not a blank image: it has more than a handful of colours.
    let distinct: std::collections::HashSet<&[u8]> = pixels.chunks(3).collect();
    assert!(distinct.len() > 10, "{} looks blank", path.display());
    (info.width, info.height)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_profiles_against_a_keyed_limiter() {
    // The quota fetch takes 50 ms; the 500 ms settling time leaves a margin for a busy machine.
    let (addr, answered) = common::demo_server(Duration::from_millis(50)).await;
    let out = tempfile::tempdir().unwrap();
    let url = format!("http://{addr}/");
    let out_dir = out.path().to_str().unwrap();
    let args = common::args(&[
        "--url",
        &url,
        "--duration",
        "2s",
        "--settle",
        "500ms",
        "--trials",
        "2",
        "--connections",
        "2",
        "--out",
        out_dir,
        "--no-progress",
    ]);
    let report = sluice_loadtest::run(&args, None).await.unwrap();
    print!("{report}\n{}", report.tsv());

    // What the server answered is exactly what the report counted.
    let (ok, too_many, other) = answered.get();
    assert_eq!(report.rows.iter().map(|r| r.allowed).sum::<u64>(), ok);
    assert_eq!(report.rows.iter().map(|r| r.denied).sum::<u64>(), too_many);
    assert_eq!(other, 0);

    assert_eq!(report.rows.len(), 24);
    assert_eq!(report.profiles.len(), 12);
    for row in &report.rows {
        assert_eq!(row.errors, 0, "{}: {:?}", row.profile, row.first_error);
        assert_eq!(
            row.cold_start_allowed + row.steady_allowed + row.tail_allowed,
            row.allowed,
            "{}",
            row.profile
        );
        assert_eq!(
            row.tsv_line().split('\t').count(),
            sluice_loadtest::TSV_COLUMNS.len()
        );
        assert!(row.steady_start >= Duration::from_millis(500));
        assert!(row.steady_start + row.steady_duration <= Duration::from_secs(2));
        let l = row.latency_us.as_array();
        assert!(
            l.windows(2).all(|w| w[0] <= w[1]),
            "{}: percentiles out of order {l:?}",
            row.profile
        );
        assert!(row.allowed + row.denied > 0, "{} sent nothing", row.profile);
    }
    for summary in &report.profiles {
        let rows: Vec<_> = report
            .rows
            .iter()
            .filter(|r| r.profile == summary.profile)
            .collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(summary.allowed, rows.iter().map(|r| r.allowed).sum::<u64>());
        assert_eq!(summary.denied, rows.iter().map(|r| r.denied).sum::<u64>());
        assert_eq!(
            summary.cold_start_allowed,
            rows.iter().map(|r| r.cold_start_allowed).sum::<u64>()
        );
    }

    let by_name: HashMap<&str, _> = report.profiles.iter().map(|p| (p.profile.as_str(), p)).collect();
    // Rates the generator always saturates on a shared 2-core machine must be within 1%/1 request.
    for name in [
        "ANONYMOUS",
        "alice@example.com",
        "bob@example.com",
        "carol@example.com",
        "chuck@example.com",
        "craig@example.com",
    ] {
        assert_eq!(by_name[name].verdict, Grade::Pass, "{name}: {:?}", by_name[name]);
    }
    // The fast ones pass if the load reached their quota, and are reported as such otherwise.
    for name in ["dan@example.com", "erin@example.com", "eve@example.com"] {
        let verdict = by_name[name].verdict;
        assert!(
            matches!(verdict, Grade::Pass | Grade::NotSaturated),
            "{name}: {verdict}"
        );
    }
    // Unknown account: admitted only under the failsafe quota while its quota was fetched.
    let invalid = by_name["invalid@example.com"];
    assert_eq!(invalid.verdict, Grade::Pass);
    assert_eq!(invalid.measured, 0.0);
    assert!(invalid.cold_start_allowed > 0, "the failsafe admitted nothing");
    let invalid_trial_2 = report
        .rows
        .iter()
        .find(|r| r.profile == "invalid@example.com" && r.trial == 2)
        .unwrap();
    assert_eq!(invalid_trial_2.allowed, 0, "quota 0 once fetched");
    // A new account per request: all of them together at the failsafe pool's rate.
    let flood = by_name["invalidN@example.com"];
    assert_eq!(
        flood.expected,
        Expected::Rate(sluice_loadtest::DEMO_FAILSAFE_POOL)
    );
    assert_eq!(flood.verdict, Grade::Pass, "{flood:?}");
    // The bypass: never denied.
    let admin = by_name["admin@example.com"];
    assert_eq!((admin.verdict, admin.denied), (Grade::Unlimited, 0));
    assert_eq!(admin.expected, Expected::Unlimited);
    assert!(report.passed());

    // results.tsv: the columns, one line per profile and trial, the same numbers.
    let tsv = std::fs::read_to_string(out.path().join("results.tsv")).unwrap();
    let mut lines = tsv.lines();
    assert_eq!(lines.next().unwrap().split('\t').collect::<Vec<_>>(), TSV_COLUMNS);
    let col = |name: &str| TSV_COLUMNS.iter().position(|c| *c == name).unwrap();
    let body: Vec<Vec<&str>> = lines.map(|l| l.split('\t').collect()).collect();
    assert_eq!(body.len(), 24);
    for (fields, row) in body.iter().zip(&report.rows) {
        assert_eq!(fields.len(), TSV_COLUMNS.len());
        assert_eq!(fields[col("account ID")], row.profile);
        assert_eq!(fields[col("trial")], row.trial.to_string());
        let allowed: u64 = fields[col("requests allowed")].parse().unwrap();
        let steady: u64 = fields[col("steady requests allowed")].parse().unwrap();
        let cold: u64 = fields[col("cold-start requests allowed")].parse().unwrap();
        let tail: u64 = fields[col("tail requests allowed")].parse().unwrap();
        assert_eq!(allowed, row.allowed);
        assert_eq!(cold + steady + tail, allowed);
        let duration_us: f64 = fields[col("test duration (us)")].parse().unwrap();
        let allow_rate: f64 = fields[col("allow rate")].parse().unwrap();
        assert!((allow_rate - allowed as f64 / (duration_us / 1e6)).abs() < 0.01);
        for latency in &TSV_COLUMNS[7..16] {
            fields[col(latency)].parse::<u64>().unwrap();
        }
        assert_eq!(fields[col("verdict")], row.verdict.to_string());
    }
    let alice = body.iter().find(|f| f[0] == "alice@example.com").unwrap();
    assert_eq!(alice[col("expected rate")], "1");
    alice[col("error (%)")].parse::<f64>().unwrap();

    // The charts are PNGs of the expected size.
    assert_eq!(decode_png(&out.path().join("rates.png")), (1200, 640));
    assert_eq!(decode_png(&out.path().join("latencies.png")), (1200, 840));
    assert_eq!(report.files.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profiles_file_and_errors_counted() {
    let (addr, answered) = common::demo_server(Duration::from_millis(10)).await;
    let dir = tempfile::tempdir().unwrap();
    let profiles = dir.path().join("profiles.yaml");
    std::fs::write(
        &profiles,
        "profiles:\n  - name: carol\n    header: carol@example.com\n    expected: 2/s\n    connections: 1\n  \
         - name: broken\n    header: broken@example.com\n    expected: 5\n    connections: 1\n",
    )
    .unwrap();
    let url = format!("http://{addr}");
    let out = dir.path().join("out");
    let args = common::args(&[
        "--url",
        &url,
        "--profiles",
        profiles.to_str().unwrap(),
        "--duration",
        "1500ms",
        "--settle",
        "300ms",
        "--out",
        out.to_str().unwrap(),
        "--no-progress",
    ]);
    let report = sluice_loadtest::run(&args, None).await.unwrap();
    print!("{report}");
    let carol = &report.profiles[0];
    assert_eq!(
        (carol.profile.as_str(), carol.verdict, carol.errors),
        ("carol", Grade::Pass, 0)
    );
    let broken = &report.profiles[1];
    let (_, _, other) = answered.get();
    assert_eq!(broken.errors, other);
    assert!(broken.errors > 0);
    assert_eq!(broken.allowed + broken.denied, 0);
    let row = report.rows.iter().find(|r| r.profile == "broken").unwrap();
    assert!(row.first_error.as_deref().unwrap().contains("503"));
    assert!(!report.passed(), "errors fail the run");
    assert!(report.to_string().contains("status 503"));
    assert!(out.join("results.tsv").exists());
}

#[tokio::test]
async fn a_bad_profiles_file_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "profiles:\n  - name: a\n    expected: 1\n  - name: b\n    expected: fast\n",
            "profiles[1].expected",
        ),
        (
            "profiles:\n  - name: a\n    expected: 1\n    conections: 2\n",
            "conections",
        ),
        ("profiles:\n  - name: a\n", "expected"),
        (
            "profiles:\n  - name: a\n    expected: -3\n",
            "profiles[0].expected",
        ),
        (
            "profiles:\n  - name: a\n    expected: 1\n    connections: 0\n",
            "profiles[0].connections",
        ),
        (
            "profiles:\n  - name: a\n    expected: 1\n  - name: a\n    expected: 2\n",
            "profiles[1].name",
        ),
        ("profiles: []\n", "profiles"),
        (
            "header_name: 'X Account'\nprofiles:\n  - name: a\n    expected: 1\n",
            "header_name",
        ),
    ];
    for (i, (yaml, field)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("p{i}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        let args = common::args(&[
            "--url",
            "http://127.0.0.1:9/",
            "--profiles",
            path.to_str().unwrap(),
            "--no-progress",
        ]);
        let err = sluice_loadtest::run(&args, None).await.unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, LoadtestError::ProfilesInvalid { .. }), "{message}");
        assert!(message.contains(path.to_str().unwrap()), "{message}");
        assert!(
            message.contains(field),
            "case {i}: `{message}` does not name `{field}`"
        );
    }
    let missing = dir.path().join("missing.yaml");
    let args = common::args(&[
        "--url",
        "http://127.0.0.1:9/",
        "--profiles",
        missing.to_str().unwrap(),
    ]);
    let err = sluice_loadtest::run(&args, None).await.unwrap_err();
    assert!(matches!(err, LoadtestError::ProfilesRead { .. }));
    assert!(err.to_string().contains("missing.yaml"), "{err}");
}

#[tokio::test]
async fn spawn_with_a_missing_executable_says_which() {
    let args = common::args(&["--spawn", "--duration", "2s", "--no-progress"]);
    let exe = Path::new("/nonexistent/bin/sluice");
    let err = sluice_loadtest::run(&args, Some(exe)).await.unwrap_err();
    assert!(matches!(err, LoadtestError::Spawn { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("/nonexistent/bin/sluice") && message.contains("--spawn"),
        "{message}"
    );

    let err = sluice_loadtest::run(&args, None).await.unwrap_err();
    assert!(matches!(err, LoadtestError::NoServerExecutable), "{err}");
}

#[tokio::test]
async fn an_unwritable_output_directory_is_named_before_the_run() {
    let (addr, answered) = common::demo_server(Duration::from_millis(10)).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = file.join("results");
    let url = format!("http://{addr}/");
    let args = common::args(&["--url", &url, "--out", out.to_str().unwrap()]);
    let err = sluice_loadtest::run(&args, None).await.unwrap_err();
    assert!(matches!(err, LoadtestError::Write { .. }), "{err}");
    assert!(err.to_string().contains("a-file/results"), "{err}");
    assert_eq!(answered.get(), (0, 0, 0), "no load was sent");
}

#[test]
fn arguments_are_checked() {
    let cases: [(&[&str], &str); 6] = [
        (
            &["--url", "http://127.0.0.1:9/", "--connections", "10001"],
            "--connections",
        ),
        (
            &["--url", "http://127.0.0.1:9/", "--duration", "25h"],
            "--duration",
        ),
        (&["--url", "http://127.0.0.1:9/", "--trials", "0"], "--trials"),
        (
            &["--url", "http://127.0.0.1:9/", "--connections", "0"],
            "--connections",
        ),
        (
            &[
                "--url",
                "http://127.0.0.1:9/",
                "--duration",
                "1s",
                "--settle",
                "1s",
            ],
            "--settle",
        ),
        (
            &["--url", "http://127.0.0.1:9/", "--duration", "0s"],
            "--duration",
        ),
    ];
    for (argv, argument) in cases {
        let err = common::args(argv).validate().unwrap_err();
        assert!(err.to_string().starts_with(argument), "{err}");
    }
}

/// A URL on a port nothing listens on (just released).
async fn closed_port_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}/")
}

#[tokio::test]
async fn urls_are_checked() {
    for (url, reason) in [
        ("https://127.0.0.1/", "only http://"),
        ("http:///x", "no host"),
        ("http://127.0.0.1:99999/", "cannot resolve"),
        (&closed_port_url().await, "cannot connect"),
    ] {
        let args = common::args(&["--url", url, "--duration", "2s", "--no-progress"]);
        let err = sluice_loadtest::run(&args, None).await.unwrap_err();
        assert!(matches!(err, LoadtestError::Url { .. }), "{err}");
        assert!(err.to_string().contains(reason), "{err}");
    }
}

#[cfg(unix)]
mod spawned {
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use super::common;
    use sluice_loadtest::LoadtestError;

    /// A stand-in for `sluice` written as a shell script: it records its arguments and pid,
    /// then prints `listening on` with the in-test server's address and stays up.
    fn script(dir: &Path, body: &str) -> PathBuf {
        let path = dir.join("sluice");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spawn_reads_the_address_passes_the_config_and_stops_the_server() {
        let (addr, answered) = common::demo_server(Duration::from_millis(10)).await;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let exe = script(
            dir.path(),
            &format!(
                "echo \"$@\" > {d}/argv\necho $$ > {d}/pid\necho 'starting'\necho 'listening on http://{addr}'\n\
                 exec sleep 60"
            ),
        );
        let profiles = dir.path().join("profiles.yaml");
        std::fs::write(
            &profiles,
            "profiles:\n  - name: chuck\n    header: chuck@example.com\n    expected: 10\n",
        )
        .unwrap();
        let config = dir.path().join("server.yaml");
        let out = dir.path().join("out");
        let args = common::args(&[
            "--spawn",
            "--config",
            config.to_str().unwrap(),
            "--profiles",
            profiles.to_str().unwrap(),
            "--duration",
            "1s",
            "--settle",
            "200ms",
            "--out",
            out.to_str().unwrap(),
            "--no-progress",
        ]);
        let report = sluice_loadtest::run(&args, Some(&exe)).await.unwrap();
        assert_eq!(report.url, format!("http://{addr}/"));
        assert_eq!(report.profiles[0].allowed, answered.get().0);
        let argv = std::fs::read_to_string(dir.path().join("argv")).unwrap();
        assert_eq!(
            argv.trim(),
            format!("serve --listen 127.0.0.1:0 --config {}", config.display())
        );
        let pid = std::fs::read_to_string(dir.path().join("pid")).unwrap();
        assert!(
            !Path::new(&format!("/proc/{}", pid.trim())).exists(),
            "the spawned server is still running"
        );
    }

    #[tokio::test]
    async fn a_server_that_exits_early_is_reported_with_its_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let exe = script(
            dir.path(),
            "echo 'config.yaml: accounts[2].quota: bad' >&2\nexit 3",
        );
        let args = common::args(&["--spawn", "--duration", "2s", "--no-progress"]);
        let err = sluice_loadtest::run(&args, Some(&exe)).await.unwrap_err();
        assert!(matches!(err, LoadtestError::ServerExited { .. }), "{err}");
        assert!(err.to_string().contains("accounts[2].quota: bad"), "{err}");
    }
}
