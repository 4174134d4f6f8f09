//! The chaos run's end check, once every process is quiet: each transfer's final state against
//! what each system applied under its `req_id` (at most once, exactly as the state says), fund
//! conservation from the raw tables, spot-core's whole journal read from seq 1 (through archived
//! segments) and replayed against its totals, and the ledger's own exact check, incremental and
//! full, over HTTP.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::bail;
use rust_decimal::Decimal;
use spot_core::client::SpotClient;
use spot_core::protocol::{
    CoreStatus, ErrorCode, JournalRecord, MovementOp, Outcome, Request, Response,
};

use super::{Report, Sent, SECRET};

/// A cell's own events: not the copies a partition move brought in (ADR 0023 §5, `origin_move`
/// in their metadata). A transfer runs all its steps in the cell it was created in (a move
/// drains the partition's open transfers first), so its own events there are its whole story;
/// the copies in another cell (of a move done, or void after a cancel) are read by the ledger's
/// own check, never here.
pub(super) const OWN_EVENTS: &str = "(metadata::jsonb ->> 'origin_move') IS NULL";

/// Transfers whose last event is not terminal, straight from the event log (the cell's own).
pub(super) async fn open_transfers(pool: &sqlx::PgPool) -> anyhow::Result<usize> {
    let n: i64 = sqlx::query_scalar(&format!(
        "SELECT COUNT(*) FROM (
            SELECT DISTINCT ON (aggregate_id) aggregate_id, event_type, payload FROM events
            WHERE aggregate_type = 'Transfer' AND {OWN_EVENTS}
            ORDER BY aggregate_id, sequence DESC) last
         WHERE event_type NOT IN ('TransferCommitted', 'TransferFailed', 'TransferRolledBack')
           AND NOT (event_type = 'TransferManuallyResolved'
                    AND payload->'TransferManuallyResolved'->>'to_state'
                        IN ('COMMITTED', 'FAILED', 'ROLLED_BACK'))"
    ))
    .fetch_one(pool)
    .await?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

/// Everything spot-core's journal holds from seq 1, page by page; past compacted segments it is
/// served from the archive. A journal that no longer reaches back to seq 1 (JOURNAL_COMPACTED)
/// is an error that says so.
pub async fn spot_journal(client: &SpotClient) -> anyhow::Result<Vec<JournalRecord>> {
    let mut all = Vec::new();
    loop {
        let after_seq = all.last().map_or(0, JournalRecord::seq);
        let req = Request::Journal {
            after_seq,
            limit: 10_000,
        };
        match client.call(&req).await? {
            Response::Ok {
                records: Some(records),
                ..
            } => {
                if records.is_empty() {
                    return Ok(all);
                }
                all.extend(records);
            }
            Response::Error {
                code: ErrorCode::JournalCompacted,
                message,
            } => bail!(
                "spot-core's journal no longer serves the records after seq {after_seq} \
                 (JOURNAL_COMPACTED: {message}): compaction dropped records the audit needs \
                 instead of archiving them"
            ),
            other => bail!("journal after seq {after_seq} answered {other:?}"),
        }
    }
}

/// spot-core's counters (`status`); `None` from a spot-core without the op.
pub(super) async fn core_status(client: &SpotClient) -> anyhow::Result<Option<CoreStatus>> {
    Ok(match client.call(&Request::Status {}).await? {
        Response::Ok { core: Some(c), .. } => Some(c),
        _ => None,
    })
}

/// What is wrong with the journal: not starting at seq 1, a gap, not ending at spot-core's last
/// seq, or applied movements that do not add up to spot-core's totals.
fn journal_problems(
    records: &[JournalRecord],
    last_seq: Option<u64>,
    totals: &BTreeMap<String, Decimal>,
) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some((expected, r)) = (1..)
        .zip(records)
        .find(|(expected, r)| r.seq() != *expected)
    {
        problems.push(format!(
            "journal: seq {} where {expected} was due (a gap or a repeat)",
            r.seq()
        ));
    }
    // `last_seq` is read before the journal: a running ledger may append horizon and retain
    // marks in between, so the journal may go further, never stop short.
    let end = records.last().map_or(0, JournalRecord::seq);
    if let Some(last) = last_seq.filter(|last| end < *last) {
        problems.push(format!(
            "journal: ends at seq {end}, before spot-core's last seq {last} (read before it)"
        ));
    }
    let mut replayed: BTreeMap<String, Decimal> = BTreeMap::new();
    for (op, m) in records.iter().filter_map(JournalRecord::as_movement) {
        if m.outcome == Outcome::Applied {
            let sum = replayed.entry(m.asset.clone()).or_default();
            match op {
                MovementOp::Withdraw => *sum -= m.amount,
                MovementOp::Deposit | MovementOp::Refund => *sum += m.amount,
            }
        }
    }
    // A partition move's records (ADR 0023 §4): a move-out took its accounts' balances out of
    // this engine, a move-in credited them.
    for record in records {
        let (sign, m) = match record {
            JournalRecord::MoveOut(m) => (Decimal::NEGATIVE_ONE, m),
            JournalRecord::MoveIn(m) => (Decimal::ONE, m),
            _ => continue,
        };
        for a in &m.payload.accounts {
            *replayed.entry(a.asset.clone()).or_default() += sign * a.available;
        }
    }
    let assets: std::collections::BTreeSet<&String> =
        replayed.keys().chain(totals.keys()).collect();
    for asset in assets {
        let (from_journal, total) = (
            replayed.get(asset).copied().unwrap_or_default(),
            totals.get(asset).copied().unwrap_or_default(),
        );
        if from_journal != total {
            problems.push(format!(
                "journal: applied {asset} movements add up to {}, spot-core holds {}",
                from_journal.normalize(),
                total.normalize()
            ));
        }
    }
    problems
}

/// The ledger's own exact check (`GET /api/v1/admin/invariant`, `?full=true` for the full one
/// from zero): `None` when it answers ok and nothing is halted, else what is wrong. Retried
/// while it cannot run (a process still starting) or, under a cell map, while it covers only
/// part of the cells (`partial`: a cell whose database or spot-core path was faulted a moment
/// ago is marked up again by its watcher's next probe); a cell still down at the deadline is
/// reported.
pub(super) async fn ledger_invariant(base: &str, full: bool) -> anyhow::Result<Option<String>> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?;
    let admin = edge::mint(
        SECRET.as_bytes(),
        domain::UserId::new(1).map_err(|e| anyhow::anyhow!("{e:?}"))?,
        true,
        Duration::from_secs(3600),
    );
    let url = format!(
        "{base}/api/v1/admin/invariant{}",
        if full { "?full=true" } else { "" }
    );
    let name = if full { "full check" } else { "check" };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let last = match http.get(&url).bearer_auth(&admin).send().await {
            Ok(resp) if resp.status().is_success() => {
                let body: serde_json::Value = resp.json().await?;
                if body["partial"] == serde_json::json!(true) && Instant::now() <= deadline {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
                return Ok(
                    if body["ok"] == serde_json::json!(true) && body["halted"] != true {
                        None
                    } else {
                        Some(format!("the ledger's {name} is not ok: {body}"))
                    },
                );
            }
            Ok(resp) => format!(
                "{} {}",
                resp.status(),
                resp.text().await.unwrap_or_default()
            ),
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            return Ok(Some(format!("the ledger's {name} could not run: {last}")));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Answered transfers the log no longer has, or has in an earlier state than the client was
/// answered with (an answered terminal state must be the final one). Every other figure looks
/// only at the transfers the log has; a failover that lost acknowledged commits shows here.
fn answered_lost(finals: &[(String, String, String)], sent: &HashMap<String, Sent>) -> usize {
    let last: HashMap<&str, (&str, &str)> = finals
        .iter()
        .map(|(id, ty, to)| (id.as_str(), (ty.as_str(), to.as_str())))
        .collect();
    let mut lost = 0;
    for (req_id, s) in sent {
        let final_state = match last.get(req_id.as_str()) {
            None => None,
            Some(("TransferCommitted", _)) => Some("COMMITTED"),
            Some(("TransferFailed", _)) => Some("FAILED"),
            Some(("TransferRolledBack", _)) => Some("ROLLED_BACK"),
            Some(("TransferManuallyResolved", to)) => Some(*to),
            Some(_) => Some("OPEN"),
        };
        let terminal = ["COMMITTED", "FAILED", "ROLLED_BACK"];
        let ok = match final_state {
            None => false,
            Some(f) => !terminal.contains(&s.state.as_str()) || f == s.state,
        };
        if !ok {
            lost += 1;
            eprintln!(
                "answered transfer {req_id} ({}) is {} after the run",
                s.state,
                final_state.unwrap_or("missing")
            );
        }
    }
    lost
}

/// The req_ids of the transfers created in this cell (their own events, not copies).
pub(super) async fn own_transfers(pool: &sqlx::PgPool) -> anyhow::Result<Vec<String>> {
    Ok(sqlx::query_scalar(&format!(
        "SELECT aggregate_id FROM events
         WHERE event_type = 'TransferCreated' AND {OWN_EVENTS}"
    ))
    .fetch_all(pool)
    .await?)
}

/// Each client key (user, cid) of a transfer created in this cell, once per transfer.
pub(super) async fn own_cids(pool: &sqlx::PgPool) -> anyhow::Result<Vec<(String, String)>> {
    Ok(sqlx::query_as(&format!(
        "SELECT payload->'TransferCreated'->>'user_id', payload->'TransferCreated'->>'cid'
         FROM events WHERE event_type = 'TransferCreated'
           AND payload->'TransferCreated'->>'cid' IS NOT NULL AND {OWN_EVENTS}"
    ))
    .fetch_all(pool)
    .await?)
}

/// Everything but the counts of the run itself. `sent` holds the answered transfers created in
/// this cell; `owned` the partitions the cell owns under the final map (after the run's moves;
/// every partition without a map): its money is what it owns.
pub(super) async fn check(
    pool: &sqlx::PgPool,
    spot: &SpotClient,
    sent: &Mutex<HashMap<String, Sent>>,
    owned: &[i32],
) -> anyhow::Result<Report> {
    let mut report = Report::default();
    // The final state of each transfer created here, from its own events.
    let finals: Vec<(String, String, String)> = sqlx::query_as(&format!(
        "SELECT aggregate_id, event_type,
                COALESCE(payload->'TransferManuallyResolved'->>'to_state', '') FROM (
            SELECT DISTINCT ON (aggregate_id) aggregate_id, event_type, payload FROM events
            WHERE aggregate_type = 'Transfer' AND {OWN_EVENTS}
            ORDER BY aggregate_id, sequence DESC) last"
    ))
    .fetch_all(pool)
    .await?;
    report.transfers = finals.len();

    // (req_id, op) → applied, in each system; a second record of one key is a duplicate.
    let mut applied: HashMap<(String, String, &'static str), usize> = HashMap::new();
    let journal: Vec<(String, String, String)> =
        // The cell's own movements: a move's copies name it (`move_id`).
        sqlx::query_as("SELECT req_id, operation, outcome FROM funding_journal WHERE move_id IS NULL")
            .fetch_all(pool)
            .await?;
    for (req_id, op, outcome) in journal {
        let n = applied.entry((req_id, op, "FUNDING")).or_insert(0);
        *n += usize::from(outcome == "APPLIED");
    }
    let last_seq_before = core_status(spot).await?.map(|c| c.last_seq);
    let records = spot_journal(spot).await?;
    report.journal_records = records.len();
    let mut seen = HashMap::new();
    for record in &records {
        if let Some((op, m)) = record.as_movement() {
            let key = (m.req_id.clone(), format!("{op:?}").to_uppercase(), "SPOT");
            *seen.entry(key.clone()).or_insert(0usize) += 1;
            let n = applied.entry(key).or_insert(0);
            *n += usize::from(m.outcome == Outcome::Applied);
        }
    }
    report.duplicates =
        seen.values().filter(|n| **n > 1).count() + applied.values().filter(|n| **n > 1).count();

    // Positions are taken at append under the feed's advisory lock (`feed_take()`): a crash, a
    // cut connection or a restart of PostgreSQL mid-append rolls them back with the append,
    // never leaving a gap.
    let (events, distinct, first, last, head): (i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT feed_position), COALESCE(min(feed_position), 1),
                COALESCE(max(feed_position), 0), (SELECT position FROM feed_head)
         FROM events",
    )
    .fetch_one(pool)
    .await?;
    report.feed_events = events;
    report.feed_dense = distinct == events && first == 1 && last == events && head == events;
    if !report.feed_dense {
        report.problems.push(format!(
            "feed positions not dense: {events} events, {distinct} distinct positions, \
             {first}..={last}, head {head}"
        ));
    }

    let sent = sent.lock().unwrap_or_else(|e| e.into_inner()).clone();
    report.answered_lost = answered_lost(&finals, &sent);
    for (req_id, event_type, manual_to) in &finals {
        let state = match event_type.as_str() {
            "TransferCommitted" => "COMMITTED",
            "TransferFailed" => "FAILED",
            "TransferRolledBack" => "ROLLED_BACK",
            "TransferManuallyResolved" => manual_to.as_str(),
            _ => "OPEN",
        };
        *report.states.entry(state.to_owned()).or_insert(0) += 1;
        let Some(s) = sent.get(req_id) else {
            // Created but never answered to its client: its direction is in its first event.
            continue;
        };
        let (src, dst) = if s.from_funding {
            ("FUNDING", "SPOT")
        } else {
            ("SPOT", "FUNDING")
        };
        let got = |op: &str, sys: &'static str| {
            applied
                .get(&(req_id.clone(), op.to_owned(), sys))
                .copied()
                .unwrap_or(0)
        };
        // Only a target that refuses (every seventh user's SPOT account is disabled) may turn
        // a transfer back: a rollback anywhere else compensated an outcome that was unknown.
        if state == "ROLLED_BACK" && !(s.from_funding && s.user % 7 == 0) {
            report.problems.push(format!(
                "{req_id} ROLLED_BACK although its target never refuses (user {}, from {src})",
                s.user
            ));
        }
        let expected = match state {
            "COMMITTED" => (1, 1, 0),
            "FAILED" => (0, 0, 0),
            "ROLLED_BACK" => (1, 0, 1),
            _ => continue,
        };
        let actual = (
            got("WITHDRAW", src),
            got("DEPOSIT", dst),
            got("REFUND", src),
        );
        if actual != expected {
            report.mismatched += 1;
            eprintln!("records disagree for {req_id} ({state}): withdraw/deposit/refund applied {actual:?}, expected {expected:?}");
        }
    }

    // Conservation, cell-wide for USDT: FUNDING + SPOT + in-flight = external deposits, each of
    // the partitions the cell owns (a partition moved out leaves its rows behind, one moved in
    // brings its deposits along; the engine holds only the accounts moved in and never out).
    // With every transfer terminal, in-flight is zero; any open one is counted at its amount if
    // money has left its source.
    let funding_total: Decimal = sqlx::query_scalar(
        "SELECT COALESCE(SUM(balance), 0) FROM funding_accounts
         WHERE asset = 'USDT' AND partition = ANY($1)",
    )
    .bind(owned)
    .fetch_one(pool)
    .await?;
    let external: Decimal = sqlx::query_scalar(
        "SELECT COALESCE(SUM(amount), 0) FROM external_deposits
         WHERE asset = 'USDT' AND user_partition(user_id) = ANY($1)",
    )
    .bind(owned)
    .fetch_one(pool)
    .await?;
    report.deposits = external;
    let totals: BTreeMap<String, Decimal> = match spot.call(&Request::Totals {}).await? {
        Response::Ok {
            totals: Some(t), ..
        } => t.into_iter().map(|e| (e.asset, e.sum)).collect(),
        other => bail!("totals answered {other:?}"),
    };
    let spot_total = totals.get("USDT").copied().unwrap_or_default();
    let diff = funding_total + spot_total - external;
    if diff > Decimal::ZERO {
        report.created = diff.normalize();
    } else if diff < Decimal::ZERO {
        report.lost = (-diff).normalize();
    }

    // One client request (a cid, retried until answered) must create one transfer.
    // (Across cells too: `run_cells` counts each cell's `cids`.)
    let (twice, extra): (i64, i64) = sqlx::query_as(&format!(
        "SELECT count(*), COALESCE(sum(n - 1), 0)::bigint FROM (
            SELECT count(*) AS n FROM events WHERE event_type = 'TransferCreated'
              AND payload->'TransferCreated'->>'cid' IS NOT NULL AND {OWN_EVENTS}
            GROUP BY payload->'TransferCreated'->>'user_id', payload->'TransferCreated'->>'cid'
            HAVING count(*) > 1) repeated"
    ))
    .fetch_one(pool)
    .await?;
    if twice > 0 {
        report.problems.push(format!(
            "{twice} client keys (cid) created more than one transfer ({extra} extra transfers)"
        ));
    }
    let resumed: i64 = sqlx::query_scalar("SELECT count(DISTINCT req_id) FROM recovery_attempts")
        .fetch_one(pool)
        .await?;
    report.resumed = usize::try_from(resumed).unwrap_or(0);
    report.core = core_status(spot).await?;
    report
        .problems
        .extend(journal_problems(&records, last_seq_before, &totals));
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spot_core::protocol::{HorizonRecord, MovementRecord};

    fn movement(op: MovementOp, seq: u64, amount: i64, outcome: Outcome) -> JournalRecord {
        JournalRecord::from_movement(
            op,
            MovementRecord {
                seq,
                req_id: format!("r{seq}"),
                user_id: 1,
                asset: "USDT".into(),
                amount: Decimal::from(amount),
                outcome,
                code: None,
                balance: None,
            },
        )
    }

    fn totals(usdt: i64) -> BTreeMap<String, Decimal> {
        BTreeMap::from([("USDT".to_owned(), Decimal::from(usdt))])
    }

    #[test]
    fn a_complete_journal_replays_to_the_totals_and_anything_else_is_named() {
        let records = vec![
            movement(MovementOp::Deposit, 1, 10, Outcome::Applied),
            JournalRecord::Horizon(HorizonRecord {
                seq: 2,
                before_ms: 5,
            }),
            movement(MovementOp::Withdraw, 3, 4, Outcome::Applied),
            movement(MovementOp::Withdraw, 4, 100, Outcome::Refused),
            movement(MovementOp::Refund, 5, 1, Outcome::Applied),
        ];
        assert!(journal_problems(&records, Some(5), &totals(7)).is_empty());
        // Compacted without archive: the journal starts late.
        let late = journal_problems(&records[2..], Some(5), &totals(7));
        assert!(late[0].contains("seq 3 where 1 was due"), "{late:?}");
        // A gap in the middle, a short end, money that does not add up.
        let mut gap = records.clone();
        gap.remove(2);
        assert!(journal_problems(&gap, Some(5), &totals(7))[0].contains("seq 4 where 3"));
        assert!(journal_problems(&records, Some(6), &totals(7))[0].contains("ends at seq 5"));
        // Marks appended after spot-core's last seq was read are not a problem.
        assert!(journal_problems(&records, Some(4), &totals(7)).is_empty());
        assert!(journal_problems(&records, Some(5), &totals(8))[0].contains("add up to 7"));
    }
}
