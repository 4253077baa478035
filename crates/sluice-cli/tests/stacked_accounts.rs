//! An account of several quotas in `sluice serve` (`alice: [3/h, 2/day]`), over a socket: held
//! to each, a denial takes nothing from the others, the answer's fields are the tightest
//! quota's, and a reload that drops a quota keeps the others' counts.

mod common;

use common::{Server, TempDir, wait_until};

const CONFIG: &str = "
fetch_latency: 0s
failsafe: 1/h
unknown: 1/h
accounts:
  alice@example.com: [3/h, 2/day]
";

#[test]
fn an_account_of_several_quotas_is_held_to_each() {
    let dir = TempDir::new();
    let file = dir.write("sluice.yaml", CONFIG);
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    let mut client = server.client();
    let mut alice = || client.as_account(Some("alice@example.com"));
    let first = alice();
    assert_eq!(first.status, 200);
    // The day's quota is the tighter: 1 of 2 left (the hour's has 2 of 3).
    assert_eq!(first.header("x-ratelimit-limit"), Some("2"), "{first:?}");
    assert_eq!(first.header("x-ratelimit-remaining"), Some("1"), "{first:?}");
    assert_eq!(alice().status, 200);
    let denied = alice();
    assert_eq!(denied.status, 429);
    let retry: u64 = denied.header("retry-after").unwrap().parse().unwrap();
    assert!(retry > 3600, "the day's quota denied, not the hour's: {denied:?}");

    // Without the day's quota the hour's decides: the denial took nothing, one is left.
    dir.write("sluice.yaml", &CONFIG.replace("[3/h, 2/day]", "[3/h]"));
    wait_until("the reload to admit alice again", || alice().status == 200);
    assert_eq!(alice().status, 429, "the hour's three are spent");
}
