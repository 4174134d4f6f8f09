//! The console (`/console`) and GraphiQL (`GET /graphql`) work on a network that reaches nothing
//! else. First proof: the pages and every file they load name no other host (each `http(s)://`
//! URL served is in the reviewed `query-api/vendor/external-urls.txt`, every `src`, `href` and
//! CSS `url()` is this origin's or `data:`), and each response carries the strict CSP. Second
//! proof: the operator's flows run in Debian's headless Chromium inside a network namespace with
//! only loopback (`tests/browser/flows.mjs`), against a real `ledger serve`, real PostgreSQL and a
//! real spot-core, and every request the browser made went to the ledger's origin.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

use crate::helpers::{token, ApiStack, Stack};
use crate::procs::LedgerProcess;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The reviewed URLs: the first column of every line that is not a comment.
fn reviewed_urls() -> BTreeSet<String> {
    let path = repo_root().join("query-api/vendor/external-urls.txt");
    let text = std::fs::read_to_string(&path).expect("the reviewed URL list");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (url, why) = l.split_once('\t').expect("URL<TAB>why");
            assert!(!why.trim().is_empty(), "{url} has no reason");
            url.to_owned()
        })
        .collect()
}

/// Every `http://` or `https://` URL in `body`, cut where scripts/vendor-graphiql cuts.
fn urls_in(body: &str) -> Vec<String> {
    let stop = |c: char| c.is_whitespace() || "\"'`<>(){}|\\^[]".contains(c);
    let mut found = Vec::new();
    for scheme in ["http://", "https://"] {
        let mut rest = body;
        while let Some(at) = rest.find(scheme) {
            let tail = &rest[at..];
            let end = tail.find(stop).unwrap_or(tail.len());
            // A bare scheme (a string prefix the code compares with) names no host.
            if end > scheme.len() {
                found.push(tail[..end].to_owned());
            }
            rest = &tail[scheme.len()..];
        }
    }
    found
}

/// The values of `attr="..."` in an HTML page.
fn attribute_values(html: &str, attr: &str) -> Vec<String> {
    let needle = format!("{attr}=\"");
    html.match_indices(&needle)
        .filter_map(|(at, _)| {
            let rest = &html[at + needle.len()..];
            rest.find('"').map(|end| rest[..end].to_owned())
        })
        .collect()
}

/// The targets of `url(...)` in a style sheet.
fn css_urls(css: &str) -> Vec<String> {
    css.match_indices("url(")
        .filter_map(|(at, _)| {
            let rest = &css[at + 4..];
            rest.find(')')
                .map(|end| rest[..end].trim_matches(['"', '\'', ' ']).to_owned())
        })
        .collect()
}

async fn get(api: &ApiStack, path: &str) -> reqwest::Response {
    let response = api
        .http
        .get(format!("{}{path}", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "GET {path}");
    response
}

fn assert_guarded(path: &str, headers: &reqwest::header::HeaderMap) {
    let csp = headers
        .get("content-security-policy")
        .unwrap_or_else(|| panic!("{path} has no CSP"))
        .to_str()
        .unwrap();
    assert_eq!(csp, query_api::console::CONTENT_SECURITY_POLICY, "{path}");
    for directive in [
        "default-src 'none'",
        "script-src 'self';",
        "style-src 'self';",
        "connect-src 'self';",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "{path}: {directive} in {csp}");
    }
    assert!(!csp.contains("unsafe"), "{path}: {csp}");
    assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
    assert!(headers.get("set-cookie").is_none(), "{path} sets a cookie");
}

#[tokio::test]
async fn console_and_graphiql_and_every_file_they_load_name_no_other_host() {
    let api = ApiStack::start().await;
    let reviewed = reviewed_urls();
    let mut loaded = BTreeSet::new();
    let mut to_read: Vec<String> = vec!["/console".into(), "/graphql".into()];
    while let Some(path) = to_read.pop() {
        if !loaded.insert(path.clone()) {
            continue;
        }
        let response = get(&api, &path).await;
        assert_guarded(&path, response.headers());
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        let body = response.text().await.unwrap();
        for url in urls_in(&body) {
            assert!(
                reviewed.contains(&url),
                "{path} names {url}, which external-urls.txt does not list"
            );
        }
        let references = if content_type.starts_with("text/html") {
            let mut refs = attribute_values(&body, "src");
            refs.extend(attribute_values(&body, "href"));
            refs
        } else if content_type.starts_with("text/css") {
            css_urls(&body)
        } else {
            Vec::new()
        };
        for reference in references {
            if reference.starts_with("data:") || reference.starts_with('#') {
                continue;
            }
            assert!(
                reference.starts_with('/') && !reference.starts_with("//"),
                "{path} loads {reference}, not a path on this origin"
            );
            to_read.push(reference);
        }
    }
    // Every file compiled in was reached from the two pages (nothing served goes unchecked).
    for name in query_api::console::asset_names() {
        assert!(
            loaded.contains(&format!("/console/{name}")),
            "/console/{name} is not loaded by either page: {loaded:?}"
        );
    }
    let (status, body) = api
        .call(reqwest::Method::GET, "/console/nothing.js", None, None)
        .await;
    assert_eq!((status, body["code"].as_str()), (404, Some("NOT_FOUND")));
}

/// The namespace, Chromium, Node and playwright-core, installed by the project's own script
/// when missing; a machine that cannot have them fails the test, saying why.
fn ensure_browser_tools() {
    let status = std::process::Command::new(repo_root().join("scripts/ensure-browser-tests"))
        .status()
        .expect("run scripts/ensure-browser-tests");
    assert!(
        status.success(),
        "scripts/ensure-browser-tests failed: the browser test cannot run"
    );
    let probe = std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "true"])
        .output()
        .expect("run unshare");
    assert!(
        probe.status.success(),
        "cannot make an unprivileged network namespace (unshare --user --map-root-user --net): {}; \
         the browser must run with no route to any other address, so this test cannot run here",
        String::from_utf8_lossy(&probe.stderr).trim()
    );
}

/// Pipes each connection to `path` to the ledger's TCP address, until the test ends.
fn bridge(path: &Path, ledger: &str) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::UnixListener::bind(path).expect("bind the bridge's socket");
    let ledger = ledger.to_owned();
    tokio::spawn(async move {
        while let Ok((mut inside, _)) = listener.accept().await {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                if let Ok(mut outside) = tokio::net::TcpStream::connect(&ledger).await {
                    let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
                }
            });
        }
    })
}

/// A FUNDING→SPOT transfer sent while spot-core is stopped: its deposit's outcome is unknown,
/// so it stays open in TARGET_PENDING (the recovery worker is told to leave it alone).
async fn hold_one_open(s: &mut Stack, ledger: &LedgerProcess, user: &str) -> String {
    s.spot.kill();
    let answer: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/api/v1/internal_transfer", ledger.base))
        .bearer_auth(user)
        .json(&json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "7.125"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["state"], "TARGET_PENDING", "{answer}");
    s.spot.restart();
    answer["req_id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_flows_in_headless_chromium_with_no_route_elsewhere() {
    ensure_browser_tools();
    let mut s = Stack::start().await;
    s.deposit(7, "USDT", "100").await;
    let ledger = LedgerProcess::start(
        &s.db.url,
        &s.spot,
        &[
            ("LEDGER_RECOVERY_STALE_MS", "3600000"),
            ("LEDGER_ALERT_REQUESTS_PER_MINUTE", "2"),
        ],
    );
    let user = token(7, false);
    let stuck = hold_one_open(&mut s, &ledger, &user).await;
    let tcp = ledger.base.trim_start_matches("http://").to_owned();
    let port = tcp.rsplit(':').next().unwrap().to_owned();
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("ledger.sock");
    let _bridge = bridge(&socket, &tcp);
    let out = repo_root().join("target/browser-screenshots");
    std::fs::create_dir_all(&out).unwrap();
    let run = tokio::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "--", "sh", "-c"])
        .arg("ip link set lo up && exec node tests/browser/flows.mjs")
        .current_dir(repo_root())
        .env("LEDGER_SOCKET", &socket)
        .env("LEDGER_PORT", &port)
        .env("ADMIN_TOKEN", token(1, true))
        .env("USER_TOKEN", &user)
        .env("STUCK_REQ_ID", &stuck)
        .env("OUT_DIR", &out)
        .env("PROFILE_DIR", tmp.path().join("profile"))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("the browser flows finish within 300 s")
        .expect("start unshare");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}\n{stderr}");
    assert!(
        output.status.success(),
        "browser flows failed ({}):\n{stdout}\n{stderr}\nledger log:\n{}",
        output.status,
        ledger.log()
    );
    assert!(stdout.contains("all 6 flows passed"), "{stdout}");
}
