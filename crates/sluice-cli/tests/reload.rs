//! Config reloads of `sluice serve`, over real sockets with real files: a torn or empty file
//! is refused, and no reload but an algorithm change resets a held count.

mod common;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{Client, Server, TempDir, sluice};

/// Quotas that do not refill during a test; `refresh: 1s` so account edits arrive quickly.
const CONFIG: &str = "
fetch_latency: 0s
refresh: 1s
failsafe: 10/h
accounts:
  limited@example.com: 1/h
  three@example.com: 3/h
";

fn start(config: &str) -> (Server, TempDir, std::path::PathBuf) {
    let dir = TempDir::new();
    let file = dir.write("sluice.yaml", config);
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    (server, dir, file)
}

/// Uses up `limited@example.com` (1/h) and two of `three@example.com`'s three units.
fn use_up(client: &mut Client) {
    assert_eq!(client.as_account(Some("limited@example.com")).status, 200);
    assert_eq!(client.as_account(Some("limited@example.com")).status, 429);
    assert_eq!(client.as_account(Some("three@example.com")).status, 200);
    let r = client.as_account(Some("three@example.com"));
    assert_eq!((r.status, r.number("x-ratelimit-remaining")), (200, 1));
}

/// Checks `limited@example.com` is still denied, then takes one unit of `three@example.com`
/// and checks the answer: admitted with `remaining` left, or denied for `None`.
fn counts_kept(client: &mut Client, remaining: Option<u64>, after: &str) {
    let r = client.as_account(Some("limited@example.com"));
    assert_eq!(r.status, 429, "limited@example.com admitted again after {after}");
    let r = client.as_account(Some("three@example.com"));
    let answer = (r.status == 200).then(|| r.number("x-ratelimit-remaining"));
    assert_eq!(answer, remaining, "three@example.com after {after}: {r:?}");
}

/// Runs `sluice serve --config FILE`, which must exit at once with an error; returns its
/// stderr. A server that starts instead is stopped and the test fails.
fn refused_at_start(file: &std::path::Path) -> String {
    let mut child = sluice()
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + common::PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{} was served", file.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success(), "{}: {status:?}", file.display());
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    stderr
}

fn occurrences(server: &Server, text: &str) -> usize {
    server.stderr().matches(text).count()
}

#[test]
fn an_empty_or_comment_only_file_is_refused_at_start_by_validate_and_on_reload() {
    let dir = TempDir::new();
    for (name, text) in [
        ("empty.yaml", ""),
        ("comments.yaml", "# all\n\n# commented out\n"),
    ] {
        let file = dir.write(name, text);
        let stderr = refused_at_start(&file);
        assert!(stderr.contains(&format!("{name}: file: empty")), "{stderr}");
        let out = sluice().arg("validate").arg(&file).output().unwrap();
        assert!(!out.status.success(), "{name} validated");
    }

    let (server, dir, _) = start(CONFIG);
    let mut client = server.client();
    use_up(&mut client);
    dir.write("sluice.yaml", "");
    server.wait_for_log("sluice.yaml: file: empty");
    assert!(server.stderr().contains("keeping the running config"));
    counts_kept(&mut client, Some(0), "an empty file");
    // Still empty at the next polls: said once. Then another content without settings is
    // said once more.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(occurrences(&server, "file: empty"), 1, "{}", server.stderr());
    dir.write("sluice.yaml", "# nothing here\n");
    common::wait_until("the second refusal", || occurrences(&server, "file: empty") == 2);
    assert_eq!(client.as_account(Some("limited@example.com")).status, 429);
    assert!(!server.stderr().contains("afresh"), "{}", server.stderr());
}

#[test]
fn a_file_truncated_in_place_then_restored_keeps_every_count() {
    let (server, _dir, file) = start(CONFIG);
    let mut client = server.client();
    use_up(&mut client);
    // As a careless deploy does: truncate, then write, in place.
    std::fs::write(&file, "").unwrap();
    server.wait_for_log("file: empty");
    counts_kept(&mut client, Some(0), "truncation");
    std::fs::write(&file, CONFIG).unwrap();
    server.wait_for_log("sluice.yaml: back to the running config");
    counts_kept(&mut client, None, "the restore");
    assert!(!server.stderr().contains("afresh"), "{}", server.stderr());
}

#[test]
fn limiter_changes_keep_counts_and_only_an_algorithm_change_starts_afresh() {
    let (server, dir, _) = start(CONFIG);
    let mut client = server.client();
    use_up(&mut client);

    // The store's size, the failsafe and the unknown-key quota: a new limiter, same counts.
    let resized = format!(
        "{}capacity: 5000\nunknown: 1/h\n",
        CONFIG.replace("failsafe: 10/h", "failsafe: 20/h")
    );
    dir.write("sluice.yaml", &resized);
    server.wait_for_log("sluice.yaml: config reloaded; limiter settings changed");
    counts_kept(&mut client, Some(0), "a capacity change");
    let said = "limiter settings changed (failsafe, unknown, capacity): 2 held keys keep their counts";
    assert!(server.stderr().contains(said), "{}", server.stderr());
    let r = client.as_account(Some("nobody@example.com"));
    assert_eq!(r.status, 200, "the new unknown-key quota applies");

    // A larger account quota: consumption carries over (3 used, now of 5).
    let larger = resized.replace("three@example.com: 3/h", "three@example.com: 5/h");
    dir.write("sluice.yaml", &larger);
    server.wait_for_log("sluice.yaml: config reloaded\n");
    let mut statuses = Vec::new();
    common::wait_until("three's new quota", || {
        let r = client.as_account(Some("three@example.com"));
        statuses.push(r.status);
        r.header("x-ratelimit-limit") == Some("5")
    });
    // Denied until the new quota came (a refresh), then 2 more of 5; one of them just now.
    let admitted = statuses.iter().filter(|&&s| s == 200).count();
    assert!(admitted <= 1 && statuses.last() == Some(&200), "{statuses:?}");
    counts_kept(&mut client, Some(0), "a larger quota");
    counts_kept(&mut client, None, "a larger quota");
    assert!(!server.stderr().contains("afresh"), "{}", server.stderr());

    // Another algorithm has no rule to carry a state over: afresh, and the log says so.
    dir.write("sluice.yaml", &format!("{larger}algorithm: fixed_window\n"));
    server.wait_for_log("limiter settings changed (algorithm): counts start afresh (another algorithm)");
    assert_eq!(client.as_account(Some("limited@example.com")).status, 200);
}
