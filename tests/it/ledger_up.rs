//! `ledger up` runs spot-core as its child. However the parent ends, even killed outright with
//! no chance to clean up, the child must not outlive it holding the WAL and the port.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::helpers::{bin, TestDb, JWT_SECRET};

/// The pid and state letter of every child of `parent`, from /proc.
fn children(parent: u32) -> Vec<(u32, char)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": the command name may hold spaces, so split after ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let ppid = fields.next().and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) {
            found.push((pid, state));
        }
    }
    found
}

/// Alive: present in /proc and not a zombie waiting to be reaped.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

#[tokio::test]
async fn ledger_up_killed_outright_takes_its_spot_core_child_with_it() {
    let db = TestDb::new().await;
    let data = tempfile::tempdir().expect("tempdir");
    let mut up = Command::new(bin("ledger"))
        .args(["up", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path())
        .env("DATABASE_URL", &db.url)
        .env(
            "LEDGER_JWT_SECRET",
            std::str::from_utf8(JWT_SECRET).expect("ascii secret"),
        )
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ledger up");
    let stdout = up.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.starts_with("ledger is up") => break,
            Some(Ok(_)) => {}
            _ => panic!("ledger up exited before it was up"),
        }
    }
    std::thread::spawn(move || for _ in lines {});

    let engines: Vec<u32> = children(up.id())
        .into_iter()
        .filter(|(_, state)| *state != 'Z')
        .map(|(pid, _)| pid)
        .collect();
    assert_eq!(engines.len(), 1, "ledger up runs one spot-core child");
    let engine = engines[0];
    assert!(alive(engine));

    up.kill().expect("SIGKILL ledger up");
    up.wait().expect("reap ledger up");

    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(engine) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !alive(engine),
        "spot-core (pid {engine}) outlived its killed parent"
    );
}
