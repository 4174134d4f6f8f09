//! The tamper-evident log (issue 36, `docs/adr/0016-tamper-evident-log.md`) on a real
//! PostgreSQL: history rewritten with SQL behind the ledger's back, each rewrite caught by
//! `ledger verify` naming the position (or, for a tail cut and re-signed with the real key, by
//! checkpoints saved earlier); an untouched log verifying across restarts; proofs served over
//! HTTP checked by an RFC 6962 verifier written here, apart from the product's code; a user
//! refused another user's positions.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use domain::AccountType::{Funding, Spot};
use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use tlog_follower::{Follower, FollowerConfig};

use crate::helpers::{bin, ApiStack, Stack};
use crate::procs::LedgerProcess;

type Hash = [u8; 32];

pub(crate) const ORIGIN: &str = "test.ledger/log";

pub(crate) fn signer() -> ::tlog::Signer {
    ::tlog::Signer::from_seed(ORIGIN, [42; 32]).expect("a valid key name")
}

/// The signing key in a file, as `LEDGER_LOG_SIGNING_KEY_FILE` names it.
pub(crate) fn key_file(dir: &Path) -> PathBuf {
    let path = dir.join("log.key");
    std::fs::write(&path, format!("{}\n", signer().to_skey())).expect("write the key");
    path
}

/// A follower that signs a checkpoint at every pass that adds an entry.
pub(crate) fn follower(pool: &PgPool) -> Follower {
    Follower::new(
        pool.clone(),
        FollowerConfig {
            signer: signer(),
            checkpoint_events: 1,
            checkpoint_interval: Duration::from_secs(3600),
        },
    )
}

/// Passes until the tree holds every event committed before the call (other tests' open
/// transactions may hold the commit watermark back for a while); its size.
pub(crate) async fn follow(pool: &PgPool) -> u64 {
    follow_with(&follower(pool), pool).await
}

/// [`follow`] with a given follower.
pub(crate) async fn follow_with(f: &Follower, pool: &PgPool) -> u64 {
    let head: i64 = sqlx::query_scalar("SELECT position FROM feed_head")
        .fetch_one(pool)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pass = f.pass().await.expect("follower pass");
        if pass.size >= head as u64 {
            return pass.size;
        }
        assert!(
            Instant::now() < deadline,
            "the tree stayed at {} of {head}",
            pass.size
        );
        if pass.added == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// `rounds` transfers FUNDING → SPOT for each user (and their deposits).
pub(crate) async fn history(s: &Stack, users: &[u64], rounds: usize) {
    for &user in users {
        s.deposit(user, "USDT", "1000").await;
        for _ in 0..rounds {
            s.transfer(user, Funding, Spot, "USDT", "1").await;
        }
    }
}

/// Runs `ledger <args>` against `db`, signing key `key`; (success, stdout and stderr).
pub(crate) fn ledger(args: &[&str], db: &str, key: &Path) -> (bool, String) {
    let out = Command::new(bin("ledger"))
        .args(args)
        .env("DATABASE_URL", db)
        .env("LEDGER_LOG_SIGNING_KEY_FILE", key)
        .output()
        .expect("run ledger");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

pub(crate) async fn exec(pool: &PgPool, sql: &str) {
    sqlx::query(sql).execute(pool).await.expect(sql);
}

// ---- An RFC 6962 verifier of the test's own, following the RFC's recursive definitions. ----

fn sha(parts: &[&[u8]]) -> Hash {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

fn leaf_hash(leaf: &[u8]) -> Hash {
    sha(&[&[0], leaf])
}

fn node(l: &Hash, r: &Hash) -> Hash {
    sha(&[&[1], l, r])
}

fn split(n: u64) -> u64 {
    let mut k = 1;
    while k * 2 < n {
        k *= 2;
    }
    k
}

/// MTH over the leaves themselves.
fn mth(leaves: &[Hash]) -> Hash {
    match leaves.len() {
        0 => sha(&[]),
        1 => leaves[0],
        n => {
            let k = split(n as u64) as usize;
            node(&mth(&leaves[..k]), &mth(&leaves[k..]))
        }
    }
}

/// The root an audit path of leaf `m` in a tree of `n` leads to (PATH's last hash is the top
/// split's); `None` if the path has the wrong length.
fn inclusion_root(m: u64, n: u64, leaf: Hash, path: &mut Vec<Hash>) -> Option<Hash> {
    if n == 1 {
        return Some(leaf);
    }
    let k = split(n);
    let top = path.pop()?;
    if m < k {
        Some(node(&inclusion_root(m, k, leaf, path)?, &top))
    } else {
        Some(node(&top, &inclusion_root(m - k, n - k, leaf, path)?))
    }
}

fn verify_inclusion(m: u64, n: u64, leaf: Hash, path: &[Hash], root: &Hash) -> bool {
    let mut path = path.to_vec();
    inclusion_root(m, n, leaf, &mut path).as_ref() == Some(root) && path.is_empty()
}

/// The (old, new) roots a SUBPROOF(m, D[n], whole) leads to.
fn consistency_roots(
    m: u64,
    n: u64,
    whole: bool,
    old: Hash,
    p: &mut Vec<Hash>,
) -> Option<(Hash, Hash)> {
    if m == n {
        let h = if whole { old } else { p.pop()? };
        return Some((h, h));
    }
    let k = split(n);
    let top = p.pop()?;
    if m <= k {
        let (o, new) = consistency_roots(m, k, whole, old, p)?;
        Some((o, node(&new, &top)))
    } else {
        let (o, new) = consistency_roots(m - k, n - k, false, old, p)?;
        Some((node(&top, &o), node(&top, &new)))
    }
}

fn verify_consistency(m: u64, n: u64, old: &Hash, new: &Hash, proof: &[Hash]) -> bool {
    let mut p = proof.to_vec();
    let roots = consistency_roots(m, n, true, *old, &mut p);
    roots == Some((*old, *new)) && p.is_empty()
}

fn hashes(value: &serde_json::Value) -> Vec<Hash> {
    value
        .as_array()
        .expect("an array of hashes")
        .iter()
        .map(|h| {
            let raw = STANDARD
                .decode(h.as_str().expect("base64"))
                .expect("base64");
            raw.try_into().expect("32 bytes")
        })
        .collect()
}

/// A checkpoint note's size and root, read by hand from its text.
fn size_and_root(note: &str) -> (u64, Hash) {
    let mut lines = note.lines();
    assert_eq!(lines.next(), Some(ORIGIN), "{note}");
    let size = lines.next().unwrap().parse().unwrap();
    let root = STANDARD.decode(lines.next().unwrap()).unwrap();
    (size, root.try_into().unwrap())
}

async fn positions_of(pool: &PgPool, user: i64) -> Vec<i64> {
    sqlx::query_scalar("SELECT feed_position FROM events WHERE user_id = $1 ORDER BY 1")
        .bind(user)
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn get_text(api: &ApiStack, path: &str, token: &str) -> (u16, Vec<u8>) {
    let resp = api
        .http
        .get(format!("{}{path}", api.base))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.bytes().await.unwrap().to_vec())
}

#[tokio::test]
async fn tlog_proofs_check_out_with_an_independent_verifier_and_users_see_only_their_own() {
    let api = ApiStack::start().await;
    let pool = api.stack.db.pool.clone();
    history(&api.stack, &[1, 2], 2).await;
    let first = follow(&pool).await;
    history(&api.stack, &[1, 2], 2).await;
    let size = follow(&pool).await;
    assert!(first > 0 && size > first, "{first} {size}");
    let (user1, user2, admin) = (api.token(1, false), api.token(2, false), api.token(9, true));

    let (status, note) = get_text(&api, "/api/v1/log/checkpoint", &user1).await;
    assert_eq!(status, 200);
    let note = String::from_utf8(note).unwrap();
    assert_eq!(size_and_root(&note).0, size);
    let (_, vkey) = get_text(&api, "/api/v1/log/key", &user2).await;
    let vkey = String::from_utf8(vkey).unwrap();
    assert_eq!(vkey.trim(), signer().verifier().to_vkey());
    ::tlog::Verifier::parse(&vkey)
        .unwrap()
        .open(&note)
        .expect("signed by the key served");
    let root = size_and_root(&note).1;

    // The root, recomputed here from every leaf the routes serve.
    let mut leaves = Vec::new();
    for p in 1..=size {
        let (status, bytes) = get_text(&api, &format!("/api/v1/log/entries/{p}"), &admin).await;
        assert_eq!(status, 200);
        let entry: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(entry["position"], json!(p.to_string()));
        // The entry says what the feed says, times to the microsecond included.
        let fed = projections::feed::read_after(&pool, p as i64 - 1, 1, None)
            .await
            .unwrap();
        let fed = projections::feed::event_json(&fed[0]);
        for field in ["event_id", "event_type", "aggregate_id", "occurred_at"] {
            assert_eq!(entry[field], fed[field], "{field} of {p}");
        }
        assert_eq!(entry["user_id"], json!(fed["user_id"].to_string()));
        let payload: serde_json::Value =
            serde_json::from_str(entry["payload"].as_str().unwrap()).unwrap();
        assert_eq!(payload, fed["payload"]);
        leaves.push(leaf_hash(&bytes));
    }
    assert_eq!(mth(&leaves), root, "the served leaves make the signed root");

    for p in positions_of(&pool, 1).await {
        let (status, bytes) = get_text(&api, &format!("/api/v1/log/entries/{p}"), &user1).await;
        assert_eq!(status, 200);
        let leaf = leaf_hash(&bytes);
        let path = format!("/api/v1/log/proof/inclusion?position={p}&size={size}");
        let (status, body) = api
            .call(reqwest::Method::GET, &path, Some(&user1), None)
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["leaf_hash"], json!(STANDARD.encode(leaf)));
        let proof = hashes(&body["hashes"]);
        let index = p as u64 - 1;
        assert!(
            verify_inclusion(index, size, leaf, &proof, &root),
            "position {p}"
        );
        for i in 0..proof.len() {
            let mut bad = proof.clone();
            bad[i][0] ^= 1;
            assert!(
                !verify_inclusion(index, size, leaf, &bad, &root),
                "flipped {p} {i}"
            );
        }
        // Another user: refused, for the entry and its proof; an admin may.
        let (status, body) = api
            .call(reqwest::Method::GET, &path, Some(&user2), None)
            .await;
        assert_eq!((status, body["code"].clone()), (403, json!("FORBIDDEN")));
        let (status, _) = get_text(&api, &format!("/api/v1/log/entries/{p}"), &user2).await;
        assert_eq!(status, 403);
        let (status, _) = api
            .call(reqwest::Method::GET, &path, Some(&admin), None)
            .await;
        assert_eq!(status, 200);
    }

    // A transfer's receipt names its events' positions, for its owner (and admins) only.
    let (req_id, owned): (String, Vec<i64>) = sqlx::query_as(
        "SELECT aggregate_id, array_agg(feed_position ORDER BY sequence) FROM events
         WHERE user_id = 1 AND aggregate_type = 'Transfer' GROUP BY aggregate_id LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let path = format!("/api/v1/log/receipts/{req_id}");
    let (status, body) = api
        .call(reqwest::Method::GET, &path, Some(&user1), None)
        .await;
    assert_eq!(status, 200, "{body}");
    let listed: Vec<i64> = body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["position"].as_i64().unwrap())
        .collect();
    assert_eq!(listed, owned);
    assert_eq!(body["tree_size"], json!(size));
    let (status, body) = api
        .call(reqwest::Method::GET, &path, Some(&user2), None)
        .await;
    assert_eq!((status, body["code"].clone()), (404, json!("NOT_FOUND")));

    // Any user may ask for consistency between two signed checkpoints.
    let first_note: String =
        sqlx::query_scalar("SELECT note FROM tlog_checkpoints WHERE size = $1")
            .bind(first as i64)
            .fetch_one(&pool)
            .await
            .unwrap();
    let old_root = size_and_root(&first_note).1;
    let path = format!("/api/v1/log/proof/consistency?from={first}&to={size}");
    let (status, body) = api
        .call(reqwest::Method::GET, &path, Some(&user2), None)
        .await;
    assert_eq!(status, 200, "{body}");
    let proof = hashes(&body["hashes"]);
    assert!(verify_consistency(first, size, &old_root, &root, &proof));
    let mut bad = proof.clone();
    bad[0][31] ^= 0x80;
    assert!(!verify_consistency(first, size, &old_root, &root, &bad));

    // Beyond the tree: NOT_FOUND; malformed: BAD_REQUEST.
    let beyond = format!("/api/v1/log/proof/consistency?from=1&to={}", size + 1);
    let (status, body) = api
        .call(reqwest::Method::GET, &beyond, Some(&user1), None)
        .await;
    assert_eq!((status, body["code"].clone()), (404, json!("NOT_FOUND")));
    let bad = "/api/v1/log/proof/inclusion?position=x&size=1";
    let (status, body) = api
        .call(reqwest::Method::GET, bad, Some(&user1), None)
        .await;
    assert_eq!((status, body["code"].clone()), (400, json!("BAD_REQUEST")));
}

/// A stack with history, the tree caught up, and the key in a file.
async fn followed_stack() -> (Stack, tempfile::TempDir, PathBuf, u64) {
    let s = Stack::start().await;
    history(&s, &[1, 2], 3).await;
    let size = follow(&s.db.pool).await;
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path());
    let (ok, out) = ledger(&["verify"], &s.db.url, &key);
    assert!(ok, "the untouched log verifies: {out}");
    (s, dir, key, size)
}

#[tokio::test]
async fn tlog_an_edited_payload_is_caught_at_its_position() {
    let (s, _dir, key, _) = followed_stack().await;
    // The second transfer's creation: its amount made larger.
    let position: i64 = sqlx::query_scalar(
        "SELECT feed_position FROM events WHERE event_type = 'TransferCreated'
         ORDER BY feed_position OFFSET 1 LIMIT 1",
    )
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    exec(
        &s.db.pool,
        &format!(
            "UPDATE events SET payload = regexp_replace(payload::text,
                 '\"amount\":\\s*\"[^\"]*\"', '\"amount\":\"999\"')::json
             WHERE feed_position = {position}"
        ),
    )
    .await;
    let changed: bool = sqlx::query_scalar(&format!(
        "SELECT payload::text LIKE '%\"999\"%' FROM events WHERE feed_position = {position}"
    ))
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    assert!(changed, "the edit took");
    let (ok, out) = ledger(&["verify"], &s.db.url, &key);
    assert!(!ok, "{out}");
    let expected = format!("VERIFY FAILED at position {position}: its entry differs");
    assert!(out.contains(&expected), "{out}");
}

/// The leaf's domain time is made in Rust from PostgreSQL's plain text of it; it must be, byte
/// for byte, what the database's `to_char` made before (every tree hashed so far holds those
/// bytes): six digits always, trailing zeros and a zero fraction included.
#[tokio::test]
async fn tlog_the_leaf_time_is_the_one_the_database_formatted_before() {
    let (s, _dir, _key, _) = followed_stack().await;
    let times = [
        "2026-11-27 05:38:43.123456+00",
        "2026-11-27 05:38:43.120000+00",
        "2026-11-27 05:38:43.000001+00",
        "2026-11-27 05:38:43+00",
        "2026-11-27 23:59:59.999999-05",
        "1999-12-31 23:00:00.5+02",
    ];
    for (i, at) in times.iter().enumerate() {
        let position = i as i64 + 1;
        exec(
            &s.db.pool,
            &format!("UPDATE events SET occurred_at = '{at}' WHERE feed_position = {position}"),
        )
        .await;
        let before: String = sqlx::query_scalar(
            "SELECT to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')
             FROM events WHERE feed_position = $1",
        )
        .bind(position)
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
        let entry = tlog_follower::entries::at(&s.db.pool, position)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(entry.occurred_at, before, "{at}");
    }
}

#[tokio::test]
async fn tlog_a_deleted_event_is_caught_at_its_position() {
    let (s, _dir, key, _) = followed_stack().await;
    exec(&s.db.pool, "DELETE FROM events WHERE feed_position = 4").await;
    let (ok, out) = ledger(&["verify"], &s.db.url, &key);
    assert!(!ok, "{out}");
    assert!(
        out.contains("VERIFY FAILED at position 4: missing from the log"),
        "{out}"
    );
}

#[tokio::test]
async fn tlog_two_swapped_events_are_caught_at_the_first() {
    let (s, _dir, key, _) = followed_stack().await;
    exec(
        &s.db.pool,
        "UPDATE events SET feed_position = -1 WHERE feed_position = 2",
    )
    .await;
    exec(
        &s.db.pool,
        "UPDATE events SET feed_position = 2 WHERE feed_position = 5",
    )
    .await;
    exec(
        &s.db.pool,
        "UPDATE events SET feed_position = 5 WHERE feed_position = -1",
    )
    .await;
    let (ok, out) = ledger(&["verify"], &s.db.url, &key);
    assert!(!ok, "{out}");
    assert!(
        out.contains("VERIFY FAILED at position 2: its entry differs"),
        "{out}"
    );
}

/// The tail cut, the tree rebuilt and re-signed with the real key, the log grown again: the
/// database alone is consistent again, but checkpoints saved outside it before the rewrite are
/// not.
#[tokio::test]
async fn tlog_a_cut_and_resigned_tail_is_caught_by_checkpoints_saved_earlier() {
    let (s, dir, key, size) = followed_stack().await;
    let saved = dir.path().join("checkpoints.jsonl");
    let saved_arg = saved.to_str().unwrap();
    let (ok, out) = ledger(&["log", "export-checkpoints", saved_arg], &s.db.url, &key);
    assert!(ok, "{out}");
    let cut = size / 2;
    exec(
        &s.db.pool,
        &format!("DELETE FROM events WHERE feed_position > {cut}"),
    )
    .await;
    exec(&s.db.pool, "DELETE FROM tlog_tiles").await;
    exec(&s.db.pool, "DELETE FROM tlog_checkpoints").await;
    exec(
        &s.db.pool,
        "UPDATE tlog_state SET size = 0, edge = ''::bytea",
    )
    .await;
    follow(&s.db.pool).await;
    // The cut took user 2's deposit's entry (after user 1's deposit and transfers), not its row:
    // the database alone names that deposit.
    let (ok, out) = ledger(&["verify"], &s.db.url, &key);
    assert!(!ok, "{out}");
    assert!(out.contains("VERIFY FAILED at deposit "), "{out}");
    assert!(out.contains("(user 2, 1000 USDT) has no entry"), "{out}");
    // An attacker who deletes the rows of the deposits cut too gets a database that agrees
    // with itself again (the conservation check, not the log, then sees the missing money).
    exec(
        &s.db.pool,
        "DELETE FROM external_deposits d WHERE NOT EXISTS (SELECT 1 FROM events e
             WHERE e.aggregate_type = 'Deposit' AND e.aggregate_id = d.external_id)",
    )
    .await;
    let (ok, out) = ledger(&["verify"], &s.db.url, &key);
    assert!(
        ok,
        "re-signed with the real key, the database alone agrees: {out}"
    );
    let (ok, out) = ledger(&["verify", "--checkpoints", saved_arg], &s.db.url, &key);
    assert!(!ok, "{out}");
    assert!(out.contains("VERIFY FAILED at checkpoint of size"), "{out}");
    assert!(out.contains("its tail was cut"), "{out}");

    // Grown back past the old size with other transfers: a fork, named by the first saved
    // checkpoint beyond the cut.
    history(&s, &[3], 4).await;
    let grown = follow(&s.db.pool).await;
    assert!(grown > size, "{grown} {size}");
    let (ok, out) = ledger(&["verify"], &s.db.url, &key);
    assert!(ok, "{out}");
    let (ok, out) = ledger(&["verify", "--checkpoints", saved_arg], &s.db.url, &key);
    assert!(!ok, "{out}");
    assert!(out.contains("VERIFY FAILED at checkpoint of size"), "{out}");
    assert!(out.contains("the log was rewritten"), "{out}");
}

/// A running follower refuses to re-sign a log cut or rewritten under it, even with every
/// stored checkpoint deleted: it remembers the last one it signed.
#[tokio::test]
async fn tlog_a_running_follower_never_signs_a_rewritten_log() {
    let s = Stack::start().await;
    let pool = s.db.pool.clone();
    history(&s, &[1], 4).await;
    let f = follower(&pool);
    let size = follow_with(&f, &pool).await;
    let checkpoints = "SELECT count(*) FROM tlog_checkpoints";
    let before: i64 = sqlx::query_scalar(checkpoints)
        .fetch_one(&pool)
        .await
        .unwrap();
    exec(
        &pool,
        &format!("DELETE FROM events WHERE feed_position > {}", size / 2),
    )
    .await;
    exec(&pool, "DELETE FROM tlog_tiles").await;
    exec(&pool, "DELETE FROM tlog_checkpoints").await;
    exec(&pool, "UPDATE tlog_state SET size = 0, edge = ''::bytea").await;
    let refused = f.pass().await.expect_err("a cut log is not re-signed");
    assert!(
        refused.to_string().contains("the log was rewritten"),
        "{refused}"
    );
    // Grown back past the old size with other events: still refused, as a fork once the
    // committed log passes the old size (a pass may run before the last events commit).
    history(&s, &[2], 4).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let refused = f.pass().await.expect_err("a forked log is not re-signed");
        let text = refused.to_string();
        assert!(text.contains("the log was rewritten"), "{text}");
        if text.contains("does not extend") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the log never grew past {size}: {text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let after: i64 = sqlx::query_scalar(checkpoints)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        before > 0 && after == 0,
        "nothing signed since: {before} {after}"
    );
}

/// The conservation check as the ledger runs it, over the stack's two account systems.
async fn conserved(s: &Stack) -> bool {
    adapters::pg::check_full(&s.funding, &s.spot_adapter)
        .await
        .expect("the conservation check runs")
        .ok
}

/// A deposit row inserted with SQL behind the ledger's back, without its balance. A deposit is
/// written with its entry of the log (ADR 0016), so `ledger verify` names the row that has none
/// by its external_id; the conservation check catches it too (deposits above the money held).
#[tokio::test]
async fn tlog_a_deposit_inserted_with_sql_is_caught_by_verify_and_the_conservation_check() {
    let (s, _dir, key, _) = followed_stack().await;
    assert!(conserved(&s).await);
    exec(
        &s.db.pool,
        "INSERT INTO external_deposits (external_id, user_id, asset, amount)
         VALUES ('forged-1', 1, 'USDT', 500)",
    )
    .await;
    let (ok, out) = ledger(&["verify"], &s.db.url, &key);
    assert!(!ok, "{out}");
    assert!(
        out.contains(
            "VERIFY FAILED at deposit forged-1: its external_deposits row (user 1, 500 USDT) \
             has no entry in the log"
        ),
        "{out}"
    );
    assert!(
        !conserved(&s).await,
        "the conservation check catches a deposit without its balance"
    );
}

/// A deposit row and its matching balance inserted with SQL: the conservation check's equation
/// still holds, so only the log can tell, and `ledger verify` names it. So are a real deposit's
/// row changed with its balance, and a row deleted. What the log cannot tell
/// (the ADR's limit): an entry appended at the log's end together with its row and balance.
#[tokio::test]
async fn tlog_a_deposit_inserted_with_sql_with_its_balance_is_caught_by_verify_naming_it() {
    let (s, _dir, key, _) = followed_stack().await;
    let pool = &s.db.pool;
    let credit = |amount: &'static str| {
        format!(
            "UPDATE funding_accounts SET balance = balance + {amount}
             WHERE user_id = 1 AND asset = 'USDT'"
        )
    };
    exec(
        pool,
        "INSERT INTO external_deposits (external_id, user_id, asset, amount)
         VALUES ('forged-2', 1, 'USDT', 500)",
    )
    .await;
    exec(pool, &credit("500")).await;
    assert!(
        conserved(&s).await,
        "with its balance, the conservation check cannot see it"
    );
    let (ok, out) = ledger(&["verify"], &s.db.url, &key);
    assert!(!ok, "{out}");
    assert!(
        out.contains(
            "VERIFY FAILED at deposit forged-2: its external_deposits row (user 1, 500 USDT) \
             has no entry in the log: money credited behind the ledger's back"
        ),
        "{out}"
    );
    exec(
        pool,
        "DELETE FROM external_deposits WHERE external_id = 'forged-2'",
    )
    .await;
    exec(pool, &credit("-500")).await;
    let (ok, out) = ledger(&["verify"], &s.db.url, &key);
    assert!(ok, "{out}");
    assert!(out.contains("deposits held to their entries: 2;"), "{out}");

    // A real deposit's amount raised with its balance: named by its entry's position.
    let (position, external_id): (i64, String) = sqlx::query_as(
        "SELECT feed_position, aggregate_id FROM events
         WHERE aggregate_type = 'Deposit' AND user_id = 1",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    exec(
        pool,
        &format!("UPDATE external_deposits SET amount = 1200 WHERE external_id = '{external_id}'"),
    )
    .await;
    exec(pool, &credit("200")).await;
    assert!(conserved(&s).await);
    let (ok, out) = ledger(&["verify"], &s.db.url, &key);
    assert!(!ok, "{out}");
    let expected = format!(
        "VERIFY FAILED at position {position} (deposit {external_id}): the entry says user 1, \
         1000 USDT (external_id {external_id}) but its external_deposits row says user 1, 1200 USDT"
    );
    assert!(out.contains(&expected), "{out}");

    // Put back, then the row deleted (some of its money is in SPOT now, out of SQL's reach):
    // the entry is left without its row.
    exec(
        pool,
        &format!("UPDATE external_deposits SET amount = 1000 WHERE external_id = '{external_id}'"),
    )
    .await;
    exec(pool, &credit("-200")).await;
    assert!(conserved(&s).await);
    let (ok, out) = ledger(&["verify"], &s.db.url, &key);
    assert!(ok, "{out}");
    exec(
        pool,
        &format!("DELETE FROM external_deposits WHERE external_id = '{external_id}'"),
    )
    .await;
    let (ok, out) = ledger(&["verify"], &s.db.url, &key);
    assert!(!ok, "{out}");
    let expected = format!(
        "VERIFY FAILED at position {position} (deposit {external_id}): an ExternalDeposited \
         entry without its external_deposits row"
    );
    assert!(out.contains(&expected), "{out}");
    exec(
        pool,
        &format!(
            "INSERT INTO external_deposits (external_id, user_id, asset, amount)
             VALUES ('{external_id}', 1, 'USDT', 1000)"
        ),
    )
    .await;

    // The limit: a forged deposit appended as the ledger appends one, row, balance and entry at
    // the log's end, verifies. The log proves history was not rewritten, not that every append
    // was authorised.
    exec(
        pool,
        "INSERT INTO external_deposits (external_id, user_id, asset, amount)
         VALUES ('forged-3', 1, 'USDT', 70)",
    )
    .await;
    exec(pool, &credit("70")).await;
    exec(pool, "SELECT deposit_entries_append(ARRAY['forged-3'])").await;
    follow(pool).await;
    assert!(conserved(&s).await);
    let (ok, out) = ledger(&["verify"], &s.db.url, &key);
    assert!(ok, "{out}");
    assert!(out.contains("deposits held to their entries: 3;"), "{out}");
}

/// Waits until a checkpoint covers every event.
pub(crate) async fn wait_checkpointed(pool: &PgPool) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (head, checkpointed): (i64, Option<i64>) = sqlx::query_as(
            "SELECT (SELECT position FROM feed_head), (SELECT max(size) FROM tlog_checkpoints)",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if head > 0 && checkpointed == Some(head) {
            return head as u64;
        }
        assert!(
            Instant::now() < deadline,
            "the log stayed at {checkpointed:?} of {head}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `ledger serve` keeps the log (the key from `LEDGER_LOG_SIGNING_KEY_FILE`); stopped, killed
/// and started again it goes on from where it was, and the whole log verifies.
#[tokio::test]
async fn tlog_an_untouched_log_verifies_across_restarts() {
    let s = Stack::start().await;
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path());
    let key_text = key.to_str().unwrap().to_owned();
    let env = [
        ("LEDGER_LOG_SIGNING_KEY_FILE", key_text.as_str()),
        ("LEDGER_LOG_CHECKPOINT_EVENTS", "3"),
        ("LEDGER_LOG_CHECKPOINT_MS", "100"),
    ];
    let body = json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "1"});
    s.deposit(1, "USDT", "1000").await;
    let mut sizes = Vec::new();
    for stop in ["terminate", "kill", "none"] {
        let mut process = LedgerProcess::start(&s.db.url, &s.spot, &env);
        for _ in 0..3 {
            let answer = process.transfer(1, body.clone()).await;
            assert_eq!(answer["state"], "COMMITTED", "{answer}");
        }
        sizes.push(wait_checkpointed(&s.db.pool).await);
        match stop {
            "terminate" => {
                process.terminate();
                process.wait_exit(Duration::from_secs(15));
            }
            "kill" => process.kill(),
            _ => {}
        }
    }
    assert!(sizes.windows(2).all(|w| w[0] < w[1]), "{sizes:?}");
    let (ok, out) = ledger(&["verify"], &s.db.url, &key);
    assert!(ok, "{out}");
    assert!(out.contains("the log verifies"), "{out}");
}

/// The chaos run's end check of the log (`tests::chaos::log::log_problems`, which runs
/// `ledger verify`), run here on a small log instead of a chaos run: nothing to report on an
/// untouched log whose tree caught up; an edited entry is named by its position.
#[tokio::test]
async fn tlog_the_chaos_end_check_runs_ledger_verify() {
    let (s, _dir, key, size) = followed_stack().await;
    let bin_dir = bin("ledger").parent().unwrap().to_path_buf();
    let check = || tests::chaos::log::log_problems(&s.db.pool, &bin_dir, &s.db.url, &key, None);
    let problems = check().await.unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    exec(
        &s.db.pool,
        "UPDATE events SET occurred_at = occurred_at + interval '1 second'
         WHERE feed_position = 3",
    )
    .await;
    let problems = check().await.unwrap();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("VERIFY FAILED at position 3: its entry differs"),
        "{problems:?}"
    );
    assert!(size >= 3);
}

/// `/metrics` until the line starting with `prefix` has a value `wanted` accepts: that value.
async fn metric_value(ledger: &LedgerProcess, prefix: &str, wanted: impl Fn(f64) -> bool) -> f64 {
    let value = |text: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let text = ledger
        .metrics_until(Duration::from_secs(30), |text| {
            value(text).is_some_and(&wanted)
        })
        .await;
    value(&text).expect("the value just seen")
}

/// The log's metrics (`LedgerLogStalled`'s figures): none for a log never kept; the tree's size
/// and no lag while a follower keeps it; a lag in positions and seconds once transfers go on
/// with no follower running.
#[tokio::test]
async fn tlog_metrics_report_the_tree_and_a_follower_that_stopped() {
    let s = Stack::start().await;
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path());
    let key_text = key.to_str().unwrap().to_owned();
    let body = json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "1"});
    s.deposit(1, "USDT", "1000").await;

    let plain = LedgerProcess::start(&s.db.url, &s.spot, &[]);
    let answer = plain.transfer(1, body.clone()).await;
    assert_eq!(answer["state"], "COMMITTED", "{answer}");
    metric_value(&plain, "ledger_projector_lag_positions ", |_| true).await;
    let text = reqwest::get(&plain.metrics).await.unwrap().text().await;
    let text = text.unwrap();
    assert!(
        !text.contains("ledger_log_"),
        "no log kept, no series:\n{text}"
    );
    drop(plain);

    let kept = LedgerProcess::start(
        &s.db.url,
        &s.spot,
        &[("LEDGER_LOG_SIGNING_KEY_FILE", key_text.as_str())],
    );
    let answer = kept.transfer(1, body.clone()).await;
    assert_eq!(answer["state"], "COMMITTED", "{answer}");
    let head = wait_checkpointed(&s.db.pool).await as f64;
    // The follower hashes on a thread of its own at a lower priority than the request path's
    // (ledger/src/startup.rs, FOLLOWER_NICE), and the process's other threads keep theirs.
    assert_eq!(
        thread_nices(kept.pid()),
        vec![("tlog-follower".to_owned(), 10)],
        "the follower's thread and its nice value, then any other thread not at 0"
    );
    let size = metric_value(&kept, "ledger_log_tree_size ", |v| v == head).await;
    assert_eq!(
        metric_value(&kept, "ledger_log_lag_positions ", |v| v == 0.0).await,
        0.0
    );
    assert_eq!(
        metric_value(&kept, "ledger_log_lag_seconds ", |v| v == 0.0).await,
        0.0
    );
    drop(kept);

    // No follower: money still moves, the tree stays, and the lag says so.
    let plain = LedgerProcess::start(&s.db.url, &s.spot, &[]);
    let answer = plain.transfer(1, body).await;
    assert_eq!(answer["state"], "COMMITTED", "{answer}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        metric_value(&plain, "ledger_log_tree_size ", |_| true).await,
        size
    );
    let behind = metric_value(&plain, "ledger_log_lag_positions ", |v| v >= 3.0).await;
    let (now_head,): (i64,) = sqlx::query_as("SELECT position FROM feed_head")
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    assert_eq!(
        behind,
        now_head as f64 - size,
        "the feed's entries not in the tree"
    );
    let seconds = metric_value(&plain, "ledger_log_lag_seconds ", |v| v >= 1.0).await;
    assert!(seconds < 60.0, "{seconds}");
}

/// The threads of process `pid` named `tlog-follower` or whose nice value is not 0, with their
/// nice values (`/proc/<pid>/task/<tid>/stat`, the 19th field).
fn thread_nices(pid: u32) -> Vec<(String, i64)> {
    let mut found = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let Ok(comm) = std::fs::read_to_string(task.path().join("comm")) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // The fields after the command's closing parenthesis: state is field 3, nice field 19.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let nice: i64 = after.split_whitespace().nth(16).unwrap().parse().unwrap();
        let comm = comm.trim().to_owned();
        if comm == "tlog-follower" || nice != 0 {
            found.push((comm, nice));
        }
    }
    found.sort();
    found
}
