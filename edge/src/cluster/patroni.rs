//! A PostgreSQL member's Patroni: which one it is (its `control`, else the URL's `patroni`),
//! its `GET /patroni` answer read over plain HTTP, and what that answer says of the member's
//! role, state, synchrony and lag.

use std::time::SystemTime;

use cells::MemberSpec;
use chrono::{DateTime, Utc};
use schema::failover::{PatroniUrl, Servers};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::views::MemberView;
use super::MEMBER_TIMEOUT;

/// A PostgreSQL member's Patroni: its `control`, else the URL's `patroni` for its host.
pub(super) fn patroni_of(m: &MemberSpec, servers: Option<&Servers>) -> Option<PatroniUrl> {
    if let Some(control) = &m.control {
        return PatroniUrl::parse(control).ok();
    }
    let servers = servers?;
    let list = servers.patroni.as_ref()?;
    (0..servers.options.len())
        .find(|i| servers.host(*i) == m.address)
        .map(|i| list[i].clone())
}

/// Whether Patroni's `GET /patroni` answer is a running primary's.
pub(super) fn is_primary(v: &Value) -> bool {
    matches!(v["role"].as_str(), Some("master" | "primary"))
}

/// Fills `view` from its Patroni's answer `v`, with the leader's answer for the lag.
pub(super) fn patroni_view(
    view: &mut MemberView,
    v: &Value,
    leader: Option<&Value>,
    now: SystemTime,
) {
    view.state = v["state"].as_str().map(str::to_owned);
    if is_primary(v) {
        view.role = "leader".into();
        return;
    }
    view.role = match v["role"].as_str() {
        Some("replica" | "standby_leader") => "standby",
        Some("uninitialized") | None => "down",
        Some(_) => "standby",
    }
    .into();
    if view.state.as_deref() != Some("running") {
        view.error = view.state.clone().map(|s| format!("PostgreSQL is {s}"));
    }
    view.sync = Some(v["sync_standby"].as_bool().unwrap_or(false));
    if let Some(leader) = leader {
        // A standby the leader names as synchronous in its replication rows.
        let named_sync = leader["replication"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| {
                r["application_name"].as_str() == Some(view.name.as_str())
                    && matches!(r["sync_state"].as_str(), Some("sync" | "quorum"))
            });
        if named_sync {
            view.sync = Some(true);
        }
        let at = leader["xlog"]["location"].as_i64();
        let got = v["xlog"]["received_location"]
            .as_i64()
            .or_else(|| v["xlog"]["replayed_location"].as_i64());
        if let (Some(at), Some(got)) = (at, got) {
            let behind = (at - got).max(0);
            view.lag_bytes = Some(behind);
            let replayed = v["xlog"]["replayed_location"].as_i64().unwrap_or(got);
            view.lag_seconds = Some(if replayed >= at {
                0.0
            } else {
                v["xlog"]["replayed_timestamp"]
                    .as_str()
                    .and_then(parse_patroni_time)
                    .map_or(0.0, |t| {
                        now.duration_since(t).unwrap_or_default().as_secs_f64()
                    })
            });
        }
    }
}

/// Patroni's timestamps: `2024-05-01 10:00:00.123456+00:00` (PostgreSQL's text form).
pub(super) fn parse_patroni_time(text: &str) -> Option<SystemTime> {
    let parsed = DateTime::parse_from_rfc3339(text)
        .or_else(|_| DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f%:z"))
        .or_else(|_| DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f%#z"))
        .ok()?;
    Some(SystemTime::from(parsed.with_timezone(&Utc)))
}

/// `GET /patroni` of `url` as JSON, within [`MEMBER_TIMEOUT`]: HTTP/1.0 on a fresh connection,
/// read to its end (Patroni answers and closes).
pub(super) async fn get_patroni(url: &PatroniUrl) -> Result<Value, String> {
    let asked = async {
        let mut stream = tokio::net::TcpStream::connect((url.host.as_str(), url.port))
            .await
            .map_err(|e| format!("Patroni at {}:{}: {e}", url.host, url.port))?;
        let request = format!(
            "GET /patroni HTTP/1.0\r\nHost: {}:{}\r\nUser-Agent: ledger\r\nAccept: application/json\r\n\r\n",
            url.host, url.port
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut answer = Vec::with_capacity(2048);
        (&mut stream)
            .take(256 * 1024)
            .read_to_end(&mut answer)
            .await
            .map_err(|e| e.to_string())?;
        parse_http_json(&answer)
    };
    tokio::time::timeout(MEMBER_TIMEOUT, asked)
        .await
        .map_err(|_| {
            format!(
                "Patroni at {}:{} did not answer in time",
                url.host, url.port
            )
        })?
}

/// The JSON body of an HTTP answer (any status: Patroni answers `/patroni` with 503 on a node
/// whose PostgreSQL is not running, with the same body).
pub(super) fn parse_http_json(answer: &[u8]) -> Result<Value, String> {
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("an HTTP answer without a body")?;
    serde_json::from_slice(&answer[split + 4..]).map_err(|e| format!("Patroni's answer: {e}"))
}
