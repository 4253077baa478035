//! What a host reads from the rules service: the snapshot's JSON (`Snapshot::from_json`, also
//! the snapshot file it keeps), and the service's whole HTTP answer to a poll.

use std::time::Duration;

use bytes::Bytes;
use sluice_descriptors::{Rule, parse_domain};
use sluice_rules_client::{Fetched, PollError, RulesSource, Snapshot, SnapshotBody};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::input::Input;
use crate::service::block_on;

/// The bounds on an answer's body a poll is given.
const MAX_BYTES: [usize; 3] = [16, 256, 64 * 1024];

/// `data` as a snapshot's JSON: never a panic; it is taken exactly when it is a snapshot's
/// JSON whose every domain's rules check and name the domain they are filed under, no two
/// the same; taken, it holds the revision and every domain's rules as written.
///
/// # Example
/// ```
/// sluice_invariants::snapshot(br#"{"revision": 2, "domains": [{"domain": "d", "revision": 2, "rules": "domain: d\ndescriptors: []\n"}]}"#);
/// sluice_invariants::snapshot(br#"{"revision": -1}"#);
/// ```
pub fn snapshot(data: &[u8]) {
    let taken = Snapshot::from_json(Bytes::copy_from_slice(data));
    let body: SnapshotBody = match serde_json::from_slice(data) {
        Ok(body) => body,
        Err(_) => {
            assert!(matches!(taken, Err(PollError::Json(_))), "{taken:?}");
            return;
        }
    };
    let mut expected = Vec::new();
    let mut names = std::collections::HashSet::new();
    let (mut faulty, mut repeated) = (None, false);
    for filed in &body.domains {
        match parse_domain(&filed.rules) {
            Ok(rules) if rules.name() == filed.domain => {
                repeated |= !names.insert(filed.domain.clone());
                expected.extend(rules.rules().cloned());
            }
            _ => {
                faulty = Some(filed.domain.clone());
                break;
            }
        }
    }
    // Every domain is checked first; a domain filed twice is found when they are joined.
    let refused = faulty.or(repeated.then(|| "(snapshot)".to_string()));
    match (taken, refused) {
        (Ok(snapshot), None) => {
            assert_eq!(snapshot.revision, body.revision);
            assert_eq!(snapshot.rules.domains().count(), body.domains.len());
            assert_eq!(
                sorted(snapshot.rules.rules().cloned().collect()),
                sorted(expected)
            );
        }
        (Err(PollError::Rules { domain, .. }), Some(faulty)) => assert_eq!(domain, faulty),
        (taken, refused) => panic!("{taken:?}, yet the domain at fault is {refused:?}"),
    }
}

/// `data` as the rules service's answer to a poll (the first byte says how: as the whole
/// HTTP answer, or as the body of a 200 with a length, of a chunked 200, or a 304; the second
/// gives the revision the host holds and the bound on the body), read by a host's
/// `RulesSource` over a connection the service closes after it: never a panic, and always an
/// answer; a 304 is taken as unchanged only when the host said what it holds; a body over the
/// bound is refused as too large; a refusal's detail is short; a 200's body is taken exactly
/// as the snapshot's JSON would be.
///
/// # Example
/// ```
/// sluice_invariants::rules_answer(b"\x01\x00{\"revision\": 1, \"domains\": []}");
/// sluice_invariants::rules_answer(b"\x00\x05HTTP/1.1 304 Not Modified\r\n\r\n");
/// ```
pub fn rules_answer(data: &[u8]) {
    let mut input = Input::new(data);
    let how = input.byte() % 4;
    let held = input.byte();
    let known = (held & 1 == 1).then_some(u64::from(held >> 3));
    let max_bytes = MAX_BYTES[usize::from(held >> 1 & 3) % MAX_BYTES.len()];
    let rest = input.rest();
    let answer = match how {
        0 => rest.to_vec(),
        1 => [
            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", rest.len()).as_bytes(),
            rest,
        ]
        .concat(),
        2 => {
            let mut answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
            for chunk in rest.chunks(7) {
                answer.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                answer.extend_from_slice(chunk);
                answer.extend_from_slice(b"\r\n");
            }
            answer.extend_from_slice(b"0\r\n\r\n");
            answer
        }
        _ => b"HTTP/1.1 304 Not Modified\r\netag: \"7\"\r\n\r\n".to_vec(),
    };
    let fetched = block_on(poll(answer.clone(), known, max_bytes));

    match &fetched {
        Err(PollError::Timeout(_)) => panic!("no answer from a connection that closed"),
        Err(PollError::Connect { .. }) => panic!("a connect on a connection already made"),
        Ok(Fetched::Unchanged) => assert!(known.is_some(), "unchanged from nothing"),
        Err(PollError::TooLarge(bound)) => {
            assert_eq!(*bound, max_bytes);
            assert!(
                answer.len() > max_bytes,
                "a body of at most {} bytes",
                answer.len()
            );
        }
        Err(PollError::Refused { status }) => assert!([401, 403].contains(status), "{status}"),
        Err(PollError::Status { status, detail }) => {
            assert!(![200, 401, 403].contains(status), "{status}");
            assert!(
                *status != 304 || known.is_none(),
                "a 304 after asking with a revision"
            );
            assert!(
                detail.chars().count() <= 200,
                "{} characters",
                detail.chars().count()
            );
        }
        _ => {}
    }
    match how {
        1 | 2 if rest.len() > max_bytes => {
            assert!(matches!(fetched, Err(PollError::TooLarge(_))), "{fetched:?}");
        }
        1 | 2 => match (fetched, Snapshot::from_json(Bytes::copy_from_slice(rest))) {
            (Ok(Fetched::Changed(polled)), Ok(read)) => {
                assert_eq!(polled.revision, read.revision);
                let rules = |s: &Snapshot| sorted(s.rules.rules().cloned().collect());
                assert_eq!(rules(&polled), rules(&read));
            }
            (Err(PollError::Json(_)), Err(PollError::Json(_))) => {}
            (Err(PollError::Rules { domain: a, .. }), Err(PollError::Rules { domain: b, .. })) => {
                assert_eq!(a, b);
            }
            (polled, read) => panic!("polled {polled:?}, read as a snapshot {read:?}"),
        },
        3 if known.is_some() => assert!(matches!(fetched, Ok(Fetched::Unchanged)), "{fetched:?}"),
        3 => assert!(
            matches!(fetched, Err(PollError::Status { status: 304, .. })),
            "{fetched:?}"
        ),
        _ => {}
    }
}

/// One poll by a host holding `known`, answered with `answer`, after which the service
/// closes the connection.
async fn poll(answer: Vec<u8>, known: Option<u64>, max_bytes: usize) -> Result<Fetched, PollError> {
    let source = match RulesSource::new("http://rules.invalid:8083", Some("t0ken")) {
        Ok(source) => source.timeout(Duration::from_secs(2)).max_bytes(max_bytes),
        Err(e) => panic!("{e}"),
    };
    let (host, mut service) = tokio::io::duplex(64 * 1024);
    let serve = async move {
        // The request first, as a server reads it; the answer whatever the host does.
        let mut request = [0; 4096];
        let _ = service.read(&mut request).await;
        let _ = service.write_all(&answer).await;
        let _ = service.shutdown().await;
        // Held open until the host is done reading, as a socket's peer would be.
        let _ = service.read_to_end(&mut Vec::new()).await;
    };
    let (fetched, ()) = tokio::join!(source.fetch_on(host, known), serve);
    fetched
}

fn sorted(mut rules: Vec<Rule>) -> Vec<Rule> {
    rules.sort_by(|a, b| a.id.cmp(&b.id));
    rules
}
