//! The idempotency horizon with real processes (and its faults): `ledger serve` advances
//! spot-core's horizon while transfers run and spot-core's remembered keys stop growing; a transfer stuck open longer than the retention holds the horizon back and
//! still commits; a req_id just older than the horizon is refused for good (nothing applied, not
//! even after a restart), and read as an unknown outcome by the adapter, never as a refusal or
//! "not seen"; horizon requests repeated and out of order change nothing; an orphan client-key
//! claim too old for the horizon is re-keyed; a failover repair of a req_id past the horizon is
//! refused for good (409), not answered as unavailable. Each ends with the exact conservation
//! check.

use std::time::{Duration, Instant};

use adapters::SpotAdapter;
use application::horizon::ulid_time_ms;
use domain::AccountType::{Funding, Spot};
use domain::{
    AdapterOutcome, Amount, AssetSymbol, Movement, Operation, Recorded, ReqId, TransferState,
    UserId,
};
use serde_json::json;
use spot_core::protocol::{CoreStatus, RefusalCode, Request, Response};

use crate::helpers::{dec, token, Stack};
use crate::procs::{all_req_ids, spot_ops, wait_terminal, LedgerProcess};

/// The horizon's settings for these tests: a one-second retention, advanced five times a second.
const FAST_HORIZON: [(&str, &str); 2] = [
    ("LEDGER_IDEMPOTENCY_RETENTION_SECS", "1"),
    ("LEDGER_HORIZON_INTERVAL_MS", "200"),
];

fn now_ms() -> u64 {
    application::horizon::now_ms()
}

async fn status(spot: &SpotAdapter) -> CoreStatus {
    spot.core_status().await.expect("spot-core status")
}

/// Waits until `cond` holds for spot-core's status, and returns that status.
async fn wait_status(
    spot: &SpotAdapter,
    what: &str,
    within: Duration,
    cond: impl Fn(&CoreStatus) -> bool,
) -> CoreStatus {
    let deadline = Instant::now() + within;
    loop {
        let st = status(spot).await;
        if cond(&st) {
            return st;
        }
        assert!(Instant::now() < deadline, "{what} never held: {st:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// POSTs one transfer to a `ledger serve`, returns its answer.
async fn post_transfer(base: &str, user: u64, body: serde_json::Value) -> serde_json::Value {
    reqwest::Client::new()
        .post(format!("{base}/api/v1/internal_transfer"))
        .bearer_auth(token(user, false))
        .json(&body)
        .send()
        .await
        .expect("POST transfer")
        .json()
        .await
        .expect("JSON answer")
}

/// The exact conservation check through the admin route of a running ledger.
async fn assert_invariant_route(base: &str) {
    let report: serde_json::Value = reqwest::Client::new()
        .get(format!("{base}/api/v1/admin/invariant"))
        .bearer_auth(token(1, true))
        .send()
        .await
        .expect("GET invariant")
        .json()
        .await
        .expect("JSON report");
    assert_eq!(report["ok"], true, "fund conservation: {report:#}");
}

/// A movement of `user`'s USDT under `req_id`.
fn movement(req_id: ReqId, user: u64, amount: &str) -> Movement {
    Movement {
        req_id,
        user_id: UserId::new(user).unwrap(),
        asset: AssetSymbol::parse("USDT").unwrap(),
        amount: Amount::parse(amount).unwrap(),
    }
}

/// A req_id whose ULID time is `ms`.
fn req_id_at(ms: u64) -> ReqId {
    ReqId::parse(&ulid::Ulid::from_parts(ms, rand::random::<u128>()).to_string()).unwrap()
}

/// Two `ledger serve` processes, both advancing the horizon, while transfers run through both in
/// rounds: after each round spot-core forgets every key (the transfers are all terminal and
/// older than the retention), so what it remembers is bounded by the traffic of one retention,
/// however many operations it has applied. `/metrics` reports the horizon.
#[tokio::test]
async fn the_horizon_advances_during_traffic_and_spot_core_stops_remembering_history() {
    let s = Stack::start().await;
    for user in [11, 12] {
        s.deposit(user, "USDT", "1000").await;
    }
    let a = LedgerProcess::start(&s.db.url, &s.spot, &FAST_HORIZON);
    let b = LedgerProcess::start(&s.db.url, &s.spot, &FAST_HORIZON);
    let spot = s.spot.adapter();
    let mut last_horizon = 0;
    let mut last_seq = 0;
    for round in 0..4 {
        let started = now_ms();
        for i in 0..20u64 {
            let (base, user) = if i % 2 == 0 {
                (&a.base, 11)
            } else {
                (&b.base, 12)
            };
            let (from, to) = if round % 2 == 0 {
                ("FUNDING", "SPOT")
            } else {
                ("SPOT", "FUNDING")
            };
            let answer = post_transfer(
                base,
                user,
                json!({"from": from, "to": to, "asset": "USDT", "amount": "3"}),
            )
            .await;
            assert_eq!(answer["state"], "COMMITTED", "{answer}");
        }
        let during = status(&spot).await;
        assert!(
            during.remembered >= 1,
            "the round's keys are remembered: {during:?}"
        );
        // Once the round is a retention old, the horizon passes it and its keys are forgotten.
        let after = wait_status(
            &spot,
            "the round's keys forgotten",
            Duration::from_secs(15),
            |st| st.horizon_ms > started && st.remembered == 0,
        )
        .await;
        assert!(
            after.horizon_ms > last_horizon,
            "never backwards: {after:?}"
        );
        assert!(after.horizon_ms <= now_ms(), "{after:?}");
        assert!(
            after.last_seq >= last_seq + 20,
            "operations went on: {after:?}"
        );
        last_horizon = after.horizon_ms;
        last_seq = after.last_seq;
    }
    let metrics = reqwest::get(&a.metrics)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let gauge: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("ledger_idempotency_horizon_ms "))
        .unwrap_or_else(|| panic!("no horizon gauge in\n{metrics}"))
        .parse()
        .unwrap();
    assert!(
        gauge >= last_horizon && gauge <= now_ms(),
        "{gauge} vs {last_horizon}"
    );
    for user in [11, 12] {
        assert_eq!(
            s.funding_balance(user, "USDT").await + s.spot_balance(user, "USDT").await,
            dec("1000")
        );
    }
    assert_invariant_route(&a.base).await;
}

/// A transfer whose deposit's outcome is unknown (the ledger dies right after spot-core applied
/// it, before recording it) stays open for several retentions: the horizon waits for it while
/// other transfers pass, spot-core still remembers its deposit, and when the recovery worker gets
/// to it the deposit is found applied (not repeated, not expired) and the transfer commits. Then
/// the horizon moves past it, and a lookup of its req_id answers expired, which the adapter reads
/// as unavailable, never as "not seen".
#[tokio::test]
async fn a_transfer_stuck_open_past_the_retention_holds_the_horizon_and_still_commits() {
    let s = Stack::start().await;
    s.deposit(21, "USDT", "100").await;
    s.deposit(22, "USDT", "100").await;
    let spot = s.spot.adapter();

    let mut env = FAST_HORIZON.to_vec();
    env.push(("LEDGER_FAILPOINT", "target_after_call"));
    env.push(("LEDGER_ALLOW_FAILPOINTS", "1"));
    let mut crashing = LedgerProcess::start(&s.db.url, &s.spot, &env);
    // The request dies with the process; its transfer is in TARGET_PENDING, deposit applied.
    let _ = reqwest::Client::new()
        .post(format!("{}/api/v1/internal_transfer", crashing.base))
        .bearer_auth(token(21, false))
        .json(&json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "40"}))
        .send()
        .await;
    crashing.wait_exit(Duration::from_secs(10));
    let stuck = all_req_ids(&s).await.pop().expect("the stuck transfer");
    assert_eq!(
        crate::procs::state_of(&s, &stuck).await,
        TransferState::TargetPending
    );
    let stuck_ms = ulid_time_ms(&stuck.to_string()).unwrap();

    // A second process leaves it alone for 5 s (five retentions) while it advances the horizon
    // and serves other transfers.
    let mut env = FAST_HORIZON.to_vec();
    env.extend([
        ("LEDGER_RECOVERY_STALE_MS", "5000"),
        ("LEDGER_RECOVERY_INTERVAL_MS", "100"),
        ("LEDGER_RETRY_BACKOFF_MS_BASE", "50"),
        ("LEDGER_RETRY_BACKOFF_MS_MAX", "200"),
    ]);
    let serving = LedgerProcess::start(&s.db.url, &s.spot, &env);
    let mut others = 0;
    while now_ms() < stuck_ms + 3000 {
        let answer = post_transfer(
            &serving.base,
            22,
            json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "1"}),
        )
        .await;
        assert_eq!(answer["state"], "COMMITTED", "{answer}");
        others += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(others >= 5);
    assert_eq!(
        crate::procs::state_of(&s, &stuck).await,
        TransferState::TargetPending,
        "still open, three retentions old"
    );
    let held = status(&spot).await;
    assert!(
        held.horizon_ms > 0 && held.horizon_ms <= stuck_ms,
        "the horizon waits for the open transfer ({stuck_ms}): {held:?}"
    );
    // The operator is told which transfer holds it back.
    let log = serving.log();
    assert!(
        log.lines()
            .any(|l| l.contains("holds the idempotency horizon back")
                && l.contains(&stuck.to_string())),
        "{log}"
    );
    // Its deposit is still remembered, exactly once.
    assert_eq!(
        spot_ops(&s, &stuck).await,
        vec![("DEPOSIT".to_owned(), "APPLIED".to_owned())]
    );

    let t = wait_terminal(&s, &stuck, Duration::from_secs(30)).await;
    assert_eq!(t.state, TransferState::Committed);
    assert_eq!(
        s.spot_balance(21, "USDT").await,
        dec("40"),
        "deposited once"
    );
    assert_eq!(s.funding_balance(21, "USDT").await, dec("60"));
    assert_invariant_route(&serving.base).await;

    // Terminal now: the horizon passes it, and its key is forgotten.
    wait_status(
        &spot,
        "the horizon past the committed transfer",
        Duration::from_secs(15),
        |st| st.horizon_ms > stuck_ms,
    )
    .await;
    let lookup = spot
        .client()
        .call(&Request::Lookup {
            req_id: stuck.to_string(),
        })
        .await
        .unwrap();
    assert!(
        matches!(
            lookup,
            Response::Refused {
                code: RefusalCode::ReqIdExpired,
                ..
            }
        ),
        "{lookup:?}"
    );
    let m = movement(stuck, 21, "40");
    assert!(matches!(
        spot_port(&spot).lookup(&m, Operation::Deposit).await,
        Recorded::Unavailable(reason) if reason.contains("REQ_ID_EXPIRED")
    ));
}

/// A req_id one millisecond older than the horizon, retried straight at spot-core: refused
/// `REQ_ID_EXPIRED`, unrecorded, nothing applied, for every movement and cancel, and still so
/// after spot-core restarts (the horizon is in its WAL). The adapter reads it as unknown (a
/// movement), unavailable (cancel, lookup): never as a refusal that would let the ledger
/// compensate. One at the horizon itself is still accepted. Horizon requests repeated and out of
/// order change nothing.
#[tokio::test]
async fn a_req_id_just_older_than_the_horizon_is_refused_and_nothing_is_applied() {
    let mut s = Stack::start().await;
    s.deposit(31, "USDT", "100").await;
    let t = s.transfer(31, Funding, Spot, "USDT", "30").await;
    assert_eq!(t.state, TransferState::Committed);
    let spot = s.spot.adapter();

    let horizon = now_ms() - 1000;
    let advanced = spot.advance_horizon(horizon).await.unwrap();
    assert_eq!(advanced.horizon_ms, horizon);
    // Repeated, and an older one after it: nothing recorded, nothing moves back.
    let seq = advanced.last_seq;
    assert_eq!(spot.advance_horizon(horizon).await.unwrap().last_seq, seq);
    let older = spot.advance_horizon(horizon - 500).await.unwrap();
    assert_eq!((older.horizon_ms, older.last_seq), (horizon, seq));
    // A horizon in the future is refused.
    assert!(spot.advance_horizon(now_ms() + 60_000).await.is_err());
    assert_eq!(status(&spot).await.horizon_ms, horizon);

    let expired = req_id_at(horizon - 1);
    let balances_before = spot.balances(UserId::new(31).unwrap()).await.unwrap();
    for restart in [false, true] {
        if restart {
            s.spot.restart();
            assert_eq!(status(&spot).await.horizon_ms, horizon, "durable");
        }
        let seq_before = status(&spot).await.last_seq;
        for op in ["deposit", "withdraw", "refund"] {
            let request: Request = serde_json::from_value(json!({
                "op": op, "req_id": expired.to_string(), "user_id": 31,
                "asset": "USDT", "amount": "5"
            }))
            .unwrap();
            let answer = spot.client().call(&request).await.unwrap();
            assert!(
                matches!(
                    answer,
                    Response::Refused {
                        code: RefusalCode::ReqIdExpired,
                        seq: None,
                        ..
                    }
                ),
                "{op}: {answer:?}"
            );
        }
        let m = movement(expired, 31, "5");
        for outcome in [
            spot_port(&spot).deposit(&m).await,
            spot_port(&spot).withdraw(&m).await,
            spot_port(&spot).refund(&m).await,
        ] {
            assert!(
                matches!(&outcome, AdapterOutcome::Unknown(r) if r.contains("REQ_ID_EXPIRED")),
                "never a refusal: {outcome:?}"
            );
        }
        for op in [Operation::Deposit, Operation::Withdraw] {
            for recorded in [
                spot.cancel(&m, op).await,
                spot_port(&spot).lookup(&m, op).await,
            ] {
                assert!(
                    matches!(&recorded, Recorded::Unavailable(r) if r.contains("REQ_ID_EXPIRED")),
                    "never not-seen nor refused: {recorded:?}"
                );
            }
        }
        let after = status(&spot).await;
        assert_eq!(after.last_seq, seq_before, "nothing recorded");
        assert_eq!(
            spot.balances(UserId::new(31).unwrap()).await.unwrap(),
            balances_before,
            "nothing applied"
        );
    }
    // At the horizon itself: decided and remembered as usual (a cancel, so that no money moves
    // outside a transfer).
    let at = movement(req_id_at(horizon), 31, "5");
    let cancelled = Recorded::Refused {
        code: "CANCELLED".into(),
        message: RefusalCode::Cancelled.message().into(),
    };
    assert_eq!(spot.cancel(&at, Operation::Deposit).await, cancelled);
    assert_eq!(
        spot_port(&spot).lookup(&at, Operation::Deposit).await,
        cancelled
    );
    s.assert_invariant_exact().await;
    assert_eq!(s.spot_balance(31, "USDT").await, dec("30"));
}

/// A failover repair of a req_id older than spot-core's horizon can never read spot-core's
/// record of it, so no retry can succeed: 409 NOT_REPAIRABLE saying why, never 503 (which tells
/// the caller to retry), and nothing recorded. One at the horizon is looked up as ever.
#[tokio::test]
async fn a_repair_past_the_horizon_is_refused_for_good_not_unavailable() {
    let api = crate::helpers::ApiStack::start().await;
    let spot = api.stack.spot.adapter();
    let horizon = now_ms() - 1000;
    spot.advance_horizon(horizon).await.unwrap();
    let admin = api.token(1, true);
    let repair = |req_id: ReqId| {
        let path = format!("/api/v1/admin/repairs/{req_id}");
        let (api, admin) = (&api, admin.clone());
        async move {
            api.call(
                reqwest::Method::POST,
                &path,
                Some(&admin),
                Some(json!({"reason": "PG failover"})),
            )
            .await
        }
    };
    let (status, body) = repair(req_id_at(horizon - 1)).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["code"], "NOT_REPAIRABLE", "{body}");
    let said = body["message"].as_str().unwrap();
    assert!(said.contains("idempotency horizon"), "{said}");
    let (status, body) = repair(req_id_at(horizon)).await;
    assert_eq!(
        (status, &body["code"]),
        (409, &json!("NOTHING_TO_REPAIR")),
        "{body}"
    );
    let repairs: i64 = sqlx::query_scalar("SELECT count(*) FROM failover_repairs")
        .fetch_one(&api.stack.db.pool)
        .await
        .unwrap();
    assert_eq!(repairs, 0, "nothing recorded");
    api.stack.assert_invariant_exact().await;
}

fn spot_port(spot: &SpotAdapter) -> &dyn domain::AccountPort {
    spot
}

/// A client-key claim whose first request died before creating its transfer: while young it is
/// used as is; once older than half the retention it is re-keyed (a new req_id, in one
/// transaction with the check that no transfer exists under the old one), since spot-core may
/// refuse the old req_id as expired. Either way exactly one transfer, and a repeat answers it.
#[tokio::test]
async fn an_orphan_client_key_claim_too_old_for_the_horizon_is_rekeyed() {
    let s = Stack::start().await;
    s.deposit(41, "USDT", "100").await;
    let coordinator = s
        .another_coordinator()
        .with_idempotency_retention(Duration::from_secs(2));
    let request = |cid: &str| application::NewTransfer {
        user_id: UserId::new(41).unwrap(),
        from: Funding,
        to: Spot,
        asset: AssetSymbol::parse("USDT").unwrap(),
        amount: Amount::parse("5").unwrap(),
        cid: Some(cid.to_owned()),
    };
    let fingerprint = format!("{Funding}|{Spot}|USDT|{}", Amount::parse("5").unwrap());
    let orphan = |cid: &'static str, req_id: ReqId| {
        let pool = s.db.pool.clone();
        let fingerprint = fingerprint.clone();
        async move {
            sqlx::query(
                "INSERT INTO transfer_cids (user_id, cid, req_id, fingerprint) VALUES (41, $1, $2, $3)",
            )
            .bind(cid)
            .bind(req_id.to_string())
            .bind(fingerprint)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    let claimed = |cid: &'static str| {
        let pool = s.db.pool.clone();
        async move {
            let id: String = sqlx::query_scalar(
                "SELECT req_id FROM transfer_cids WHERE user_id = 41 AND cid = $1",
            )
            .bind(cid)
            .fetch_one(&pool)
            .await
            .unwrap();
            ReqId::parse(&id).unwrap()
        }
    };

    // Young: created under the claimed req_id.
    let young = req_id_at(now_ms() - 200);
    orphan("young", young).await;
    let t = coordinator.submit(request("young")).await.unwrap();
    assert_eq!((t.req_id, t.state), (young, TransferState::Committed));

    // Ten seconds old, five retentions: re-keyed.
    let old = req_id_at(now_ms() - 10_000);
    orphan("old", old).await;
    let t = coordinator.submit(request("old")).await.unwrap();
    assert_ne!(t.req_id, old);
    assert_eq!(t.state, TransferState::Committed);
    assert_eq!(claimed("old").await, t.req_id);
    assert!(coordinator.load(&old).await.unwrap().is_none());
    // A repeat answers the same transfer, through either entry point.
    let again = coordinator.submit(request("old")).await.unwrap();
    assert_eq!(again.req_id, t.req_id);
    // Between half a retention and the grace after it, the request waits, then re-keys.
    let middle = req_id_at(now_ms() - 1100);
    orphan("middle", middle).await;
    let t = coordinator.submit(request("middle")).await.unwrap();
    assert_ne!(t.req_id, middle);
    assert_eq!(claimed("middle").await, t.req_id);

    // Three transfers of 5, each once.
    assert_eq!(s.spot_balance(41, "USDT").await, dec("15"));
    assert_eq!(s.funding_balance(41, "USDT").await, dec("85"));
    s.assert_invariant_exact().await;
}

/// IDP with a delayed creation (the bug ADR 0010 recorded): request A claims a cid and its
/// `TransferCreated` commit stalls (here: the events table is locked, as a network stall past the
/// TCP user timeout would hold it) for longer than half the retention plus the grace. The client's
/// retry B finds the claim orphaned, re-keys it and creates under the new req_id. When the stall
/// ends, A's commit must be refused by the claim guard (migration 0020), and A answers with B's
/// transfer: one cid, one transfer, whatever order the two commits reach the log in.
#[tokio::test]
async fn idp_a_creation_delayed_past_a_rekey_of_its_claim_is_refused_not_doubled() {
    let s = Stack::start().await;
    s.deposit(42, "USDT", "100").await;
    // The separate steps (ADR 0022): only there is a claim durable before its creation.
    let coordinator = s
        .another_coordinator_apart()
        .with_idempotency_retention(Duration::from_secs(2));
    let request = application::NewTransfer {
        user_id: UserId::new(42).unwrap(),
        from: Funding,
        to: Spot,
        asset: AssetSymbol::parse("USDT").unwrap(),
        amount: Amount::parse("5").unwrap(),
        cid: Some("stalled".to_owned()),
    };
    let claimed = || {
        let pool = s.db.pool.clone();
        async move {
            let id: Option<String> = sqlx::query_scalar(
                "SELECT req_id FROM transfer_cids WHERE user_id = 42 AND cid = 'stalled'",
            )
            .fetch_optional(&pool)
            .await
            .unwrap();
            id.map(|id| ReqId::parse(&id).unwrap())
        }
    };

    // Every append waits while this transaction holds the table (reads go on).
    let mut stall = s.db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE events IN EXCLUSIVE MODE")
        .execute(&mut *stall)
        .await
        .unwrap();
    let a = tokio::spawn({
        let (c, r) = (coordinator.clone(), request.clone());
        async move { c.submit(r).await }
    });
    let first = loop {
        if let Some(id) = claimed().await {
            break id;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The retry comes after half the retention: it waits out the grace, then re-keys.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    // The retry reaches another ledger process (another coordinator): in this one it would wait
    // for the stalled request's round to end (`application/src/round.rs`, one round in flight).
    let retrying = s
        .another_coordinator_apart()
        .with_idempotency_retention(Duration::from_secs(2));
    let b = tokio::spawn({
        let (c, r) = (retrying, request.clone());
        async move { c.submit(r).await }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while claimed().await == Some(first) {
        assert!(
            Instant::now() < deadline,
            "the retry never re-keyed the claim"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stall.commit().await.unwrap();

    let a = a.await.unwrap().expect("the stalled request answers");
    let b = b.await.unwrap().expect("the retry answers");
    assert_eq!(a.req_id, b.req_id, "one cid, one transfer");
    assert_ne!(
        a.req_id, first,
        "the stalled creation under the old req_id was refused"
    );
    assert!(coordinator.load(&first).await.unwrap().is_none());
    let created: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM events WHERE event_type = 'TransferCreated'
           AND payload->'TransferCreated'->>'cid' = 'stalled'",
    )
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(created, 1);
    let done = wait_terminal(&s, &a.req_id, Duration::from_secs(10)).await;
    assert_eq!(done.state, TransferState::Committed);
    assert_eq!(s.spot_balance(42, "USDT").await, dec("5"));
    assert_eq!(s.funding_balance(42, "USDT").await, dec("95"));
    s.assert_invariant_exact().await;
}
