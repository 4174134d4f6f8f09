//! The binary's fixed values and configuration files: the JWT secret (from the settings'
//! `LEDGER_JWT_SECRET` or a per-data-dir file), generated secret files, the asset list, the
//! pool's size, spot-core's timeouts, the shutdown grace, and address and URL helpers. Nothing
//! here reads the environment: `settings.rs` does.

use std::fs::OpenOptions;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use domain::AssetRegistry;
use rand::TryRngCore;

/// Connections in the PostgreSQL pool of one ledger process.
pub const POOL_CONNECTIONS_MAX: u32 = 16;

/// How long one call to spot-core may take before its outcome counts as unknown.
pub const SPOT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// How long `ledger up` waits for the spot-core child to say where it listens.
pub const SPOT_START_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a shutdown waits for requests still in progress before it stops anyway.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The shortest secret accepted: HS256 wants at least 256 bits of key.
pub const JWT_SECRET_BYTES_MIN: usize = 32;

/// Lifetime of the tokens `ledger up` prints and `ledger token` mints by default.
pub const TOKEN_TTL_DEFAULT: Duration = Duration::from_secs(24 * 60 * 60);

pub const JWT_SECRET_ENV: &str = "LEDGER_JWT_SECRET";

/// The secret file's name inside a data dir.
pub const JWT_SECRET_FILE: &str = "jwt.secret";

/// The URL without its password, fit for printing.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((credentials, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match credentials.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

/// Where a JWT secret came from; `ledger up` says which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    Environment,
    StoredFile(PathBuf),
    GeneratedFile(PathBuf),
}

/// The signing secret. Its bytes are the UTF-8 text itself (env value or file content), so
/// `LEDGER_JWT_SECRET=$(cat <data-dir>/jwt.secret)` gives another process the same key.
#[derive(Clone)]
pub struct JwtSecret {
    pub bytes: Vec<u8>,
    pub source: SecretSource,
}

impl std::fmt::Debug for JwtSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtSecret")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// A secret's bytes, refused when shorter than [`JWT_SECRET_BYTES_MIN`].
pub fn checked_secret(text: &str, origin: &str) -> anyhow::Result<Vec<u8>> {
    let text = text.trim();
    if text.len() < JWT_SECRET_BYTES_MIN {
        bail!("{origin}: the JWT secret must be at least {JWT_SECRET_BYTES_MIN} bytes");
    }
    Ok(text.as_bytes().to_vec())
}

/// The secret stored in `data_dir`, if there is one.
pub fn secret_from_file(data_dir: &Path) -> anyhow::Result<Option<JwtSecret>> {
    let path = data_dir.join(JWT_SECRET_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(JwtSecret {
            bytes: checked_secret(&text, &path.display().to_string())?,
            source: SecretSource::StoredFile(path),
        })),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
    }
}

/// The configured secret (`LEDGER_JWT_SECRET`), else the data dir's stored secret, else a new
/// random one stored there (32 random bytes as 64 hex digits, file mode 0600).
pub fn secret_for_data_dir(
    configured: Option<JwtSecret>,
    data_dir: &Path,
) -> anyhow::Result<JwtSecret> {
    match configured {
        Some(secret) => Ok(secret),
        None => stored_or_generated_secret(data_dir),
    }
}

/// Creates `path` holding a new random secret (32 random bytes as 64 hex digits), mode 0600,
/// synced. `None` when the file exists already: another process wrote it first, and its secret
/// is to be used rather than replaced. The one way the ledger generates a secret file (the JWT
/// secret, the token shared with a spot-core child).
pub fn generate_secret_file(path: &Path) -> anyhow::Result<Option<String>> {
    let mut raw = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut raw)
        .context("read random bytes from the OS")?;
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let created = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    match created {
        Ok(mut file) => {
            file.write_all(hex.as_bytes())
                .and_then(|()| file.sync_all())
                .with_context(|| format!("write {}", path.display()))?;
            Ok(Some(hex))
        }
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(None),
        Err(e) => Err(e).with_context(|| format!("create {}", path.display())),
    }
}

/// The data dir's stored secret, or a new random one stored there.
pub fn stored_or_generated_secret(data_dir: &Path) -> anyhow::Result<JwtSecret> {
    if let Some(secret) = secret_from_file(data_dir)? {
        return Ok(secret);
    }
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("create data dir {}", data_dir.display()))?;
    let path = data_dir.join(JWT_SECRET_FILE);
    match generate_secret_file(&path)? {
        Some(hex) => Ok(JwtSecret {
            bytes: hex.into_bytes(),
            source: SecretSource::GeneratedFile(path),
        }),
        None => secret_from_file(data_dir)?
            .with_context(|| format!("{} vanished while being read", path.display())),
    }
}

/// The asset list from `path`, or the shipped default.
pub fn load_assets(path: Option<&Path>) -> anyhow::Result<AssetRegistry> {
    let Some(path) = path else {
        return Ok(AssetRegistry::default_assets());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("read asset config {}", path.display()))?;
    AssetRegistry::from_json(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// A spot-core address as `HOST:PORT`; a `tcp://` prefix is accepted and dropped.
pub fn spot_addr(text: &str) -> anyhow::Result<String> {
    // A replicated cell (ADR 0020) names its three replicas, comma-separated: the client
    // connects to whichever leads.
    let mut addrs = Vec::new();
    for part in text.split(',') {
        let addr = part
            .trim()
            .strip_prefix("tcp://")
            .unwrap_or(part.trim())
            .trim_end_matches('/');
        match addr.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                addrs.push(addr.to_owned())
            }
            _ => bail!(
                "--spot-url must be HOST:PORT, or the replicas' HOST:PORT comma-separated, got {text:?}"
            ),
        }
    }
    Ok(addrs.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted_from_printed_urls() {
        assert_eq!(
            redact_url("postgres://me:hunter2@db:5432/ledger"),
            "postgres://me:***@db:5432/ledger"
        );
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1:5432/ledger"),
            "postgres://postgres@127.0.0.1:5432/ledger"
        );
    }

    #[test]
    fn spot_addresses_are_host_and_port() {
        assert_eq!(spot_addr("127.0.0.1:7001").unwrap(), "127.0.0.1:7001");
        assert_eq!(spot_addr("tcp://localhost:7001").unwrap(), "localhost:7001");
        assert!(spot_addr("localhost").is_err());
        assert!(spot_addr(":80").is_err());
        assert_eq!(
            spot_addr("a:1, tcp://b:2,c:3").unwrap(),
            "a:1,b:2,c:3",
            "a replicated cell's three replicas"
        );
        assert!(spot_addr("a:1,b").is_err());
    }

    #[test]
    fn a_generated_secret_is_stored_private_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("ledger-secret-{}", domain::ReqId::generate()));
        let first = stored_or_generated_secret(&dir).unwrap();
        assert!(matches!(first.source, SecretSource::GeneratedFile(_)));
        assert_eq!(first.bytes.len(), 64);
        let mode = std::fs::metadata(dir.join(JWT_SECRET_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let second = stored_or_generated_secret(&dir).unwrap();
        assert!(matches!(second.source, SecretSource::StoredFile(_)));
        assert_eq!(first.bytes, second.bytes);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
