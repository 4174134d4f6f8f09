//! A private PostgreSQL for `ledger up`: when `DATABASE_URL` is unset and nothing answers on the
//! default address, `up` runs its own cluster under `<data-dir>/pg` (data in `pg/data`, the
//! server's log in `pg/server.log`) from the PostgreSQL binaries installed on the machine, on a
//! free loopback port, with `fsync` on; the next `up` reuses it. It is stopped when `up` ends,
//! however `up` returns (Ctrl-C and SIGTERM included: [`PrivatePg`]'s `Drop`). A `ledger`
//! killed outright leaves the server running; the next `up` finds it by its `postmaster.pid`
//! and takes it over, and a server that died leaves a stale `postmaster.pid` that `pg_ctl start`
//! clears. PostgreSQL refuses to run as root, so as root every PostgreSQL command runs as the
//! `postgres` user (`runuser`), which owns `<data-dir>/pg`.
//!
//! Connections use the `postgres` role with `trust` on loopback only, as the default
//! `DATABASE_URL` does; no Unix socket is opened.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};

/// The address `ledger up` tries when `DATABASE_URL` is unset.
pub const DEFAULT_ADDR: &str = "127.0.0.1:5432";

/// The one command that installs PostgreSQL where it is missing.
pub const INSTALL_HINT: &str = "apt-get install -y postgresql";

/// Where `ledger up` looks for a database when `DATABASE_URL` is unset; part of `Settings`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PgSearch {
    /// The PostgreSQL `ledger up` uses when DATABASE_URL is unset, if it answers (HOST:PORT;
    /// default 127.0.0.1:5432); otherwise `up` runs a private cluster under its data dir.
    #[arg(long, env = "LEDGER_PG_DEFAULT_ADDR")]
    pub pg_default_addr: Option<String>,
    /// Directories (`:`-separated) searched for PostgreSQL's `initdb`, `pg_ctl` and `postgres`
    /// for that private cluster, instead of `pg_config --bindir` and /usr/lib/postgresql/*/bin.
    #[arg(long, env = "LEDGER_PG_BINDIR_SEARCH")]
    pub pg_bindir_search: Option<String>,
}

impl PgSearch {
    fn default_addr(&self) -> String {
        self.pg_default_addr
            .as_deref()
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .unwrap_or(DEFAULT_ADDR)
            .to_owned()
    }

    /// The directories to search, newest PostgreSQL first.
    fn bindir_candidates(&self) -> Vec<PathBuf> {
        if let Some(given) = &self.pg_bindir_search {
            return given
                .split(':')
                .filter(|d| !d.trim().is_empty())
                .map(PathBuf::from)
                .collect();
        }
        let mut dirs = Vec::new();
        if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
            let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if out.status.success() && !dir.is_empty() {
                dirs.push(PathBuf::from(dir));
            }
        }
        let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
                Some((version, e.path().join("bin")))
            })
            .collect();
        debian.sort_by_key(|d| std::cmp::Reverse(d.0));
        dirs.extend(debian.into_iter().map(|(_, dir)| dir));
        dirs
    }
}

/// The database `ledger up` uses: `DATABASE_URL` when set, else the default address when
/// something answers there, else a private cluster (returned, to be kept until `up` ends).
pub async fn database_for_up(
    database_url: Option<&str>,
    search: &PgSearch,
    data_dir: &Path,
) -> anyhow::Result<(String, Option<PrivatePg>)> {
    if let Some(url) = database_url.map(str::trim).filter(|u| !u.is_empty()) {
        return Ok((url.to_owned(), None));
    }
    let addr = search.default_addr();
    let answers = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect(&addr),
    )
    .await
    .is_ok_and(|c| c.is_ok());
    if answers {
        return Ok((format!("postgres://postgres@{addr}/ledger"), None));
    }
    let dir = data_dir.join("pg");
    let search = search.clone();
    let private = tokio::task::spawn_blocking(move || PrivatePg::start(dir, &search))
        .await
        .context("start the private PostgreSQL")??;
    println!(
        "PostgreSQL: nothing answers on {addr} and DATABASE_URL is unset; using a private \
         cluster: {} ({}) on 127.0.0.1:{}, data in {}",
        private.version,
        private.bindir.display(),
        private.port,
        private.data.display()
    );
    Ok((private.url(), Some(private)))
}

/// A running private cluster, stopped when dropped.
#[derive(Debug)]
pub struct PrivatePg {
    bindir: PathBuf,
    data: PathBuf,
    port: u16,
    version: String,
    /// The user PostgreSQL runs as when this process is root.
    run_as: Option<String>,
}

impl PrivatePg {
    /// The URL of the `ledger` database on it.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/ledger", self.port)
    }

    /// Finds the binaries, makes the cluster if it is new, and starts it (or takes over one
    /// already running on it).
    fn start(dir: PathBuf, search: &PgSearch) -> anyhow::Result<Self> {
        let candidates = search.bindir_candidates();
        let Some(bindir) = candidates.iter().find(|d| has_binaries(d)).cloned() else {
            bail!(
                "PostgreSQL is not installed (no initdb, pg_ctl and postgres in {}); install it with: {INSTALL_HINT}",
                shown(&candidates)
            );
        };
        let run_as = running_as_root().then(|| "postgres".to_owned());
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let dir = dir
            .canonicalize()
            .with_context(|| format!("resolve {}", dir.display()))?;
        if let Some(user) = &run_as {
            chown_to(&dir, user)?;
        }
        let version = output(Command::new(bindir.join("postgres")).arg("--version"))?;
        let mut pg = PrivatePg {
            data: dir.join("data"),
            bindir,
            port: 0,
            version: version.trim().to_owned(),
            run_as,
        };
        if !pg.data.join("PG_VERSION").exists() {
            pg.init(&dir)?;
        }
        pg.port = match pg.running_port() {
            Some(port) => port,
            None => pg.start_server(&dir)?,
        };
        Ok(pg)
    }

    /// A command for one of the PostgreSQL binaries, as the unprivileged user when root.
    fn command(&self, binary: &str) -> Command {
        let path = self.bindir.join(binary);
        match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(path);
                c
            }
            None => Command::new(path),
        }
    }

    fn init(&self, dir: &Path) -> anyhow::Result<()> {
        let mut initdb = self.command("initdb");
        initdb.arg("-D").arg(&self.data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
        ]);
        output(&mut initdb).context("initdb")?;
        // Loopback only, no Unix socket (its default directory may not be ours), fsync on.
        let settings = "\n# ledger up's private cluster\nlisten_addresses = '127.0.0.1'\n\
                        unix_socket_directories = ''\nfsync = on\nsynchronous_commit = on\n";
        let conf = self.data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).context("read postgresql.conf")?;
        text.push_str(settings);
        std::fs::write(&conf, text).context("write postgresql.conf")?;
        tracing::info!(dir = %dir.display(), "private PostgreSQL cluster made");
        Ok(())
    }

    /// The port of the server running on this cluster, if one is: a `ledger up` killed outright
    /// left it running.
    fn running_port(&self) -> Option<u16> {
        let mut status = self.command("pg_ctl");
        status.arg("status").arg("-D").arg(&self.data);
        let running = status.output().ok()?.status.success();
        if !running {
            return None;
        }
        // postmaster.pid: pid, data dir, start time, port, ...
        let pid_file = std::fs::read_to_string(self.data.join("postmaster.pid")).ok()?;
        pid_file.lines().nth(3)?.trim().parse().ok()
    }

    fn start_server(&self, dir: &Path) -> anyhow::Result<u16> {
        let port = free_port()?;
        let mut start = self.command("pg_ctl");
        start
            .arg("start")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(dir.join("server.log"))
            .args(["-w", "-t", "60", "-o"])
            .arg(format!("-p {port}"));
        output(&mut start).with_context(|| {
            format!(
                "start the private PostgreSQL (its log: {})",
                dir.join("server.log").display()
            )
        })?;
        Ok(port)
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let mut stop = self.command("pg_ctl");
        stop.arg("stop")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "-t", "60"]);
        match stop.output() {
            Ok(out) if out.status.success() => {
                println!("PostgreSQL: private cluster stopped");
            }
            Ok(out) => tracing::warn!(
                stderr = %String::from_utf8_lossy(&out.stderr).trim(),
                "stopping the private PostgreSQL failed"
            ),
            Err(e) => tracing::warn!(error = %e, "cannot run pg_ctl stop"),
        }
    }
}

fn has_binaries(dir: &Path) -> bool {
    ["initdb", "pg_ctl", "postgres"]
        .iter()
        .all(|b| dir.join(b).is_file())
}

fn shown(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        return "no directory found to search".to_owned();
    }
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs `command`; its stdout, or an error with its stderr.
fn output(command: &mut Command) -> anyhow::Result<String> {
    let out = command
        .output()
        .with_context(|| format!("run {:?}", command.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} failed ({}): {}",
            command.get_program(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the process's effective user.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Gives `dir` (not yet holding a cluster, or already the user's) to `user`.
fn chown_to(dir: &Path, user: &str) -> anyhow::Result<()> {
    let id = |flag: &str| -> anyhow::Result<u32> {
        let text = output(Command::new("id").args([flag, user])).with_context(|| {
            format!("PostgreSQL refuses to run as root and there is no {user} user to run it as")
        })?;
        text.trim().parse().context("parse id's answer")
    };
    let (uid, gid) = (id("-u")?, id("-g")?);
    std::os::unix::fs::chown(dir, Some(uid), Some(gid))
        .with_context(|| format!("give {} to {user}", dir.display()))
}

/// A loopback port free now.
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("find a free port")?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_search_can_be_pointed_at_given_directories() {
        let search = PgSearch {
            pg_default_addr: Some(" ".into()),
            pg_bindir_search: Some("/a::/b".into()),
        };
        assert_eq!(search.default_addr(), DEFAULT_ADDR);
        assert_eq!(
            search.bindir_candidates(),
            vec![PathBuf::from("/a"), PathBuf::from("/b")]
        );
    }

    #[test]
    fn no_binaries_gives_one_line_naming_the_install_command() {
        let empty = std::env::temp_dir().join(format!("ledger-no-pg-{}", std::process::id()));
        std::fs::create_dir_all(&empty).expect("an empty directory");
        let search = PgSearch {
            pg_default_addr: None,
            pg_bindir_search: Some(empty.display().to_string()),
        };
        let err = PrivatePg::start(empty.join("pg"), &search).unwrap_err();
        let _ = std::fs::remove_dir_all(&empty);
        let text = format!("{err:#}");
        assert!(
            !text.contains('\n') && text.contains(INSTALL_HINT),
            "{text}"
        );
    }
}
