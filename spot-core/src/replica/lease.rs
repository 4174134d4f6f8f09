//! spot-core's leadership: a key with a lease in etcd (docs/adr/0020-high-availability.md §3),
//! through etcd's JSON gateway (`/v3/...`, etcd 3.4). etcd decides who leads; this file only asks.
//!
//! A replica campaigns by putting the cell's leader key with its lease *only if the key does not
//! exist* (`create_revision == 0`). The winner's epoch is the key's `create_revision`: etcd's
//! revisions only grow, so each leadership's epoch is larger than every earlier one's. The lease
//! is kept alive while the replica leads; when it ends (the leader died, or cannot reach a quorum
//! of etcd), etcd deletes the key and another replica may win.

use std::time::Duration;

use anyhow::{bail, Context};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// What the leader key holds: who leads and where to reach it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderInfo {
    /// The replica's name (`--replica`).
    pub name: String,
    /// Its client address (what the ledger connects to).
    pub client: String,
    /// Its replication address.
    pub repl: String,
}

/// The current leader: its record and its epoch (the key's create revision).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    pub info: LeaderInfo,
    pub epoch: u64,
}

/// A client of the etcd cluster's JSON gateway, trying each endpoint in turn.
#[derive(Debug, Clone)]
pub struct Etcd {
    endpoints: Vec<String>,
    http: reqwest::Client,
    key: String,
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// etcd's JSON renders int64 as strings; absent means 0.
fn int(v: &serde_json::Value) -> u64 {
    match v {
        serde_json::Value::String(s) => s.parse().unwrap_or(0),
        serde_json::Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

impl Etcd {
    /// `endpoints`: `host:port` or `http://host:port`, comma-separated; `cell`: the key prefix's
    /// cell (0 without a cell map).
    pub fn new(endpoints: &str, cell: u16) -> anyhow::Result<Etcd> {
        let endpoints: Vec<String> = endpoints
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                if s.starts_with("http") {
                    s.to_owned()
                } else {
                    format!("http://{s}")
                }
            })
            .collect();
        anyhow::ensure!(!endpoints.is_empty(), "--etcd names no endpoint");
        Ok(Etcd {
            endpoints,
            http: reqwest::Client::builder()
                .timeout(Duration::from_millis(900))
                .build()?,
            key: format!("/ledger/cell{cell}/spot/leader"),
        })
    }

    /// The same endpoints and key with an HTTP client of its own: for a runtime other than the
    /// one this client was made on (a client's connections belong to the runtime that made
    /// them).
    pub fn fresh(&self) -> anyhow::Result<Etcd> {
        Ok(Etcd {
            endpoints: self.endpoints.clone(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_millis(900))
                .build()?,
            key: self.key.clone(),
        })
    }

    /// POSTs `body` to `path` on the first endpoint that answers.
    async fn post(&self, path: &str, body: serde_json::Value) -> anyhow::Result<serde_json::Value> {
        let mut last = None;
        for url in &self.endpoints {
            match self
                .http
                .post(format!("{url}{path}"))
                .json(&body)
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => return Ok(r.json().await?),
                Ok(r) => last = Some(anyhow::anyhow!("{url}{path}: {}", r.status())),
                Err(e) => last = Some(anyhow::anyhow!("{url}{path}: {e}")),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no etcd endpoint")))
    }

    /// Who leads now, if anyone.
    pub async fn leader(&self) -> anyhow::Result<Option<Leadership>> {
        let answer = self
            .post("/v3/kv/range", json!({ "key": b64(&self.key) }))
            .await?;
        let Some(kv) = answer["kvs"].as_array().and_then(|k| k.first()) else {
            return Ok(None);
        };
        let value = base64::engine::general_purpose::STANDARD
            .decode(kv["value"].as_str().unwrap_or_default())
            .context("the leader key's value is not base64")?;
        Ok(Some(Leadership {
            info: serde_json::from_slice(&value).context("the leader key's value")?,
            epoch: int(&kv["create_revision"]),
        }))
    }

    /// The key that says the cell's spot-core has had a leader: written before the first one
    /// serves, never deleted. A replica that starts with no data in a cell that has it lost its
    /// disk (ADR 0020 §3).
    fn initialized_key(&self) -> String {
        self.key.replace("/leader", "/initialized")
    }

    /// Whether the cell's spot-core has had a leader.
    pub async fn initialized(&self) -> anyhow::Result<bool> {
        let answer = self
            .post(
                "/v3/kv/range",
                json!({ "key": b64(&self.initialized_key()) }),
            )
            .await?;
        Ok(answer["kvs"].as_array().is_some_and(|k| !k.is_empty()))
    }

    /// Records that the cell's spot-core has a leader.
    pub async fn mark_initialized(&self) -> anyhow::Result<()> {
        self.post(
            "/v3/kv/put",
            json!({ "key": b64(&self.initialized_key()), "value": b64("1") }),
        )
        .await?;
        Ok(())
    }

    /// The epoch a blank replica promises before it answers anything: the current leader's, or
    /// etcd's revision now when none leads (every later leader's epoch is higher). A deposed
    /// leader's older frames are then refused (ADR 0020 §3).
    pub async fn fence_epoch(&self) -> anyhow::Result<u64> {
        let answer = self
            .post("/v3/kv/range", json!({ "key": b64(&self.key) }))
            .await?;
        if let Some(kv) = answer["kvs"].as_array().and_then(|k| k.first()) {
            return Ok(int(&kv["create_revision"]));
        }
        Ok(int(&answer["header"]["revision"]))
    }

    /// A new lease of `ttl` seconds.
    pub async fn grant(&self, ttl: u64) -> anyhow::Result<i64> {
        let answer = self
            .post("/v3/lease/grant", json!({ "TTL": ttl.to_string() }))
            .await?;
        let id = int(&answer["ID"]);
        anyhow::ensure!(id != 0, "etcd granted no lease: {answer}");
        Ok(id as i64)
    }

    /// Puts the leader key with `lease` if nobody holds it; the epoch when this replica won.
    pub async fn campaign(&self, info: &LeaderInfo, lease: i64) -> anyhow::Result<Option<u64>> {
        let key = b64(&self.key);
        let value = b64(&serde_json::to_string(info)?);
        let answer = self
            .post(
                "/v3/kv/txn",
                json!({
                    "compare": [{ "key": key, "target": "CREATE", "result": "EQUAL",
                                  "create_revision": "0" }],
                    "success": [{ "request_put": { "key": key, "value": value,
                                                   "lease": lease.to_string() } }],
                }),
            )
            .await?;
        if answer["succeeded"].as_bool() != Some(true) {
            return Ok(None);
        }
        // The put's revision is the transaction's: the header's.
        let epoch = int(&answer["header"]["revision"]);
        anyhow::ensure!(epoch > 0, "etcd answered no revision: {answer}");
        Ok(Some(epoch))
    }

    /// Renews `lease`; false when etcd says it is gone (expired or revoked).
    pub async fn keep_alive(&self, lease: i64) -> anyhow::Result<bool> {
        let answer = self
            .post("/v3/lease/keepalive", json!({ "ID": lease.to_string() }))
            .await?;
        Ok(int(&answer["result"]["TTL"]) > 0)
    }

    /// Ends `lease` now (the key goes with it): a leader stepping down.
    pub async fn revoke(&self, lease: i64) -> anyhow::Result<()> {
        match self
            .post("/v3/lease/revoke", json!({ "ID": lease.to_string() }))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("404") => Ok(()),
            Err(e) => bail!("revoking the lease: {e}"),
        }
    }
}
