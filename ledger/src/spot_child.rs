//! spot-core as a child process of `ledger up`: started on an ephemeral port (the `spot-core`
//! binary beside this executable, or this executable's hidden `spot-core` subcommand) with
//! `--exit-with-stdin` on a pipe never written, so the engine stops with its parent even when the
//! parent is killed outright; its stdout drained, its exit watched, killed and reaped at the
//! end; and the token the two share, stored in the data dir.

use std::path::Path;
use std::process::Stdio;

use crate::config;
use anyhow::{anyhow, bail, Context};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command as ChildCommand};

use crate::settings::options::SpotStorage;

/// The line spot-core prints on stdout once it accepts connections.
pub(crate) const SPOT_READY_PREFIX: &str = "spot-core listening on ";

/// The file in `ledger up`'s data dir holding the token shared with its spot-core child.
pub(crate) const SPOT_TOKEN_FILE: &str = "spot.token";

pub(crate) async fn child_exit(child: &mut Option<SpotChild>) -> String {
    match child {
        Some(c) => match c.child.wait().await {
            Ok(status) => status.to_string(),
            Err(e) => format!("cannot wait for it: {e}"),
        },
        None => std::future::pending().await,
    }
}

/// A spot-core engine running as a child of `ledger up`.
pub(crate) struct SpotChild {
    pub(crate) child: Child,
    pub(crate) addr: String,
    /// The write end of the child's stdin, never written: when this process ends, however it
    /// ends, the kernel closes it and the child (`--exit-with-stdin`) stops too.
    _lifeline: ChildStdin,
    /// Copies the child's stdout to stderr (a full pipe would block the engine). Owned by the
    /// child: it ends with the pipe, and is aborted when this value is dropped.
    drain: tokio::task::JoinHandle<()>,
}

impl Drop for SpotChild {
    fn drop(&mut self) {
        self.drain.abort();
    }
}

impl SpotChild {
    /// The command that runs spot-core on an ephemeral port with these settings: the `spot-core`
    /// binary beside this executable if there is one, else this executable's hidden `spot-core`
    /// subcommand; its stdin and stdout piped, killed if dropped.
    fn command(
        data_dir: &Path,
        assets: Option<&Path>,
        token_file: &Path,
        storage: &SpotStorage,
        cell: Option<u16>,
    ) -> anyhow::Result<ChildCommand> {
        let exe = std::env::current_exe().context("locate the ledger executable")?;
        let beside = exe.with_file_name("spot-core");
        let mut command = if beside.is_file() {
            ChildCommand::new(&beside)
        } else {
            let mut c = ChildCommand::new(&exe);
            c.arg("spot-core");
            c
        };
        command
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--token-file")
            .arg(token_file)
            .arg("--exit-with-stdin")
            // The file is the one token; an inherited variable must not stand in for it.
            .env_remove(spot_core::TOKEN_ENV)
            // The engine reports its own `service.name` (`spot-core`); the ledger's, if set, is
            // not its. The other OTEL_* variables (where to send spans) it shares.
            .env_remove("OTEL_SERVICE_NAME");
        if let Some(assets) = assets {
            command.arg("--assets").arg(assets);
        }
        command.args(storage.args());
        if let Some(cell) = cell {
            command.arg("--cell-id").arg(cell.to_string());
        }
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Any early return below (or a panic) must not leave an orphan engine running.
            .kill_on_drop(true);
        Ok(command)
    }

    /// Starts spot-core on an ephemeral port: the `spot-core` binary beside this executable if
    /// there is one, else this executable's hidden `spot-core` subcommand. Returns once the child
    /// has printed its ready line, or fails after [`config::SPOT_START_TIMEOUT`]. With `cell`,
    /// the engine is that cell (`--cell-id`) and refuses clients of another.
    pub(crate) async fn start(
        data_dir: &Path,
        assets: Option<&Path>,
        token_file: &Path,
        storage: &SpotStorage,
        cell: Option<u16>,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("create spot-core data dir {}", data_dir.display()))?;
        let mut command = Self::command(data_dir, assets, token_file, storage, cell)?;
        let mut child = command.spawn().context("start spot-core")?;
        let lifeline = child
            .stdin
            .take()
            .context("spot-core's stdin was not captured")?;
        let stdout = child
            .stdout
            .take()
            .context("spot-core's stdout was not captured")?;
        let mut lines = BufReader::new(stdout).lines();
        let ready = async {
            while let Some(line) = lines.next_line().await? {
                if let Some(addr) = line.strip_prefix(SPOT_READY_PREFIX) {
                    return Ok(addr.trim().to_owned());
                }
                eprintln!("spot-core: {line}");
            }
            bail!("spot-core exited before saying where it listens")
        };
        let addr = tokio::time::timeout(config::SPOT_START_TIMEOUT, ready)
            .await
            .map_err(|_| {
                anyhow!(
                    "spot-core did not say where it listens within {} s",
                    config::SPOT_START_TIMEOUT.as_secs()
                )
            })??;
        // Keep draining its stdout: a full pipe would block the engine.
        let drain = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("spot-core: {line}");
            }
        });
        tracing::info!(%addr, data_dir = %data_dir.display(), "spot-core child started");
        Ok(Self {
            child,
            addr,
            _lifeline: lifeline,
            drain,
        })
    }

    /// Kills the engine and reaps it. Killing is safe by design: spot-core acknowledges nothing
    /// before its WAL record is fsynced, and replays the WAL on the next start.
    pub(crate) async fn stop(mut self) {
        match self.child.kill().await {
            Ok(()) => tracing::info!("spot-core child stopped"),
            Err(e) => tracing::warn!(error = %e, "could not stop the spot-core child"),
        }
    }
}

/// The token `ledger up` shares with its spot-core child: the one stored in `path`, or a new
/// random one (32 bytes as 64 hex digits) stored there with mode 0600.
pub(crate) fn stored_or_generated_spot_token(path: &Path) -> anyhow::Result<String> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::read_to_string(path) {
        Ok(text) if !text.trim().is_empty() => {
            let mode = std::fs::metadata(path)?.permissions().mode();
            if mode & 0o077 != 0 {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                    .with_context(|| format!("make {} private", path.display()))?;
            }
            return Ok(text.trim().to_owned());
        }
        Ok(_) => std::fs::remove_file(path)
            .with_context(|| format!("remove empty {}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    }
    config::generate_secret_file(path)?
        .with_context(|| format!("{} was created by someone else meanwhile", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spot_token_is_generated_private_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("ledger-spot-token-{}", ulid_like()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(SPOT_TOKEN_FILE);
        let token = stored_or_generated_spot_token(&path).unwrap();
        assert_eq!(token.len(), 64);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(stored_or_generated_spot_token(&path).unwrap(), token);
        // spot-core reads the same file and gets the same token.
        let args = <spot_core::Args as clap::Parser>::try_parse_from([
            "spot-core".as_ref(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--data-dir".as_ref(),
            dir.as_os_str(),
            "--token-file".as_ref(),
            path.as_os_str(),
        ])
        .unwrap();
        assert_eq!(spot_core::resolve_token(&args).unwrap(), Some(token));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn ulid_like() -> String {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        format!("{}-{nanos}", std::process::id())
    }
}
