//! The failover settings a `DATABASE_URL` carries: its hosts (one URL each, libpq's
//! `target_session_attrs` checked and taken out) and each host's Patroni REST API (the `patroni`
//! query parameter), with the one question asked of a Patroni: does it lead?

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::probe::PROBE_TIMEOUT;

/// The query parameter naming each host's Patroni REST API, in the hosts' order.
pub const PATRONI_PARAM: &str = "patroni";

/// One host's Patroni REST API: `http://host:port` (plain HTTP; `GET /primary` needs no
/// credentials, so none are taken).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatroniUrl {
    pub host: String,
    pub port: u16,
}

impl PatroniUrl {
    /// `http://host[:port][/]`, port 8008 (Patroni's default) when none is given.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let Some(rest) = text.strip_prefix("http://") else {
            bail!("patroni URL {text:?} in DATABASE_URL: only http://host:port is supported");
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['@', '/', '?', '#']) || rest.is_empty() {
            bail!(
                "patroni URL {text:?} in DATABASE_URL: expected http://host:port and nothing more"
            );
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) if !p.contains(']') => (
                h,
                p.parse::<u16>()
                    .with_context(|| format!("patroni URL {text:?}: bad port"))?,
            ),
            _ => (rest, 8008),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            bail!("patroni URL {text:?} in DATABASE_URL names no host");
        }
        Ok(Self {
            host: host.to_owned(),
            port,
        })
    }

    /// Whether this Patroni answers 200 on `/primary` within [`PROBE_TIMEOUT`]: it holds the
    /// leader key and its PostgreSQL runs as primary. No answer, another status or a slow
    /// answer count as "no". One HTTP/1.0 `HEAD` on a fresh connection (the status alone, no
    /// body; Patroni's REST server answers and closes), read to its end so that Patroni is not
    /// left writing to a closed socket.
    pub async fn leads(&self) -> bool {
        matches!(
            tokio::time::timeout(PROBE_TIMEOUT, self.primary_status()).await,
            Ok(Ok(200))
        )
    }

    async fn primary_status(&self) -> std::io::Result<u16> {
        let mut stream = tokio::net::TcpStream::connect((self.host.as_str(), self.port)).await?;
        let host = if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        };
        stream
            .write_all(
                format!("HEAD /primary HTTP/1.0\r\nHost: {host}\r\nUser-Agent: ledger\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
        let mut head = Vec::with_capacity(256);
        let mut buf = [0u8; 256];
        // Headers only; a server that keeps sending is cut off at 4 KiB.
        while head.len() < 4096 {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok(status_of(&head).unwrap_or(0))
    }
}

/// The status code of an HTTP status line (`HTTP/1.0 200 OK`).
pub(super) fn status_of(head: &[u8]) -> Option<u16> {
    let line = std::str::from_utf8(head).ok()?.lines().next()?;
    let mut words = line.split_whitespace();
    words.next().filter(|v| v.starts_with("HTTP/"))?;
    words.next()?.parse().ok()
}

/// One URL per host of a libpq-style multi-host URL, `target_session_attrs` taken out (every
/// pool of the ledger writes, so only `read-write` or `primary` is accepted, and it is what
/// the pool does with or without it), and `patroni` taken out ([`patroni_urls`] reads it).
pub fn split_hosts(url: &str) -> anyhow::Result<Vec<String>> {
    let (scheme, rest) = url
        .split_once("://")
        .context("DATABASE_URL is not a URL (postgres://...)")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let tail = without_session_attrs(tail)?;
    let urls: Vec<String> = hosts
        .split(',')
        .map(|host| format!("{scheme}://{user}{host}{tail}"))
        .collect();
    if hosts.split(',').any(str::is_empty) {
        bail!("DATABASE_URL lists an empty host");
    }
    Ok(urls)
}

/// The `patroni` query parameter's URLs, in order (`None`: the URL names none). Commas
/// separate them; `%2C`, `%3A` and `%2F` are read as `,`, `:` and `/` for a URL encoded
/// whole.
pub fn patroni_urls(url: &str) -> anyhow::Result<Option<Vec<PatroniUrl>>> {
    let Some((_, query)) = url.split_once('?') else {
        return Ok(None);
    };
    let mut found = None;
    for pair in query.split('&') {
        if let Some(value) = pair
            .strip_prefix(PATRONI_PARAM)
            .and_then(|v| v.strip_prefix('='))
        {
            if found.is_some() {
                bail!("DATABASE_URL names patroni= twice");
            }
            let value = value
                .replace("%2C", ",")
                .replace("%2c", ",")
                .replace("%3A", ":")
                .replace("%3a", ":")
                .replace("%2F", "/")
                .replace("%2f", "/");
            let list = value
                .split(',')
                .map(PatroniUrl::parse)
                .collect::<anyhow::Result<Vec<_>>>()?;
            found = Some(list);
        }
    }
    Ok(found)
}

/// The path and query without `target_session_attrs`, refusing values that would let the
/// ledger write to a standby.
fn without_session_attrs(tail: &str) -> anyhow::Result<String> {
    let Some((path, query)) = tail.split_once('?') else {
        return Ok(tail.to_owned());
    };
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("target_session_attrs", "read-write" | "primary")) => {}
            Some(("target_session_attrs", other)) => bail!(
                "target_session_attrs={other} in DATABASE_URL: the ledger writes, only read-write or primary is accepted"
            ),
            Some((PATRONI_PARAM, _)) => {}
            _ => kept.push(pair),
        }
    }
    Ok(if kept.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", kept.join("&"))
    })
}
