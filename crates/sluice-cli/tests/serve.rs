//! `sluice serve` as users run it: the real binary, real sockets, real config files.

mod common;

use common::{Client, Response, Server, TempDir, sluice, wait_until};

/// Quotas slow enough that no refill happens during a test (one unit per 20 s or more).
const CONFIG: &str = "
fetch_latency: 0s
refresh: 1s
bypass: [admin@example.com]
accounts:
  ANONYMOUS: 2/min
  alice@example.com: 3/min
  carol@example.com: 5/min
  fast@example.com: 10/s
costs:
  - {path: /export, cost: 3}
";

fn start(config: &str) -> (Server, TempDir) {
    let dir = TempDir::new();
    let file = dir.write("sluice.yaml", config);
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    (server, dir)
}

/// Sends `n` requests as `account`, returning how many were admitted.
fn admitted(client: &mut Client, account: Option<&str>, n: usize) -> usize {
    (0..n)
        .map(|_| client.as_account(account))
        .inspect(|r| assert!(r.status == 200 || r.status == 429, "{r:?}"))
        .filter(|r| r.status == 200)
        .count()
}

#[test]
fn prints_one_listening_line_with_the_bound_port() {
    let (server, _dir) = start(CONFIG);
    assert_eq!(server.first_line, format!("listening on http://{}", server.addr));
    assert_ne!(server.addr.port(), 0);
    let r = server.client().as_account(Some("admin@example.com"));
    assert_eq!((r.status, r.body.as_str()), (200, "Hello World!"));
}

#[test]
fn each_account_gets_its_quota() {
    let (server, _dir) = start(CONFIG);
    let mut client = server.client();
    assert_eq!(admitted(&mut client, Some("alice@example.com"), 10), 3);
    assert_eq!(admitted(&mut client, Some("carol@example.com"), 10), 5);
    let denied = client.as_account(Some("alice@example.com"));
    assert_eq!((denied.status, denied.body.as_str()), (429, "Exceeded quota"));
}

#[test]
fn requests_without_a_key_share_the_anonymous_quota() {
    let (server, _dir) = start(CONFIG);
    assert_eq!(admitted(&mut server.client(), None, 5), 2);
    // Another connection, still anonymous: the same key, nothing left.
    assert_eq!(admitted(&mut server.client(), None, 3), 0);
    assert_eq!(admitted(&mut server.client(), Some("ANONYMOUS"), 3), 0);
}

#[test]
fn bypassed_keys_are_never_limited_and_carry_no_fields() {
    let (server, _dir) = start(CONFIG);
    let mut client = server.client();
    for _ in 0..200 {
        let r = client.as_account(Some("admin@example.com"));
        assert_eq!(r.status, 200);
        assert_eq!(r.header("ratelimit"), None);
    }
}

#[test]
fn unknown_accounts_get_the_unknown_quota() {
    let (server, _dir) = start(CONFIG);
    let mut client = server.client();
    // No fetch latency: the source's answer (unknown: 0/s) applies from the first request.
    for _ in 0..3 {
        let r = client.as_account(Some("mallory@example.com"));
        assert_eq!(r.status, 429);
        assert_eq!(
            r.number("retry-after"),
            1 << 31,
            "a quota that never refills: {r:?}"
        );
        assert_eq!(r.header("ratelimit-policy"), Some("\"default\";q=0"));
    }
}

#[test]
fn the_demo_applies_the_failsafe_quota_until_the_fetch_completes() {
    // No config: the built-in demo, whose quota fetch takes 100 ms (failsafe 10/s meanwhile).
    let server = Server::start(&[]);
    let mut client = server.client();
    let first = client.as_account(Some("alice@example.com"));
    assert_eq!(first.status, 200);
    assert_eq!(first.number("x-ratelimit-limit"), 10, "failsafe first: {first:?}");
    // Once fetched, alice is at 1/s; an unknown account at 0.
    wait_until("alice's own quota", || {
        client
            .as_account(Some("alice@example.com"))
            .header("x-ratelimit-limit")
            == Some("1")
    });
    let unknown = client.as_account(Some("nobody@example.com"));
    assert_eq!((unknown.status, unknown.number("x-ratelimit-limit")), (200, 10));
    wait_until("the unknown account's 0 quota", || {
        client
            .as_account(Some("nobody@example.com"))
            .header("x-ratelimit-limit")
            == Some("0")
    });
    assert_eq!(client.as_account(Some("nobody@example.com")).status, 429);
    assert_eq!(client.as_account(Some("admin@example.com")).status, 200);
}

/// New accounts whose quota fetch takes longer than the test: each would get the failsafe
/// quota (10), all of them together get the failsafe pool's 5 (its next unit in 12 minutes).
const POOLED: &str = "
fetch_latency: 30s
fetch_timeout: 60s
failsafe: 10/s
failsafe_pool: 5/h
";

/// 100 requests, each from a new account (all unknown): 100 were admitted, each on its own
/// failsafe quota. Now the pool's 5, and the rest denied as unknown accounts are, with the
/// pool's Retry-After. Fails with `failsafe_pool` left out of the config.
#[test]
fn a_flood_of_new_accounts_is_admitted_no_more_than_the_failsafe_pool() {
    let (server, _dir) = start(POOLED);
    let mut client = server.client();
    let mut admitted = 0;
    for n in 0..100 {
        let r = client.as_account(Some(&format!("new{n}@example.com")));
        match r.status {
            200 => admitted += 1,
            429 => {
                let retry = r.number("retry-after");
                assert!((600..=720).contains(&retry), "the pool's next unit: {r:?}");
                assert_eq!(r.header("ratelimit-policy"), Some("\"default\";q=0"), "{r:?}");
            }
            _ => panic!("{r:?}"),
        }
    }
    assert_eq!(admitted, 5);
}

/// 20 requests at once from one new account: 10 were admitted (its failsafe quota while its
/// fetch ran), now the pool's 5.
#[test]
fn concurrent_requests_of_one_new_account_are_bounded_by_the_failsafe_pool() {
    let (server, _dir) = start(POOLED);
    let barrier = std::sync::Barrier::new(20);
    let admitted = std::thread::scope(|scope| {
        let requests: Vec<_> = (0..20)
            .map(|_| {
                let (server, barrier) = (&server, &barrier);
                scope.spawn(move || {
                    let mut client = server.client();
                    barrier.wait();
                    let r = client.as_account(Some("mallory@example.com"));
                    assert!(r.status == 200 || r.status == 429, "{r:?}");
                    r.status == 200
                })
            })
            .collect();
        requests
            .into_iter()
            .filter_map(|r| r.join().unwrap().then_some(()))
            .count()
    });
    assert_eq!(admitted, 5);
}

fn check_fields(r: &Response) {
    let limit = r.number("x-ratelimit-limit");
    let remaining = r.number("x-ratelimit-remaining");
    let reset = r.number("x-ratelimit-reset");
    assert!(remaining <= limit);
    let policy = r.header("ratelimit-policy").unwrap();
    let window: u64 = policy.rsplit_once(";w=").unwrap().1.parse().unwrap();
    assert_eq!(policy, format!("\"default\";q={limit};w={window}"));
    assert!(reset <= window, "{r:?}");
    assert_eq!(
        r.header("ratelimit"),
        Some(format!("\"default\";r={remaining};t={reset}").as_str())
    );
}

#[test]
fn denials_carry_retry_after_and_the_rate_limit_fields() {
    let (server, _dir) = start(CONFIG);
    let mut client = server.client();
    for expected_remaining in [2, 1, 0] {
        let r = client.as_account(Some("alice@example.com"));
        assert_eq!(r.status, 200);
        assert_eq!(r.number("x-ratelimit-remaining"), expected_remaining);
        assert_eq!(r.header("retry-after"), None);
        check_fields(&r);
    }
    let r = client.as_account(Some("alice@example.com"));
    assert_eq!(r.status, 429);
    check_fields(&r);
    assert_eq!(r.header("ratelimit-policy"), Some("\"default\";q=3;w=60"));
    // One unit comes back every 20 s: retry after at most 20 s, at least 1.
    let retry = r.number("retry-after");
    assert!((1..=20).contains(&retry), "{r:?}");
}

#[test]
fn sub_second_waits_round_up_to_one_second_never_zero() {
    let (server, _dir) = start(CONFIG);
    let mut client = server.client();
    // 10/s: once the burst is gone a denial waits under 100 ms, which reads as 1, not 0.
    let mut denials = 0;
    for _ in 0..2000 {
        let r = client.as_account(Some("fast@example.com"));
        if r.status == 429 {
            assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");
            denials += 1;
        }
    }
    assert!(denials > 0, "2000 requests never exceeded 10/s");
}

#[test]
fn route_costs_take_more_units() {
    let (server, _dir) = start(CONFIG);
    let mut client = server.client();
    let r = client.get("/export", &[("X-Account-ID", "alice@example.com")]);
    assert_eq!((r.status, r.number("x-ratelimit-remaining")), (200, 0));
    assert_eq!(client.as_account(Some("alice@example.com")).status, 429);
    let r = client.get("/export", &[("X-Account-ID", "carol@example.com")]);
    assert_eq!((r.status, r.number("x-ratelimit-remaining")), (200, 2));
}

#[test]
fn oversized_keys_are_answered_400() {
    let (server, _dir) = start("key:\n  max_length: 16\naccounts:\n  a: 1/min\n");
    let mut client = server.client();
    let r = client.as_account(Some("12345678901234567"));
    assert_eq!((r.status, r.body.as_str()), (400, "Key too long"));
    let r = client.as_account(Some("1234567890123456"));
    assert_eq!(r.status, 429, "16 bytes is allowed (and unknown)");
    // The connection stays usable.
    assert_eq!(client.as_account(Some("a")).status, 200);
}

#[test]
fn forwarded_addresses_count_only_from_trusted_proxies() {
    let accounts =
        "fetch_latency: 0s\nkey:\n  from: [ip]\naccounts:\n  127.0.0.1: 5/min\n  203.0.113.9: 2/min\n";
    let forwarded = [("X-Forwarded-For", "6.6.6.6, 203.0.113.9")];

    let (untrusting, _d1) = start(accounts);
    let r = untrusting.client().get("/", &forwarded);
    assert_eq!(
        (r.status, r.number("x-ratelimit-limit")),
        (200, 5),
        "keyed by the peer"
    );

    let (trusting, _d2) = start(&format!("{accounts}trusted_proxies: [127.0.0.0/8]\n"));
    let mut client = trusting.client();
    let r = client.get("/", &forwarded);
    assert_eq!(
        (r.status, r.number("x-ratelimit-limit")),
        (200, 2),
        "keyed by the right-most untrusted"
    );
    assert_eq!(client.get("/", &[("X-Forwarded-For", "203.0.113.9")]).status, 200);
    assert_eq!(client.get("/", &[("X-Forwarded-For", "203.0.113.9")]).status, 429);
    // Forwarded is not the configured header (x-forwarded-for by default): not read, so
    // this is the proxy's own request.
    let r = client.get("/", &[("Forwarded", "for=203.0.113.9")]);
    assert_eq!((r.status, r.number("x-ratelimit-limit")), (200, 5));
    // The forged left-most entry changes nothing: still 203.0.113.9, still denied.
    assert_eq!(
        client
            .get("/", &[("X-Forwarded-For", "1.2.3.4, 203.0.113.9")])
            .status,
        429
    );
    // Without a header the trusted peer itself is the client.
    assert_eq!(client.get("/", &[]).number("x-ratelimit-limit"), 5);
}

/// Keyed by client IP behind a trusted proxy on 127.0.0.1, one request a minute each.
const BEHIND_A_PROXY: &str = "
fetch_latency: 0s
key:
  from: [ip]
trusted_proxies: [127.0.0.1/32]
unknown: 1/min
";

#[test]
fn a_client_cannot_pick_its_address_with_a_header_the_proxy_does_not_write() {
    let (server, _dir) = start(&format!("{BEHIND_A_PROXY}client_ip_header: x-forwarded-for\n"));
    let mut client = server.client();
    // The proxy appends the spoofer's real address to X-Forwarded-For; the spoofer makes up
    // a new Forwarded each time.
    let admitted = (0..20)
        .map(|i| {
            let forged = format!("for=198.51.100.{i}");
            client.get("/", &[("X-Forwarded-For", "203.0.113.8"), ("Forwarded", &forged)])
        })
        .inspect(|r| assert!(r.status == 200 || r.status == 429, "{r:?}"))
        .filter(|r| r.status == 200)
        .count();
    assert_eq!(admitted, 1);
    // With `forwarded` configured, X-Forwarded-For is the one ignored.
    let (server, _dir) = start(&format!("{BEHIND_A_PROXY}client_ip_header: forwarded\n"));
    let mut client = server.client();
    let statuses: Vec<u16> = (0..3)
        .map(|i| {
            let forged = format!("198.51.100.{i}");
            client
                .get(
                    "/",
                    &[("Forwarded", "for=203.0.113.8"), ("X-Forwarded-For", &forged)],
                )
                .status
        })
        .collect();
    assert_eq!(statuses, [200, 429, 429]);
}

#[test]
fn a_malformed_forwarding_header_is_refused_and_charges_no_one() {
    let (server, _dir) = start(BEHIND_A_PROXY);
    let mut proxied = server.client();
    let r = proxied.request_bytes("GET", "/", &[("X-Forwarded-For", b"\xff, 203.0.113.8")]);
    assert_eq!(
        (r.status, r.body.as_str()),
        (400, "Malformed X-Forwarded-For header")
    );
    let r = proxied.get("/", &[("X-Forwarded-For", "203.0.113.8, unknown")]);
    assert_eq!(
        (r.status, r.body.as_str()),
        (400, "X-Forwarded-For header gives no client address")
    );
    // Not keyed as the proxy: a plain request from another client on 127.0.0.1 still has
    // its one request.
    assert_eq!(server.client().get("/", &[]).status, 200);
    assert_eq!(server.client().get("/", &[]).status, 429);
    // Lines of the header continue one list: the proxy's appended line wins.
    let r = proxied.get(
        "/",
        &[
            ("X-Forwarded-For", "192.0.2.1"),
            ("X-Forwarded-For", "203.0.113.9"),
        ],
    );
    assert_eq!(r.status, 200);
    let r = proxied.get("/", &[("X-Forwarded-For", "192.0.2.2, 203.0.113.9")]);
    assert_eq!(r.status, 429, "the same client as the two lines above");
}

#[test]
fn ipv6_clients_share_their_network_s_quota() {
    let (server, _dir) = start(BEHIND_A_PROXY);
    let mut client = server.client();
    let r = client.get("/", &[("X-Forwarded-For", "2001:db8:1:2::1")]);
    assert_eq!(r.status, 200);
    // Another address of the same /64: the same key.
    assert_eq!(
        client
            .get("/", &[("X-Forwarded-For", "2001:db8:1:2:ffff::9")])
            .status,
        429
    );
    assert_eq!(
        client.get("/", &[("X-Forwarded-For", "2001:db8:1:3::1")]).status,
        200
    );
    // IPv4-mapped: the IPv4 client.
    assert_eq!(client.get("/", &[("X-Forwarded-For", "192.0.2.7")]).status, 200);
    assert_eq!(
        client.get("/", &[("X-Forwarded-For", "::ffff:192.0.2.7")]).status,
        429
    );

    let (server, _dir) = start(&format!("{BEHIND_A_PROXY}ipv6_prefix: 128\n"));
    let mut client = server.client();
    assert_eq!(
        client.get("/", &[("X-Forwarded-For", "2001:db8:1:2::1")]).status,
        200
    );
    assert_eq!(
        client.get("/", &[("X-Forwarded-For", "2001:db8:1:2::2")]).status,
        200
    );
}

#[test]
fn a_key_header_sent_twice_is_refused() {
    let (server, _dir) = start(CONFIG);
    let mut client = server.client();
    let r = client.get(
        "/",
        &[
            ("X-Account-ID", "alice@example.com"),
            ("X-Account-ID", "admin@example.com"),
        ],
    );
    assert_eq!((r.status, r.body.as_str()), (400, "Key header repeated"));
    // Nothing was counted against alice.
    assert_eq!(admitted(&mut client, Some("alice@example.com"), 10), 3);
}

#[test]
fn other_spellings_of_a_route_pay_its_cost() {
    let (server, _dir) = start(CONFIG);
    let mut client = server.client();
    // /export costs 3: alice's whole quota, carol's 3 of 5.
    let r = client.get("//export", &[("X-Account-ID", "alice@example.com")]);
    assert_eq!((r.status, r.number("x-ratelimit-remaining")), (200, 0));
    let r = client.get("/%65xport", &[("X-Account-ID", "carol@example.com")]);
    assert_eq!((r.status, r.number("x-ratelimit-remaining")), (200, 2));
    // Only 2 left: a third spelling is denied, as /export itself would be.
    let r = client.get("/a/../export", &[("X-Account-ID", "carol@example.com")]);
    assert_eq!(r.status, 429);
    // A path that cannot be normalised pays the most a rule charges: still 3.
    let r = client.get("/x%2F..%2Fexport", &[("X-Account-ID", "carol@example.com")]);
    assert_eq!(r.status, 429);
    assert_eq!(client.as_account(Some("carol@example.com")).status, 200);
}

#[test]
fn bearer_keys_and_combined_keys() {
    let (server, _dir) =
        start("fetch_latency: 0s\nkey:\n  from: [bearer, header:Client-Id]\naccounts:\n  k1|web: 1/min\n");
    let mut client = server.client();
    let headers = [("Authorization", "Bearer k1"), ("Client-Id", "web")];
    assert_eq!(client.get("/", &headers).status, 200);
    assert_eq!(client.get("/", &headers).status, 429);
    assert_eq!(
        client.get("/", &[("Authorization", "Bearer k1")]).status,
        429,
        "k1|ANONYMOUS is unknown"
    );
    // A '|' inside a part is escaped: `k1|web` + `x` is not `k1` + `web|x`.
    let (server, _dir) = start(
        "fetch_latency: 0s\nkey:\n  from: [bearer, header:Client-Id]\naccounts:\n  'k1\\|web|x': 1/min\n",
    );
    let mut client = server.client();
    let spoof = [("Authorization", "Bearer k1"), ("Client-Id", "web|x")];
    assert_eq!(client.get("/", &spoof).status, 429, "unknown: 0/s");
    let owner = [("Authorization", "Bearer k1|web"), ("Client-Id", "x")];
    assert_eq!(client.get("/", &owner).status, 200);
}

#[test]
fn a_bad_edit_keeps_the_running_config_and_a_good_edit_applies() {
    let dir = TempDir::new();
    let file = dir.write("sluice.yaml", CONFIG);
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    let mut client = server.client();
    assert_eq!(
        client
            .as_account(Some("alice@example.com"))
            .number("x-ratelimit-limit"),
        3
    );

    dir.write("sluice.yaml", &CONFIG.replace("3/min", "3/lightyear"));
    server.wait_for_log("accounts.alice@example.com: invalid quota \"3/lightyear\"");
    assert!(server.stderr().contains("keeping the running config"));
    let r = client.as_account(Some("alice@example.com"));
    assert_eq!(r.number("x-ratelimit-limit"), 3);
    assert_eq!(client.as_account(Some("admin@example.com")).status, 200);

    dir.write(
        "sluice.yaml",
        &CONFIG
            .replace("3/min", "7/min")
            .replace("[admin@example.com]", "[]"),
    );
    server.wait_for_log("config reloaded");
    // Held keys take their new quota at their next refresh (every 1 s here).
    wait_until("alice's new quota", || {
        client
            .as_account(Some("alice@example.com"))
            .header("x-ratelimit-limit")
            == Some("7")
    });
    assert_eq!(
        client.as_account(Some("admin@example.com")).status,
        429,
        "no longer bypassed"
    );
}

#[test]
fn sigterm_and_sigint_shut_down_cleanly() {
    for signal in ["TERM", "INT"] {
        let (mut server, _dir) = start(CONFIG);
        let mut client = server.client();
        assert_eq!(client.as_account(Some("admin@example.com")).status, 200);
        let status = server.signal(signal);
        assert!(status.success(), "SIG{signal}: {status:?}");
        assert!(server.stderr().contains("shut down"), "{}", server.stderr());
    }
    // A signal right after the listening line is not missed either.
    let (mut server, _dir) = start(CONFIG);
    assert!(server.signal("TERM").success());
}

fn validate(text: &str) -> (bool, String, String) {
    let dir = TempDir::new();
    let file = dir.write("config.yaml", text);
    let out = sluice().arg("validate").arg(&file).output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    (out.status.success(), stdout, stderr)
}

#[test]
fn validate_names_the_file_and_the_field() {
    let (ok, stdout, _) = validate(CONFIG);
    assert!(ok);
    assert!(stdout.contains("config.yaml: ok; max_connections "), "{stdout}");

    let cases = [
        (
            "accounts:\n  alice: 1/x\n",
            "accounts.alice: invalid quota \"1/x\"",
        ),
        ("failsafe: lots\n", "failsafe: invalid quota"),
        ("capacity: -1\n", "capacity:"),
        ("colour: blue\n", "colour: unknown field `colour`"),
        (
            "key:\n  from: [cookie]\n",
            "key.from[0]: invalid key part \"cookie\"",
        ),
        (
            "trusted_proxies: [nowhere]\n",
            "trusted_proxies[0]: invalid address range",
        ),
        ("algorithm: psychic\n", "algorithm: unknown algorithm \"psychic\""),
        ("accounts: {a: 1/s\n", "accounts"),
    ];
    for (text, expected) in cases {
        let (ok, _, stderr) = validate(text);
        assert!(!ok, "{text:?} passed");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.starts_with("sluice: "), "{stderr}");
        assert!(stderr.contains("config.yaml: "), "{stderr}");
        assert!(stderr.contains(expected), "{text:?}: {stderr}");
    }
}

#[test]
fn serve_refuses_a_bad_config_with_one_line() {
    let dir = TempDir::new();
    let file = dir.write("bad.yaml", "accounts:\n  alice: 1/x\n");
    let out = sluice().args(["serve", "--config"]).arg(&file).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("bad.yaml: accounts.alice: invalid quota"),
        "{stderr}"
    );
    let missing = sluice()
        .args(["validate", "/nonexistent/sluice.yaml"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(
        String::from_utf8(missing.stderr)
            .unwrap()
            .contains("/nonexistent/sluice.yaml: file:")
    );
}

#[test]
fn a_busy_address_is_one_line_and_a_failure() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = sluice().args(["serve", "--listen", &addr]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with(&format!("sluice: listen {addr}: ")), "{stderr}");
    assert!(
        String::from_utf8(out.stdout).unwrap().is_empty(),
        "no listening line"
    );
}

#[test]
fn a_second_server_on_a_busy_port_fails_instead_of_sharing_it() {
    // The first server listens on one socket per thread (SO_REUSEPORT); a second one, which
    // would set the option too, must still be refused the port.
    let (first, _dir) = start(CONFIG);
    let addr = first.addr.to_string();
    let out = sluice()
        .args(["serve", "--threads", "2", "--listen", &addr])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with(&format!("sluice: listen {addr}: ")), "{stderr}");
    assert_eq!(first.client().as_account(Some("admin@example.com")).status, 200);
}

/// Reads until the server closes the connection (true) or `within` passes (false).
fn closed_within(stream: &mut std::net::TcpStream, within: std::time::Duration) -> bool {
    use std::io::Read;
    stream.set_read_timeout(Some(within)).unwrap();
    let mut sink = [0u8; 1024];
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn silent_and_slow_connections_are_closed_and_busy_ones_kept() {
    use std::io::Write;
    use std::time::{Duration, Instant};
    let (server, _dir) = start(&format!("{CONFIG}idle_timeout: 1s\n"));

    // Opens and says nothing.
    let mut silent = std::net::TcpStream::connect(server.addr).unwrap();
    // Sends a request head a byte at a time, never finishing it (slowloris).
    let mut slow = std::net::TcpStream::connect(server.addr).unwrap();
    let slow_writer = {
        let mut slow = slow.try_clone().unwrap();
        std::thread::spawn(move || {
            for byte in b"GET / HTTP/1.1\r\nHost: test\r\nX-Slow: "
                .iter()
                .cycle()
                .take(40)
            {
                if slow.write_all(&[*byte]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // Sends a request every 200 ms for 4 s: never idle for a whole period.
    let mut busy = server.client();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        assert_eq!(busy.as_account(Some("admin@example.com")).status, 200);
        std::thread::sleep(Duration::from_millis(200));
    }

    // Within two periods (plus slack) of opening, both idle connections were closed.
    assert!(
        closed_within(&mut silent, Duration::from_secs(2)),
        "silent connection kept"
    );
    assert!(
        closed_within(&mut slow, Duration::from_secs(2)),
        "slow connection kept"
    );
    slow_writer.join().unwrap();
    assert_eq!(busy.as_account(Some("admin@example.com")).status, 200);
}
