//! `upstream:`, the reverse proxy's section: every accepted form, and every refusal with the
//! field it names and what its message says.

use std::time::Duration;

use http::uri::Scheme;
use sluice_config::{
    DEFAULT_UPSTREAM_HEAD_TIMEOUT, HostHeader, UpstreamRoute, UpstreamSettings, UpstreamUrl, parse,
};

fn upstream(text: &str) -> UpstreamSettings {
    match parse(text) {
        Ok(settings) => settings.upstream.expect("an upstream"),
        Err(e) => panic!("{text:?}: {e}"),
    }
}

/// The field and the message of `text`'s refusal.
fn refused(text: &str) -> (String, String) {
    let e = parse(text).expect_err(text);
    assert!(!e.to_string().contains('\n'), "{e}");
    (e.field, e.message)
}

fn url(text: &str) -> UpstreamUrl {
    text.parse().unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

#[test]
fn no_section_is_the_demo_answer() {
    assert_eq!(parse("{}").unwrap().upstream, None);
    assert_eq!(parse("upstream:\n").unwrap().upstream, None);
    assert_eq!(parse(sluice_config::DEFAULT_CONFIG).unwrap().upstream, None);
}

#[test]
fn the_shorthand_sends_everything_to_one_url_with_every_default() {
    let s = upstream("upstream: http://127.0.0.1:3000\n");
    assert_eq!(
        s,
        UpstreamSettings {
            default: Some(url("http://127.0.0.1:3000")),
            routes: Vec::new(),
            host: HostHeader::Keep,
            connect_timeout: Duration::from_secs(5),
            head_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(60),
            max_idle: 256,
        }
    );
    // The same as the map with `url` alone.
    assert_eq!(s, upstream("upstream: {url: 'http://127.0.0.1:3000'}\n"));
    assert_eq!(s.upstream_for("/anything"), s.default.as_ref());
}

#[test]
fn every_field_of_the_map() {
    let s = upstream(
        "upstream:\n  url: http://127.0.0.1:3000\n  routes:\n    - {prefix: /api/, url: 'http://127.0.0.1:3001'}\n    \
         - {prefix: /static/, url: 'https://assets.internal:8443'}\n  host: upstream\n  \
         connect_timeout: 250ms\n  head_timeout: 30s\n  idle_timeout: 1h\n  max_idle: 0\n",
    );
    assert_eq!(s.default, Some(url("http://127.0.0.1:3000")));
    assert_eq!(
        s.routes,
        [
            UpstreamRoute {
                prefix: "/static/".into(),
                url: url("https://assets.internal:8443"),
            },
            UpstreamRoute {
                prefix: "/api/".into(),
                url: url("http://127.0.0.1:3001"),
            },
        ]
    );
    assert_eq!(s.host, HostHeader::Upstream);
    assert_eq!(
        (s.connect_timeout, s.head_timeout, s.idle_timeout),
        (
            Duration::from_millis(250),
            Duration::from_secs(30),
            Duration::from_secs(3600)
        )
    );
    assert_eq!(s.max_idle, 0);
    assert_eq!(
        upstream("upstream: {url: 'http://a', host: keep}\n").host,
        HostHeader::Keep
    );
    assert_eq!(
        upstream("upstream: {url: 'http://a', max_idle: 100000}\n").max_idle,
        100_000
    );
}

#[test]
fn routes_alone_and_the_longest_prefix_first_ties_in_file_order() {
    let s = upstream(
        "upstream:\n  routes:\n    - {prefix: /b/, url: 'http://b'}\n    - {prefix: /, url: 'http://root'}\n    \
         - {prefix: /a/, url: 'http://a'}\n    - {prefix: /api/v2/, url: 'http://v2'}\n    \
         - {prefix: /api, url: 'http://api'}\n",
    );
    assert_eq!(s.default, None);
    let prefixes: Vec<&str> = s.routes.iter().map(|r| r.prefix.as_str()).collect();
    assert_eq!(prefixes, ["/api/v2/", "/api", "/b/", "/a/", "/"]);
    let to = |path| s.upstream_for(path).map(|u| u.host().to_owned());
    assert_eq!(to("/api/v2/x").as_deref(), Some("v2"));
    // A plain string prefix: `/api` takes `/apiary` too.
    assert_eq!(to("/apiary").as_deref(), Some("api"));
    assert_eq!(to("/a/b").as_deref(), Some("a"));
    assert_eq!(to("/c").as_deref(), Some("root"));
    let s = upstream("upstream: {routes: [{prefix: /api/, url: 'http://api'}]}\n");
    assert_eq!(s.upstream_for("/other"), None);
}

#[test]
fn urls_are_origins_with_the_port_made_explicit() {
    for (text, tls, authority, shown) in [
        (
            "http://127.0.0.1:3000",
            false,
            "127.0.0.1:3000",
            "http://127.0.0.1:3000",
        ),
        (
            "http://127.0.0.1:3000/",
            false,
            "127.0.0.1:3000",
            "http://127.0.0.1:3000",
        ),
        ("http://app", false, "app:80", "http://app:80"),
        ("http://app:", false, "app:80", "http://app:80"),
        ("https://app", true, "app:443", "https://app:443"),
        (
            "https://App.Internal:8443/",
            true,
            "app.internal:8443",
            "https://app.internal:8443",
        ),
        ("HTTP://app:8080", false, "app:8080", "http://app:8080"),
        ("http://[::1]:3000", false, "[::1]:3000", "http://[::1]:3000"),
        (
            "https://[2001:db8::1]",
            true,
            "[2001:db8::1]:443",
            "https://[2001:db8::1]:443",
        ),
    ] {
        let u = url(text);
        assert_eq!((u.tls, u.authority.as_str()), (tls, authority), "{text}");
        assert_eq!(u.to_string(), shown, "{text}");
    }
    let v6 = url("http://[::1]:3000");
    assert_eq!((v6.host(), v6.port()), ("[::1]", 3000));
    assert_eq!(url("https://x").scheme(), Scheme::HTTPS);
}

#[test]
fn a_url_that_is_not_an_origin_is_refused_saying_why_and_what_is_accepted() {
    for (text, why) in [
        ("ftp://app", "scheme ftp is not http or https"),
        ("ws://app", "scheme ws is not http or https"),
        ("127.0.0.1:3000", "no scheme"),
        ("/app", "no scheme"),
        ("app", "no scheme"),
        ("http://", "not a URL"),
        ("http://:3000", "no host"),
        (
            "http://user:pass@app",
            "user information (user:password@) is not accepted",
        ),
        ("http://user@app", "user information"),
        ("http://app:0", "port 0 is not a port"),
        ("http://app:65536", "port 65536 is not a port"),
        ("http://app:+80", "port +80 is not a port"),
        ("http://app:http", "port http is not a port"),
        ("http://app/api", "a path prefix on the upstream is not supported"),
        ("http://app//", "a path (//) is not accepted"),
        ("http://app/?x=1", "a query is not accepted"),
        ("http://app?", "a query is not accepted"),
        ("http://app#top", "a fragment"),
        ("http://app/#", "a fragment"),
        ("http://a pp", "not a URL"),
        ("", "not a URL"),
    ] {
        let e = text.parse::<UpstreamUrl>().expect_err(text);
        let message = e.to_string();
        assert!(message.contains(why), "{text:?}: {message}");
        assert!(
            message.contains("http://HOST[:PORT] or https://HOST[:PORT]"),
            "{message}"
        );
    }
    // In the config, each names its field.
    for (text, field) in [
        ("upstream: ftp://app\n", "upstream.url"),
        ("upstream: {url: 'http://app/x'}\n", "upstream.url"),
        (
            "upstream: {routes: [{prefix: /a, url: 'http://a'}, {prefix: /b, url: 'http://u@b'}]}\n",
            "upstream.routes[1].url",
        ),
        (
            "upstream: {routes: [{prefix: /a, url: 'http://a?x'}]}\n",
            "upstream.routes[0].url",
        ),
    ] {
        let (f, message) = refused(text);
        assert_eq!(f, field, "{text:?}: {message}");
    }
}

#[test]
fn prefixes_are_path_starts_each_once() {
    // `prefix` as YAML writes it (double quotes take escapes).
    let route = |prefix: &str| {
        format!(
            "upstream:\n  routes:\n    - {{prefix: /ok, url: 'http://a'}}\n    - {{prefix: {prefix}, url: 'http://b'}}\n"
        )
    };
    let long = format!("/{}", "a".repeat(1024));
    for (prefix, why) in [
        ("api/", "must start with '/'"),
        ("''", "must start with '/'"),
        ("'/a b'", "whitespace or a control character"),
        ("\"/a\\tb\"", "whitespace or a control character"),
        ("\"/a\\x01\"", "whitespace or a control character"),
        ("\"/a\\u00a0\"", "whitespace or a control character"),
        ("\"/a\\u2028\"", "whitespace or a control character"),
        ("'/a?b'", "matched against the path alone"),
        ("'/a#b'", "matched against the path alone"),
        (long.as_str(), "longer than 1024 bytes"),
        ("/ok", "also the prefix of routes[0]: each prefix once"),
    ] {
        let (field, message) = refused(&route(prefix));
        assert_eq!(field, "upstream.routes[1].prefix", "{prefix:?}: {message}");
        assert!(message.contains(why), "{prefix:?}: {message}");
        if prefix != "/ok" {
            assert!(message.contains("such as /api/"), "{message}");
        }
    }
    // 1024 bytes is the longest.
    let longest = format!("/{}", "a".repeat(1023));
    assert_eq!(upstream(&route(&longest)).routes[0].prefix, longest);
    let (field, message) = refused("upstream: {routes: [{url: 'http://a'}]}\n");
    assert_eq!(field, "upstream.routes[0]");
    assert!(message.contains("missing field `prefix`"), "{message}");
    let (field, _) = refused("upstream: {routes: [{prefix: /a, url: 'http://a', strip: true}]}\n");
    assert_eq!(field, "upstream.routes[0].strip");
}

#[test]
fn at_most_a_thousand_routes() {
    let routes = |n: usize| {
        let items: Vec<String> = (0..n)
            .map(|i| format!("{{prefix: /r{i}/, url: 'http://a'}}"))
            .collect();
        format!("upstream: {{routes: [{}]}}\n", items.join(", "))
    };
    assert_eq!(upstream(&routes(1000)).routes.len(), 1000);
    let (field, message) = refused(&routes(1001));
    assert_eq!(field, "upstream.routes");
    assert!(message.contains("1001 routes, at most 1000"), "{message}");
}

#[test]
fn neither_url_nor_routes_is_refused() {
    for text in [
        "upstream: {}\n",
        "upstream: {routes: []}\n",
        "upstream: {host: upstream}\n",
    ] {
        let (field, message) = refused(text);
        assert_eq!(field, "upstream", "{text:?}");
        assert!(message.contains("give url or routes"), "{message}");
    }
}

#[test]
fn timeouts_are_longer_than_zero_and_at_most_an_hour() {
    for name in ["connect_timeout", "head_timeout", "idle_timeout"] {
        let text = |value: &str| format!("upstream:\n  url: http://a\n  {name}: {value}\n");
        for value in ["0", "0s", "3601s", "2h"] {
            let (field, message) = refused(&text(value));
            assert_eq!(field, format!("upstream.{name}"), "{value}: {message}");
            assert!(
                message.contains("must be longer than 0 and at most 1h"),
                "{message}"
            );
        }
        let (field, _) = refused(&text("soon"));
        assert_eq!(field, format!("upstream.{name}"));
        let (field, _) = refused(&text("5"));
        assert_eq!(field, format!("upstream.{name}"));
        let s = upstream(&text("1ns"));
        let s2 = upstream(&text("60min"));
        let got = |s: &UpstreamSettings| match name {
            "connect_timeout" => s.connect_timeout,
            "head_timeout" => s.head_timeout,
            _ => s.idle_timeout,
        };
        assert_eq!(
            (got(&s), got(&s2)),
            (Duration::from_nanos(1), Duration::from_secs(3600))
        );
    }
}

#[test]
fn max_idle_from_zero_to_a_hundred_thousand_and_host_keep_or_upstream() {
    for value in ["-1", "100001", "99999999999999"] {
        let (field, message) = refused(&format!("upstream: {{url: 'http://a', max_idle: {value}}}\n"));
        assert_eq!(field, "upstream.max_idle", "{value}");
        assert!(
            message.contains("must be between 0 (no idle connections kept) and 100000"),
            "{message}"
        );
    }
    let (field, _) = refused("upstream: {url: 'http://a', max_idle: many}\n");
    assert_eq!(field, "upstream.max_idle");
    for value in ["Keep", "client", "upstream_host", "''"] {
        let (field, message) = refused(&format!("upstream: {{url: 'http://a', host: {value}}}\n"));
        assert_eq!(field, "upstream.host", "{value}");
        assert!(
            message.contains("must be keep (the client's Host header) or upstream"),
            "{message}"
        );
    }
}

#[test]
fn other_shapes_and_unknown_keys_are_refused_by_name() {
    let (field, message) = refused("upstream: [http://a]\n");
    assert_eq!(field, "upstream");
    assert!(message.contains("an upstream URL"), "{message}");
    let (field, _) = refused("upstream: 3000\n");
    assert_eq!(field, "upstream");
    let (field, message) = refused("upstream: {url: 'http://a', prefix: /api/}\n");
    assert_eq!(field, "upstream.prefix");
    assert!(message.contains("expected one of `url`, `routes`"), "{message}");
}

#[test]
fn the_commented_example_in_the_default_config_is_valid() {
    let start = sluice_config::DEFAULT_CONFIG.find("# upstream:").unwrap();
    let end = start + sluice_config::DEFAULT_CONFIG[start..].find("\n\n").unwrap();
    let example: String = sluice_config::DEFAULT_CONFIG[start..end]
        .lines()
        .map(|line| format!("{}\n", line.strip_prefix("# ").unwrap_or(line)))
        .collect();
    let (before, after) = (
        &sluice_config::DEFAULT_CONFIG[..start],
        &sluice_config::DEFAULT_CONFIG[end..],
    );
    let s = parse(&format!("{before}{example}{after}")).unwrap();
    let s = s.upstream.unwrap();
    assert_eq!(s.default, Some(url("http://127.0.0.1:3000")));
    assert_eq!(s.routes.len(), 2);
    assert_eq!(s.host, HostHeader::Keep);
    assert_eq!(s.head_timeout, DEFAULT_UPSTREAM_HEAD_TIMEOUT);
}
