//! Rounds of single requests (issue 35, `application/src/round.rs`) over real PostgreSQL and
//! spot-core: concurrent single requests move together through the bulk machinery, each with its
//! own answer (a refusal, a compensation or a cid repeat never changes another's), and a crash
//! with half of a shared round's calls made is recovered transfer by transfer, conservation
//! exact.

use std::time::Duration;

use application::{CoordinatorError, NewTransfer};
use domain::{AccountType, Amount, AssetSymbol, ErrorCode, ReqId, TransferState, UserId};
use serde_json::json;

use crate::helpers::{dec, token, Stack};
use crate::procs::{all_req_ids, spot_ops, state_of, wait_terminal, LedgerProcess, RECOVER_NOW};

fn request(user: u64, amount: &str, cid: Option<&str>) -> NewTransfer {
    NewTransfer {
        user_id: UserId::new(user).unwrap(),
        from: AccountType::Funding,
        to: AccountType::Spot,
        asset: AssetSymbol::parse("USDT").unwrap(),
        amount: Amount::parse(amount).unwrap(),
        cid: cid.map(str::to_owned),
    }
}

#[tokio::test]
async fn rounds_answer_each_single_request_alone_whatever_the_others_come_to() {
    let s = Stack::start().await;
    s.deposit(1, "USDT", "100").await;
    s.deposit(2, "USDT", "50").await;
    s.deposit(3, "USDT", "10").await;
    // User 2's SPOT account refuses deposits: its transfer compensates.
    s.spot_adapter
        .set_status(
            UserId::new(2).unwrap(),
            &AssetSymbol::parse("USDT").unwrap(),
            adapters::AccountStatus::Disabled,
        )
        .await
        .unwrap();
    let mut requests = vec![request(1, "10", None)];
    for i in 0..6 {
        requests.push(request(1, "5", Some(&format!("a{i}"))));
    }
    // The same cid three times in flight together: twice the same body, once another.
    requests.push(request(1, "1", Some("dup")));
    requests.push(request(1, "1", Some("dup")));
    requests.push(request(1, "2", Some("dup")));
    requests.push(request(3, "100", None)); // more than user 3 holds: FAILED
    requests.push(request(2, "5", None)); // deposit refused: ROLLED_BACK
    let answers = futures_util::future::join_all(
        requests
            .iter()
            .map(|r| s.coordinator.submit(r.clone()))
            .collect::<Vec<_>>(),
    )
    .await;
    let stats = s.coordinator.round_stats();
    assert_eq!(stats.requests, 12, "every request went through a round");
    assert!(stats.shared >= 2, "some requests shared a round: {stats:?}");

    let state = |i: usize| answers[i].as_ref().map(|t| t.state).unwrap();
    for i in 0..7 {
        assert_eq!(state(i), TransferState::Committed, "request {i}");
    }
    assert_eq!(state(10), TransferState::Failed, "user 3's own refusal");
    assert_eq!(state(11), TransferState::RolledBack, "user 2's own refusal");
    // The cid: one body won, its two requests got the same transfer, the other body refused;
    // or the other body won and both of the first were refused.
    let reused = |a: &Result<domain::TransferData, CoordinatorError>| {
        matches!(
            a,
            Err(CoordinatorError::Refused(ErrorCode::IdempotencyKeyReused))
        )
    };
    match (&answers[7], &answers[8], &answers[9]) {
        (Ok(a), Ok(b), third) => {
            assert_eq!(a.req_id, b.req_id, "the same cid and body: one transfer");
            assert!(reused(third), "{third:?}");
        }
        (first, second, Ok(_)) => assert!(reused(first) && reused(second)),
        other => panic!("one of the cid's bodies wins: {other:?}"),
    }
    let ids: std::collections::HashSet<ReqId> = answers
        .iter()
        .filter_map(|a| a.as_ref().ok().map(|t| t.req_id))
        .collect();
    assert_eq!(
        ids.len(),
        10,
        "one transfer per request, the cid's repeat excepted"
    );
    assert_eq!(all_req_ids(&s).await.len(), 10);
    let dup_amount = if answers[9].is_ok() {
        dec("2")
    } else {
        dec("1")
    };
    assert_eq!(
        s.funding_balance(1, "USDT").await,
        dec("100") - dec("40") - dup_amount
    );
    assert_eq!(s.spot_balance(1, "USDT").await, dec("40") + dup_amount);
    assert_eq!(s.funding_balance(2, "USDT").await, dec("50"));
    assert_eq!(s.funding_balance(3, "USDT").await, dec("10"));
    for user in 1..=3 {
        assert_eq!(s.in_flight(user, "USDT").await, dec("0"));
    }
    s.assert_invariant_exact().await;
}

/// Sends waves of concurrent single FUNDING→SPOT transfers of 5 USDT (user 1 holds 1,000) to a
/// `ledger serve` armed with `failpoint`, until a round carrying more than one of them aborts
/// it with half of one step's calls made; checks what the crash left, then lets a new process's
/// recovery worker finish every transfer: each committed once, the conservation check exact.
async fn crash_mid_round(failpoint: &str, left_in: TransferState) {
    let s = Stack::start().await;
    s.deposit(1, "USDT", "1000").await;
    let env = [
        ("LEDGER_FAILPOINT", failpoint),
        ("LEDGER_ALLOW_FAILPOINTS", "1"),
        ("LEDGER_RECOVERY_STALE_MS", "3600000"),
    ];
    let mut crashing = LedgerProcess::start(&s.db.url, &s.spot, &env);
    let http = reqwest::Client::new();
    let url = format!("{}/api/v1/internal_transfer", crashing.base);
    let user = token(1, false);
    let mut died = false;
    for _wave in 0..20 {
        let posts = (0..10).map(|_| {
            http.post(&url)
                .bearer_auth(&user)
                .json(&json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "5"}))
                .send()
        });
        let answers = futures_util::future::join_all(posts).await;
        if answers.iter().any(Result::is_err) {
            died = true;
            break;
        }
    }
    assert!(died, "a shared round met the fail point");
    let status = crashing.wait_exit(Duration::from_secs(15));
    assert!(!status.success(), "aborted, not exited cleanly: {status}");
    assert!(crashing.log().contains(&format!("fail point {failpoint}")));

    // The round that crashed is left with half its calls of one step made (another round in
    // flight beside it may be anywhere on its way); nothing was made twice.
    let ids = all_req_ids(&s).await;
    let (mut made, mut not_made) = (0, 0);
    for id in &ids {
        let state = state_of(&s, id).await;
        let withdrawn = s.funding.journal_for(&id.to_string()).await.unwrap().len();
        let deposited = spot_ops(&s, id).await.len();
        assert!(withdrawn <= 1 && deposited <= 1, "{id}: a call made twice");
        match state {
            TransferState::Committed => continue,
            TransferState::SourcePending | TransferState::TargetPending => {}
            other => panic!("{id}: left in {other}"),
        }
        if state != left_in {
            continue;
        }
        let call_made = match left_in {
            TransferState::SourcePending => withdrawn == 1,
            _ => {
                assert_eq!(withdrawn, 1, "{id}: withdrawn before its deposit");
                deposited == 1
            }
        };
        if call_made {
            made += 1;
        } else {
            not_made += 1;
        }
    }
    assert!(
        made >= 1 && not_made >= 1,
        "half the round's calls made: {made} made, {not_made} not"
    );

    let _recovering = LedgerProcess::start(&s.db.url, &s.spot, &RECOVER_NOW);
    for id in &ids {
        let t = wait_terminal(&s, id, Duration::from_secs(60)).await;
        assert_eq!(t.state, TransferState::Committed, "{id}");
        let journal = s.funding.journal_for(&id.to_string()).await.unwrap();
        assert_eq!(journal.len(), 1, "one withdraw per transfer");
        assert_eq!(spot_ops(&s, id).await.len(), 1, "one deposit per transfer");
    }
    let n = rust_decimal::Decimal::from(ids.len());
    assert_eq!(
        s.funding_balance(1, "USDT").await,
        dec("1000") - dec("5") * n
    );
    assert_eq!(s.spot_balance(1, "USDT").await, dec("5") * n);
    assert_eq!(s.in_flight(1, "USDT").await, dec("0"));
    s.assert_invariant_exact().await;
}

#[tokio::test]
async fn round_crash_with_half_the_withdraws_made_recovers_each_transfer_once() {
    crash_mid_round("round_half_withdrawn", TransferState::SourcePending).await;
}

#[tokio::test]
async fn round_crash_with_half_the_deposits_made_recovers_each_transfer_once() {
    crash_mid_round("round_half_deposited", TransferState::TargetPending).await;
}

/// `/metrics` counts this process's rounds: every single request in one, and requests sent
/// together sharing theirs.
#[tokio::test]
async fn metrics_count_the_rounds_and_the_requests_they_carried() {
    let s = Stack::start().await;
    for user in 1..=4 {
        s.deposit(user, "USDT", "100").await;
    }
    let ledger = LedgerProcess::start(&s.db.url, &s.spot, &[]);
    let before = ledger
        .metrics_until(Duration::from_secs(10), |t| {
            t.contains("ledger_rounds_total")
        })
        .await;
    assert!(
        before.lines().any(|l| l == "ledger_round_requests_total 0"),
        "{before}"
    );
    let ledger_ref = &ledger;
    let posts = (1..=4u64).flat_map(|user| {
        (0..4).map(move |_| {
            let body = json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "1"});
            ledger_ref.transfer(user, body)
        })
    });
    let answers = futures_util::future::join_all(posts).await;
    for answer in &answers {
        assert_eq!(answer["state"], "COMMITTED", "{answer}");
    }
    let text = ledger
        .metrics_until(Duration::from_secs(10), |t| {
            t.lines().any(|l| l == "ledger_round_requests_total 16")
        })
        .await;
    let counter = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in\n{text}"))
    };
    let (rounds, shared) = (
        counter("ledger_rounds_total"),
        counter("ledger_round_shared_requests_total"),
    );
    assert!(
        (1..16).contains(&rounds),
        "sixteen requests at once in fewer rounds: {rounds}"
    );
    assert!(
        (2..=16).contains(&shared),
        "some shared their round: {shared}"
    );
}
