//! What holds this process's file descriptors, printed once when a test fails on "Too many open
//! files" (os error 24).
//!
//! Once, in a fresh clone's CI run, 123 of this binary's tests failed that way, starting about 90
//! s in, and the next run of the same commit passed; the limit is in the tens of thousands, so
//! something in the process held that many at that moment, and nothing said what. This census is
//! for the next time: descriptors by kind, sockets by the TCP port at their far end (5432 is
//! PostgreSQL, 4222 NATS, the rest a spot-core or a ledger of some test), files by directory,
//! and the test threads running at that moment.

use std::collections::BTreeMap;
use std::sync::Once;

static INSTALLED: Once = Once::new();
static PRINTED: Once = Once::new();

/// Installs, once per process, a panic hook that runs the default hook and then, at the first
/// panic naming os error 24, prints the census. Called from the helpers nearly every test goes
/// through (`helpers::server_url`, `helpers::bin`, the chaos tests' configuration): a test binary
/// has no start-up hook without `unsafe`, which the workspace forbids.
pub fn install() {
    INSTALLED.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default(info);
            let payload = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied())
                .unwrap_or("");
            if payload.contains("os error 24") || payload.contains("Too many open files") {
                PRINTED.call_once(|| eprintln!("{}", census()));
            }
        }));
    });
}

/// The census as text.
pub fn census() -> String {
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut socket_inodes = Vec::new();
    let mut total = 0;
    if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
        for entry in entries.flatten() {
            total += 1;
            let target = std::fs::read_link(entry.path())
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| "?".into());
            let kind = if let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
            {
                socket_inodes.push(inode.to_owned());
                "socket".to_owned()
            } else if target.starts_with("pipe:") {
                "pipe".to_owned()
            } else if let Some(anon) = target.strip_prefix("anon_inode:") {
                format!("anon_inode {anon}")
            } else {
                // A file: its directory, a temp dir's name cut to its prefix.
                let dir = std::path::Path::new(&target)
                    .parent()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default();
                format!("file in {dir}")
            };
            *kinds.entry(kind).or_default() += 1;
        }
    }
    let far_ports = far_ports(&socket_inodes);
    let limit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))
                .map(str::to_owned)
        })
        .unwrap_or_default();
    let mut out = format!("--- file descriptors of this test process: {total} ({limit}) ---\n");
    let mut by_count: Vec<_> = kinds.into_iter().collect();
    by_count.sort_by_key(|k| std::cmp::Reverse(k.1));
    for (kind, n) in by_count.iter().take(20) {
        out.push_str(&format!("  {n:>6}  {kind}\n"));
    }
    let mut ports: Vec<_> = far_ports.into_iter().collect();
    ports.sort_by_key(|k| std::cmp::Reverse(k.1));
    out.push_str("  sockets by (state, far port):\n");
    for ((state, port), n) in ports.iter().take(15) {
        out.push_str(&format!("  {n:>6}  {state} to :{port}\n"));
    }
    let threads = std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .map(|c| c.trim().to_owned())
                .filter(|c| !c.starts_with("tokio-runtime") && c != "it")
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    out.push_str(&format!("  test threads: {}\n", threads.join(", ")));
    out
}

/// TCP sockets among `inodes`, counted by (state, far port), from `/proc/self/net/tcp{,6}`.
fn far_ports(inodes: &[String]) -> BTreeMap<(String, u16), usize> {
    let wanted: std::collections::HashSet<&str> = inodes.iter().map(String::as_str).collect();
    let mut counts = BTreeMap::new();
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() < 10 || !wanted.contains(cols[9]) {
                continue;
            }
            let port = cols[2]
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok())
                .unwrap_or(0);
            let state = match cols[3] {
                "01" => "established",
                "02" => "syn-sent",
                "06" => "time-wait",
                "07" => "close",
                "08" => "close-wait",
                "0A" => "listen",
                other => other,
            };
            *counts.entry((state.to_owned(), port)).or_default() += 1;
        }
    }
    counts
}

#[test]
fn the_census_counts_this_process_descriptors() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let text = census();
    println!("{text}");
    assert!(text.contains("socket"), "{text}");
    assert!(text.contains("listen to :0"), "{text}");
    drop(listener);
}
