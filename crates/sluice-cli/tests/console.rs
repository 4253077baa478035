//! The admin console (`/ui`) in a real browser: Debian's Chromium, headless, driven through
//! ChromeDriver (installed by `scripts/ensure-chromium.sh`) while requests are being limited.
//! The page's numbers must move, its chart must draw, and a screenshot is saved to
//! `target/console.png`.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{Client, Server, TempDir, wait_until};
use serde_json::{Value, json};

const CONFIG: &str = "
admin: {listen: 127.0.0.1:0}
fetch_latency: 0s
accounts:
  alice@example.com: 5/s
  bob@example.com: 1000/s
";

/// A ChromeDriver on a free port, killed on drop.
struct Driver {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn which(program: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .unwrap();
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        !path.is_empty(),
        "{program} is not installed: run scripts/ensure-chromium.sh"
    );
    path
}

impl Driver {
    fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(which("chromedriver"))
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        wait_until("chromedriver", || std::net::TcpStream::connect(addr).is_ok());
        Self { child, addr }
    }

    /// One WebDriver command; its `value`.
    fn call(&self, method: &str, path: &str, body: &Value) -> Value {
        let mut client = Client::connect(self.addr).with_host(&self.addr.to_string());
        let body = if method == "GET" {
            String::new()
        } else {
            body.to_string()
        };
        let answer = client.send(method, path, &[("content-type", "application/json")], &body);
        let parsed: Value = serde_json::from_str(&answer.body).unwrap_or(Value::Null);
        assert_eq!(answer.status, 200, "{method} {path}: {}", answer.body);
        parsed["value"].clone()
    }
}

/// A headless Chromium session, ended on drop.
struct Browser {
    driver: Driver,
    id: String,
}

impl Browser {
    fn open(url: &str) -> Self {
        let driver = Driver::start();
        let session = driver.call(
            "POST",
            "/session",
            &json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": which("chromium"),
                    "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1000,1100"]
                }
            }}}),
        );
        let id = session["sessionId"].as_str().expect("a session").to_owned();
        driver.call("POST", &format!("/session/{id}/url"), &json!({ "url": url }));
        Self { driver, id }
    }

    /// Runs `source` in the page; what it returns.
    fn script(&self, source: &str) -> Value {
        self.driver.call(
            "POST",
            &format!("/session/{}/execute/sync", self.id),
            &json!({"script": source, "args": []}),
        )
    }

    /// An element's text.
    fn text(&self, element: &str) -> String {
        let found = self.script(&format!(
            "return document.getElementById('{element}').textContent"
        ));
        found.as_str().unwrap_or("").to_owned()
    }

    fn screenshot(&self) -> Vec<u8> {
        let png = self
            .driver
            .call("GET", &format!("/session/{}/screenshot", self.id), &json!({}));
        base64_decode(png.as_str().expect("a screenshot"))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let mut client = Client::connect(self.driver.addr).with_host(&self.driver.addr.to_string());
        let _ = client.send("DELETE", &format!("/session/{}", self.id), &[], "");
    }
}

/// Standard base64, as WebDriver sends screenshots.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= u32::from(value(*c)) << (18 - 6 * i);
        }
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

#[test]
fn the_console_shows_live_rates_a_chart_and_the_keys_denied() {
    let dir = TempDir::new();
    let file = dir.write("sluice.yaml", CONFIG);
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    let admin = server.admin.expect("admin.listen is set");

    // Load until the test ends: alice over her 5/s, bob within his quota.
    let running = Arc::new(AtomicBool::new(true));
    let load = {
        let running = Arc::clone(&running);
        let addr = server.addr;
        std::thread::spawn(move || {
            let mut client = Client::connect(addr);
            while running.load(Ordering::Relaxed) {
                client.as_account(Some("alice@example.com"));
                client.as_account(Some("bob@example.com"));
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        })
    };

    let browser = Browser::open(&format!("http://{admin}/ui"));
    let script = |source: &str| browser.script(source);
    // The page polls every second: the numbers move and the chart gets points.
    let number = |element: &str| -> u64 {
        script(&format!(
            "return document.getElementById('{element}').textContent"
        ))
        .as_str()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0)
    };
    wait_until("four samples on the chart", || number("samples") >= 4);
    wait_until("denials a second shown", || number("denied-rate") > 0);
    let first = script("return document.getElementById('rules').textContent");
    wait_until("the rules' counts to move", || {
        script("return document.getElementById('rules').textContent") != first
    });
    // Drawn: the canvas holds coloured pixels, in both series' colours.
    let drawn = script(
        "const c = document.getElementById('chart');
         const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
         let green = 0, red = 0;
         for (let i = 0; i < d.length; i += 4) {
           if (d[i + 1] > 100 && d[i] < 80) green++;
           if (d[i] > 150 && d[i + 1] < 80) red++;
         }
         return [green, red];",
    );
    assert!(
        drawn[0].as_u64().unwrap_or(0) > 50 && drawn[1].as_u64().unwrap_or(0) > 50,
        "{drawn}"
    );
    // The keys alice is denied for, and health.
    wait_until("alice among the keys denied most", || {
        script("return document.getElementById('top').textContent")
            .as_str()
            .is_some_and(|text| text.contains("alice@example.com"))
    });
    let health = script("return document.getElementById('health').textContent");
    assert!(health.as_str().unwrap_or("").contains("ready"), "{health}");

    let png = browser.screenshot();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/console.png");
    std::fs::write(&target, &png).unwrap();

    drop(browser);
    running.store(false, Ordering::Relaxed);
    load.join().unwrap();
}

#[test]
fn the_console_edits_the_rules_with_the_users_token() {
    let store = TempDir::new();
    store.write(
        "tokens",
        "writer write writer-0123456789abcdef\nhosts read reader-0123456789abcdef\n",
    );
    let rules = common::RulesService::start(&store, &["--tokens", "tokens"]);
    let edge =
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";
    let mut api = Client::connect(rules.addr);
    let writer = ("authorization", "Bearer writer-0123456789abcdef");
    assert_eq!(api.send("PUT", "/v1/domains/edge", &[writer], edge).status, 201);
    let dir = TempDir::new();
    let file = dir.write(
        "sluice.yaml",
        &format!(
            "admin: {{listen: 127.0.0.1:0}}\napi: {{listen: 127.0.0.1:0}}\nrules: {{url: \"http://{}\", poll: 100ms, token: reader-0123456789abcdef, snapshot: rules.json}}\n",
            rules.addr
        ),
    );
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    let browser = Browser::open(&format!("http://{}/ui", server.admin.unwrap()));
    wait_until("the editor shown", || {
        browser.script("return !document.getElementById('editor').hidden") == json!(true)
    });
    browser.script(
        "document.getElementById('token').value = 'writer-0123456789abcdef';
         document.getElementById('list').click();",
    );
    wait_until("the domains listed", || browser.text("domains").contains("edge"));
    browser.script("document.getElementById('load').click();");
    wait_until("edge loaded", || browser.text("saved").starts_with("loaded edge"));
    browser.script(
        "const text = document.getElementById('text');
         text.value = text.value.replace('requests_per_unit: 5', 'requests_per_unit: 7');
         document.getElementById('save').click();",
    );
    wait_until("saved", || browser.text("saved").starts_with("saved edge"));
    // Stored, and polled in by the host.
    let stored = api.get("/v1/domains/edge", &[writer]);
    assert!(stored.body.contains("requests_per_unit: 7"), "{stored:?}");
    server.wait_for_log("revision=2");
    // A stale save is refused and says so: the page still holds revision 2's ETag.
    assert_eq!(
        api.send("PUT", "/v1/domains/edge", &[writer, ("if-match", "\"2\"")], edge)
            .status,
        200
    );
    browser.script("document.getElementById('save').click();");
    wait_until("refused", || browser.text("saved").starts_with("not saved: 412"));
}
