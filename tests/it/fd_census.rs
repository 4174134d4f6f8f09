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
use std::fs::File;
use std::io::{Read, Seek};
use std::sync::{Mutex, Once};

static INSTALLED: Once = Once::new();
static PRINTED: Once = Once::new();

/// What the census reads, opened when the hook is installed: at the moment it runs no descriptor
/// may be left to open anything (the first census printed "0 descriptors" for that reason). The
/// `/proc/self/fd` directory is rewound and read again, link targets are read relative to it
/// (`readlinkat` takes no descriptor), the `/proc` tables are read again from offset 0, and the
/// spare handles are closed first so that listing the threads has a few to use.
struct Kept {
    fd_dir: rustix::fs::Dir,
    tables: Vec<File>,
    limits: Option<File>,
    spare: Vec<File>,
}

static KEPT: Mutex<Option<Kept>> = Mutex::new(None);

fn keep() -> Option<Kept> {
    let dir = File::open("/proc/self/fd").ok()?;
    Some(Kept {
        fd_dir: rustix::fs::Dir::new(dir).ok()?,
        tables: ["/proc/self/net/tcp", "/proc/self/net/tcp6"]
            .iter()
            .filter_map(|t| File::open(t).ok())
            .collect(),
        limits: File::open("/proc/self/limits").ok(),
        spare: (0..8)
            .filter_map(|_| File::open("/dev/null").ok())
            .collect(),
    })
}

/// Installs, once per process, a panic hook that runs the default hook and then, at the first
/// panic naming os error 24, prints the census. Called from the helpers nearly every test goes
/// through (`helpers::server_url`, `helpers::bin`, the chaos tests' configuration): a test binary
/// has no start-up hook without `unsafe`, which the workspace forbids.
pub fn install() {
    INSTALLED.call_once(|| {
        *KEPT.lock().unwrap_or_else(|e| e.into_inner()) = keep();
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

/// Re-reads a kept `/proc` file from its start.
fn reread(file: &mut File) -> String {
    let mut text = String::new();
    if file.rewind().is_ok() {
        let _ = file.read_to_string(&mut text);
    }
    text
}

/// The kind of one descriptor's target: a socket (its inode kept), a pipe, an anonymous inode or
/// a file by its directory.
fn kind_of(target: &str, socket_inodes: &mut Vec<String>) -> String {
    if let Some(inode) = target
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
        let dir = std::path::Path::new(target)
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        format!("file in {dir}")
    }
}

/// The census as text.
pub fn census() -> String {
    let mut guard = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        *guard = keep();
    }
    let Some(kept) = guard.as_mut() else {
        return "--- file descriptors: /proc/self/fd could not be opened ---".into();
    };
    kept.spare.clear();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut socket_inodes = Vec::new();
    kept.fd_dir.rewind();
    let mut names = Vec::new();
    while let Some(Ok(entry)) = kept.fd_dir.read() {
        let name = entry.file_name().to_owned();
        if !name.as_bytes().starts_with(b".") {
            names.push(name);
        }
    }
    let dir_fd = kept.fd_dir.fd().ok();
    for name in &names {
        let target = dir_fd
            .and_then(|fd| rustix::fs::readlinkat(fd, name.as_c_str(), Vec::new()).ok())
            .map(|t| t.to_string_lossy().into_owned())
            .unwrap_or_else(|| "?".into());
        *kinds
            .entry(kind_of(&target, &mut socket_inodes))
            .or_default() += 1;
    }
    let tables: Vec<String> = kept.tables.iter_mut().map(reread).collect();
    let far_ports = far_ports(&socket_inodes, &tables);
    let limit = kept
        .limits
        .as_mut()
        .map(reread)
        .and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))
                .map(str::to_owned)
        })
        .unwrap_or_default();
    let mut out = format!(
        "--- file descriptors of this test process: {} ({limit}) ---\n",
        names.len()
    );
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
    // The spare handles were closed above, so listing the threads has a few descriptors to use.
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

/// TCP sockets among `inodes`, counted by (state, far port), from the text of
/// `/proc/self/net/tcp{,6}`.
fn far_ports(inodes: &[String], tables: &[String]) -> BTreeMap<(String, u16), usize> {
    let wanted: std::collections::HashSet<&str> = inodes.iter().map(String::as_str).collect();
    let mut counts = BTreeMap::new();
    for text in tables {
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

/// The census at the moment it is for: no descriptor left. In a child process of this binary
/// (its limit lowered there, never in the process the other tests share), every descriptor is
/// taken, and the census must still count them and name the files that took them.
#[test]
fn the_census_counts_with_no_descriptor_left() {
    const CHILD: &str = "FD_CENSUS_EXHAUSTED_CHILD";
    const NAME: &str = "fd_census::the_census_counts_with_no_descriptor_left";
    if std::env::var_os(CHILD).is_some() {
        install();
        let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum;
        rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: Some(200),
                maximum: hard,
            },
        )
        .unwrap();
        let mut held = Vec::new();
        let error = loop {
            match File::open("/dev/zero") {
                Ok(f) => held.push(f),
                Err(e) => break e,
            }
        };
        assert_eq!(error.raw_os_error(), Some(24), "{error}");
        println!("{}", census());
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture", "--test-threads", "1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let total: usize = text
        .split("descriptors of this test process: ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no census printed: {text}"));
    assert!(total >= 190, "{text}");
    assert!(text.contains("file in /dev"), "{text}");
}
