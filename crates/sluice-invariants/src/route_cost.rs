//! Route costs and the normalised path they match.

use http::Method;
use sluice_http::{CostRule, RouteCosts, normalize_path};

use crate::input::Input;

const METHODS: [Method; 3] = [Method::GET, Method::POST, Method::DELETE];

fn costs() -> RouteCosts {
    RouteCosts::new([
        CostRule::new("/", None, 2),
        CostRule::new("/export", None, 3),
        CostRule::new("/export", Some(Method::POST), 11),
        CostRule::new("/api/v1/", None, 5),
        CostRule::new("/caf%C3%A9", None, 7),
        CostRule::new("/free", None, 0),
    ])
}

/// The most `method` can be charged (what a path that cannot be normalised pays).
fn most(method: &Method) -> u64 {
    if *method == Method::POST { 11 } else { 7 }
}

/// `data` as a method and a path: never a panic; a normalised path starts with `/`, is ASCII,
/// has no empty, `.` or `..` segment but a trailing `/`, is at most three times as long, and
/// normalises to itself; a path pays what its normal form pays, a path that has none pays
/// the most its method can; and respelling a normal path (escaping unreserved characters,
/// doubling slashes, adding `.` and `x/..` segments) changes neither its normal form nor its
/// cost.
///
/// # Example
/// ```
/// sluice_invariants::route_cost(b"\x00\x00//a/../%65xport");
/// ```
pub fn route_cost(data: &[u8]) {
    let mut input = Input::new(data);
    let method = METHODS[usize::from(input.byte()) % METHODS.len()].clone();
    let respelling = input.byte();
    let path = String::from_utf8_lossy(input.rest()).into_owned();
    let costs = costs();
    let cost = costs.cost(&method, &path);
    let normal = match normalize_path(&path) {
        Ok(normal) => normal.into_owned(),
        Err(e) => {
            assert!(!e.to_string().is_empty());
            assert_eq!(cost, most(&method), "{path:?} ({e})");
            return;
        }
    };
    is_normal(&normal, &path);
    assert_eq!(costs.cost(&method, &normal), cost, "{path:?} is {normal:?}");

    let respelled = respell(&normal, respelling, data);
    assert_eq!(
        normalize_path(&respelled).as_deref(),
        Ok(normal.as_str()),
        "{respelled:?} respells {normal:?}"
    );
    assert_eq!(costs.cost(&method, &respelled), cost, "{respelled:?}");
}

fn is_normal(normal: &str, path: &str) {
    assert!(
        normal.starts_with('/') && normal.is_ascii(),
        "{path:?} is {normal:?}"
    );
    assert!(normal.len() <= 3 * path.len().max(1), "{path:?} is {normal:?}");
    let segments: Vec<&str> = normal[1..].split('/').collect();
    let (last, inner) = segments.split_last().unwrap_or((&"", &[]));
    assert!(
        inner.iter().all(|s| !matches!(*s, "" | "." | "..")) && !matches!(*last, "." | ".."),
        "{path:?} is {normal:?}"
    );
    assert_eq!(
        normalize_path(normal).as_deref(),
        Ok(normal),
        "{path:?} is {normal:?}, not normal"
    );
}

/// `normal` spelled another way that every server reads as the same path, steered by `seed`
/// and the bytes of `noise`.
fn respell(normal: &str, seed: u8, noise: &[u8]) -> String {
    let mut choices = noise.iter().cycle().copied().map(|b| b ^ seed);
    let mut next = move || choices.next().unwrap_or(seed);
    let mut out = String::new();
    for segment in normal[1..].split('/') {
        out.push('/');
        match next() % 8 {
            0 => out.push('/'),
            1 => out.push_str("./"),
            2 => out.push_str("%2e/"),
            3 => out.push_str("zz/%2E%2e/"),
            _ => {}
        }
        // The two characters after a `%` belong to its escape: kept as they are.
        let mut in_escape = 0;
        for b in segment.bytes() {
            let unreserved = b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~');
            match next() % 4 {
                _ if in_escape > 0 => {
                    in_escape -= 1;
                    out.push(char::from(b));
                }
                _ if b == b'%' => {
                    in_escape = 2;
                    out.push('%');
                }
                0 if unreserved => out.push_str(&format!("%{b:02X}")),
                1 if unreserved => out.push_str(&format!("%{b:02x}")),
                _ => out.push(char::from(b)),
            }
        }
    }
    out
}
