//! External deposits in the log (migration 0025, `docs/adr/0016-tamper-evident-log.md`): the
//! money that enters the system. Each `external_deposits` row is written in one transaction with
//! exactly one entry (aggregate `Deposit`, id its external_id, sequence 1, `ExternalDeposited`
//! version 1, owned by its user, its payload naming its asset and amount), so `verify` can hold
//! them together: an entry of any other shape, a row without its entry (money credited behind
//! the ledger's back, even with a matching balance, which keeps the conservation check's equation
//! true) and an entry without its row or with another user, asset or amount are each named.

use eventlog::entries::UnmatchedDeposit;
use sqlx::PgConnection;

use crate::finding::{finding, Finding};
use crate::LogError;

/// The aggregate type of a deposit's entry.
pub const DEPOSIT_AGGREGATE: &str = "Deposit";
/// The event type of a deposit's entry.
pub const DEPOSITED_EVENT: &str = "ExternalDeposited";
const DEPOSITED_VERSION: &str = "1";

/// A deposit's entry has the one shape the ledger writes; any entry of the `Deposit` aggregate
/// or of the `ExternalDeposited` type that does not is refused, with why.
pub(crate) fn check_shape(row: &tlog::Entry<'_>) -> Result<(), String> {
    let deposit_type = row.aggregate_type == DEPOSIT_AGGREGATE;
    let deposit_event = row.event_type == DEPOSITED_EVENT;
    if !deposit_type && !deposit_event {
        return Ok(());
    }
    if deposit_type && deposit_event && row.sequence == 1 && row.event_version == DEPOSITED_VERSION
    {
        return Ok(());
    }
    Err(format!(
        "a deposit's entry is {DEPOSIT_AGGREGATE}:<external_id>:1, {DEPOSITED_EVENT} version \
         {DEPOSITED_VERSION}; this one is {}:{}:{}, {} version {}",
        row.aggregate_type, row.aggregate_id, row.sequence, row.event_type, row.event_version
    ))
}

/// Holds every deposit row to its entry, in the caller's snapshot: the number of deposits, each
/// with its entry, or the first difference.
pub(crate) async fn check(conn: &mut PgConnection) -> Result<Result<u64, Finding>, LogError> {
    let unmatched = eventlog::entries::first_unmatched_deposit(&mut *conn).await?;
    if let Some(u) = unmatched {
        return Ok(Err(describe(u)));
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM external_deposits")
        .fetch_one(&mut *conn)
        .await?;
    Ok(Ok(u64::try_from(rows).unwrap_or(0)))
}

/// The finding an unmatched pair makes.
fn describe(u: UnmatchedDeposit) -> Finding {
    let (
        position,
        external_id,
        e_user,
        e_id,
        e_asset,
        e_amount,
        has_row,
        d_user,
        d_asset,
        d_amount,
    ) = u;
    let show = |v: Option<String>| v.unwrap_or_else(|| "none".into());
    let show_user = |v: Option<i64>| v.map_or_else(|| "none".into(), |u| u.to_string());
    let Some(position) = position else {
        return finding(
            format!("deposit {external_id}"),
            format!(
                "its external_deposits row (user {}, {} {}) has no entry in the log: money \
                 credited behind the ledger's back",
                show_user(d_user),
                show(d_amount),
                show(d_asset)
            ),
        );
    };
    let at = format!("position {position} (deposit {external_id})");
    if !has_row {
        return finding(
            at,
            "an ExternalDeposited entry without its external_deposits row",
        );
    }
    finding(
        at,
        format!(
            "the entry says user {}, {} {} (external_id {}) but its external_deposits row says \
             user {}, {} {}",
            show_user(e_user),
            show(e_amount),
            show(e_asset),
            show(e_id),
            show_user(d_user),
            show(d_amount),
            show(d_asset)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entries::EntryRow;

    fn row(aggregate_type: &str, sequence: i64, event_type: &str, version: &str) -> EntryRow {
        EntryRow {
            position: 7,
            aggregate_type: aggregate_type.into(),
            aggregate_id: "ext-1".into(),
            sequence,
            event_type: event_type.into(),
            event_version: version.into(),
            occurred_at: "2026-01-01T00:00:00.000000Z".into(),
            user_id: Some(3),
            payload: "{}".into(),
        }
    }

    #[test]
    fn a_deposit_entry_has_the_one_shape_the_ledger_writes() {
        assert!(check_shape(&row("Deposit", 1, "ExternalDeposited", "1").entry()).is_ok());
        assert!(check_shape(&row("Transfer", 3, "SourceWithdrawn", "1").entry()).is_ok());
        for bad in [
            row("Deposit", 2, "ExternalDeposited", "1"),
            row("Deposit", 1, "ExternalDeposited", "2"),
            row("Deposit", 1, "TransferCreated", "1"),
            row("Transfer", 1, "ExternalDeposited", "1"),
        ] {
            let why = check_shape(&bad.entry()).unwrap_err();
            assert!(why.contains("a deposit's entry is Deposit:"), "{why}");
        }
    }

    #[test]
    fn a_row_without_its_entry_is_named_by_its_external_id() {
        let f = describe((
            None,
            "forged-1".into(),
            None,
            None,
            None,
            None,
            true,
            Some(1),
            Some("USDT".into()),
            Some("500".into()),
        ));
        assert_eq!(f.at, "deposit forged-1");
        assert!(f.why.contains("user 1, 500 USDT"), "{}", f.why);
    }

    #[test]
    fn an_entry_that_differs_from_its_row_is_named_by_position_and_external_id() {
        let f = describe((
            Some(12),
            "d-9".into(),
            Some(2),
            Some("d-9".into()),
            Some("USDT".into()),
            Some("10".into()),
            true,
            Some(2),
            Some("USDT".into()),
            Some("1000".into()),
        ));
        assert_eq!(f.at, "position 12 (deposit d-9)");
        assert!(f.why.contains("user 2, 10 USDT"), "{}", f.why);
        assert!(f.why.contains("user 2, 1000 USDT"), "{}", f.why);
    }
}
