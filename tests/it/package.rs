//! The package: `scripts/package --no-build` makes the .deb from the debug binaries the suite
//! already built; it carries `ledger`, `spot-core`, the three systemd units and the settings
//! file (a conffile); `systemd-analyze verify` passes on the units as packaged; and `ledger
//! serve`, run with exactly `ledger.service`'s ExecStart and its environment file (the shipped
//! one with a test database, secret and spot-core filled in), answers `/healthz`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::helpers::{SpotProcess, TestDb, JWT_SECRET};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// Runs `scripts/package --no-build`; the .deb's path.
fn package() -> PathBuf {
    let out = Command::new(repo_root().join("scripts/package"))
        .arg("--no-build")
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/package");
    assert!(out.status.success(), "scripts/package --no-build failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().expect("the package's path");
    repo_root().join(last.trim())
}

fn run(command: &mut Command) -> String {
    let out = command.output().expect("run");
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const UNITS: [&str; 3] = [
    "ledger.service",
    "spot-core@.service",
    "ledger-relay.service",
];

/// `systemd-analyze verify` on the units inside `root` (the extracted package, with the host's
/// own units beside them for the targets they name); any warning counts as a failure.
fn verify_units(root: &Path) {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        let installed = Command::new("apt-get")
            .args(["install", "-y", "-qq", "systemd"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .expect("run apt-get");
        assert!(
            installed.success(),
            "systemd-analyze is missing and cannot be installed"
        );
    }
    let host_units = root.join("usr/lib/systemd");
    std::fs::create_dir_all(&host_units).unwrap();
    run(Command::new("cp")
        .args(["-a", "/usr/lib/systemd/system"])
        .arg(&host_units));
    let mut verify = Command::new("systemd-analyze");
    verify
        .arg("verify")
        .arg("--man=no")
        .arg(format!("--root={}", root.display()));
    for unit in UNITS {
        verify.arg(root.join("lib/systemd/system").join(unit));
    }
    let out = verify.output().expect("run systemd-analyze");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {stderr}"
    );
}

/// KEY=value lines of an environment file, comments and blanks skipped.
fn env_file(text: &str) -> HashMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// The unit's ExecStart, its `${VAR}`s expanded from `env` as systemd does.
fn exec_start(unit: &str, env: &HashMap<String, String>) -> Vec<String> {
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("an ExecStart line");
    line.split_whitespace()
        .map(|word| {
            let mut word = word.to_owned();
            for (k, v) in env {
                word = word.replace(&format!("${{{k}}}"), v);
            }
            assert!(
                !word.contains('$'),
                "{word} is not set in the environment file"
            );
            word
        })
        .collect()
}

#[tokio::test]
async fn the_deb_carries_binaries_and_units_that_verify_and_serve() {
    let deb = package();
    let contents = run(Command::new("dpkg-deb").arg("--contents").arg(&deb));
    for path in [
        "./usr/bin/ledger",
        "./usr/bin/spot-core",
        "./lib/systemd/system/ledger.service",
        "./lib/systemd/system/spot-core@.service",
        "./lib/systemd/system/ledger-relay.service",
        "./etc/ledger/ledger.env",
    ] {
        assert!(
            contents.contains(path),
            "{path} is not in the package:\n{contents}"
        );
    }
    let conffiles = run(Command::new("dpkg-deb")
        .arg("--info")
        .arg(&deb)
        .arg("conffiles"));
    assert_eq!(conffiles.trim(), "/etc/ledger/ledger.env");

    let root = tempfile::tempdir().expect("tempdir");
    run(Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(root.path()));
    verify_units(root.path());

    // `ledger serve` as ledger.service runs it, from the package, with its environment file.
    let db = TestDb::new().await;
    let spot = SpotProcess::start();
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = free.local_addr().unwrap().to_string();
    drop(free);
    let shipped = std::fs::read_to_string(root.path().join("etc/ledger/ledger.env")).unwrap();
    let filled = format!(
        "{shipped}\nDATABASE_URL={}\nLEDGER_JWT_SECRET={}\nSPOT_CORE_TOKEN={}\n\
         LEDGER_LISTEN={listen}\nLEDGER_SPOT_URL={}\nLEDGER_METRICS_LISTEN=127.0.0.1:0\n",
        db.url,
        std::str::from_utf8(JWT_SECRET).unwrap(),
        spot.token,
        spot.addr,
    );
    let env = env_file(&filled);
    let unit =
        std::fs::read_to_string(root.path().join("lib/systemd/system/ledger.service")).unwrap();
    let argv = exec_start(&unit, &env);
    assert_eq!(argv[0], "/usr/bin/ledger");
    let binary = root.path().join("usr/bin/ledger");
    let mut serve = Command::new(&binary)
        .args(&argv[1..])
        .env_clear()
        .envs(&env)
        .current_dir(root.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the packaged ledger");
    let healthz = format!("http://{listen}/healthz");
    let deadline = Instant::now() + Duration::from_secs(60);
    let answered = loop {
        if let Ok(resp) = reqwest::get(&healthz).await {
            break resp.status().as_u16();
        }
        assert!(serve.try_wait().unwrap().is_none(), "ledger serve exited");
        assert!(Instant::now() < deadline, "no answer on {healthz}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = serve.kill();
    let _ = serve.wait();
    assert_eq!(answered, 200);
}
