//! The projector's reads and writes of its own tables, shared by the live pass and the bulk
//! rebuild: the transfer rows a batch continues, the folded transfer rows, balances and state
//! counts, and the stored position. (The feed rows and bulk transfer rows go with COPY, in
//! `copy.rs`.)

use std::collections::HashSet;

use domain::TransferState;
use sqlx::{Postgres, Transaction};

use crate::fold::{BalanceDelta, Fold};
use crate::rows::TransferRow;

/// The transfer rows of `req_ids`, as stored.
pub(crate) async fn load_rows(
    tx: &mut Transaction<'static, Postgres>,
    req_ids: &[&str],
) -> Result<Vec<TransferRow>, sqlx::Error> {
    sqlx::query("SELECT * FROM transfers_view WHERE req_id = ANY($1)")
        .bind(req_ids)
        .try_map(crate::rows::transfer_row)
        .fetch_all(&mut **tx)
        .await
}

/// Where the projector stands after a batch: the last event applied (its tx_id and
/// global_position) and how many events were applied in all.
pub(crate) struct Cursor {
    pub tx_id: i64,
    pub global_position: i64,
    pub events_applied: i64,
}

/// Stores the projector's position, in the transaction that wrote what it covers.
pub(crate) async fn write_cursor(
    tx: &mut Transaction<'static, Postgres>,
    cursor: &Cursor,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE projector_cursor SET tx_id = $1::text::xid8, global_position = $2,
            events_applied = $3, updated_at = now()
         WHERE projector = 'main'",
    )
    .bind(cursor.tx_id.to_string())
    .bind(cursor.global_position)
    .bind(cursor.events_applied)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Writes the fold's transfer rows: inserts those it created, updates the others.
pub(crate) async fn write_transfers(
    tx: &mut Transaction<'static, Postgres>,
    fold: &Fold,
) -> Result<(), sqlx::Error> {
    let mut rows: Vec<&TransferRow> = fold.rows.values().collect();
    rows.sort_by(|a, b| a.req_id.cmp(&b.req_id));
    let created: HashSet<&str> = fold.created.iter().map(String::as_str).collect();
    let (new, old): (Vec<&TransferRow>, Vec<&TransferRow>) = rows
        .into_iter()
        .partition(|r| created.contains(r.req_id.as_str()));
    if !new.is_empty() {
        insert_transfers(tx, &new).await?;
    }
    if !old.is_empty() {
        update_transfers(tx, &old).await?;
    }
    Ok(())
}

async fn insert_transfers(
    tx: &mut Transaction<'static, Postgres>,
    new: &[&TransferRow],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO transfers_view (req_id, user_id, from_account, to_account, asset, amount,
            cid, state, state_id, failure_code, failure_message, created_at, updated_at,
            last_sequence)
         SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[],
            $6::numeric[], $7::text[], $8::text[], $9::smallint[], $10::text[], $11::text[],
            $12::timestamptz[], $13::timestamptz[], $14::bigint[])",
    )
    .bind(new.iter().map(|r| r.req_id.clone()).collect::<Vec<_>>())
    .bind(new.iter().map(|r| r.user_id).collect::<Vec<_>>())
    .bind(
        new.iter()
            .map(|r| r.from_account.clone())
            .collect::<Vec<_>>(),
    )
    .bind(new.iter().map(|r| r.to_account.clone()).collect::<Vec<_>>())
    .bind(new.iter().map(|r| r.asset.clone()).collect::<Vec<_>>())
    .bind(new.iter().map(|r| r.amount).collect::<Vec<_>>())
    .bind(new.iter().map(|r| r.cid.clone()).collect::<Vec<_>>())
    .bind(new.iter().map(|r| r.state.clone()).collect::<Vec<_>>())
    .bind(new.iter().map(|r| r.state_id).collect::<Vec<_>>())
    .bind(
        new.iter()
            .map(|r| r.failure_code.clone())
            .collect::<Vec<_>>(),
    )
    .bind(
        new.iter()
            .map(|r| r.failure_message.clone())
            .collect::<Vec<_>>(),
    )
    .bind(new.iter().map(|r| r.created_at).collect::<Vec<_>>())
    .bind(new.iter().map(|r| r.updated_at).collect::<Vec<_>>())
    .bind(new.iter().map(|r| r.last_sequence).collect::<Vec<_>>())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn update_transfers(
    tx: &mut Transaction<'static, Postgres>,
    old: &[&TransferRow],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE transfers_view t SET state = u.state, state_id = u.state_id,
            failure_code = u.failure_code, failure_message = u.failure_message,
            updated_at = u.updated_at, last_sequence = u.last_sequence
         FROM UNNEST($1::text[], $2::text[], $3::smallint[], $4::text[], $5::text[],
            $6::timestamptz[], $7::bigint[])
            AS u(req_id, state, state_id, failure_code, failure_message, updated_at, last_sequence)
         WHERE t.req_id = u.req_id",
    )
    .bind(old.iter().map(|r| r.req_id.clone()).collect::<Vec<_>>())
    .bind(old.iter().map(|r| r.state.clone()).collect::<Vec<_>>())
    .bind(old.iter().map(|r| r.state_id).collect::<Vec<_>>())
    .bind(
        old.iter()
            .map(|r| r.failure_code.clone())
            .collect::<Vec<_>>(),
    )
    .bind(
        old.iter()
            .map(|r| r.failure_message.clone())
            .collect::<Vec<_>>(),
    )
    .bind(old.iter().map(|r| r.updated_at).collect::<Vec<_>>())
    .bind(old.iter().map(|r| r.last_sequence).collect::<Vec<_>>())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Adds the fold's balance deltas to `transfer_balances`.
pub(crate) async fn write_balances(
    tx: &mut Transaction<'static, Postgres>,
    fold: &Fold,
) -> Result<(), sqlx::Error> {
    let mut deltas: Vec<(&(i64, String), &BalanceDelta)> = fold
        .balances
        .iter()
        .filter(|(_, d)| **d != BalanceDelta::default())
        .collect();
    if deltas.is_empty() {
        return Ok(());
    }
    // A fixed order keeps two writers (live and a replay's final step) from deadlocking.
    deltas.sort_by(|a, b| a.0.cmp(b.0));
    sqlx::query(
        "INSERT INTO transfer_balances AS b (user_id, asset, funding_net, spot_net, in_flight)
         SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::numeric[], $4::numeric[], $5::numeric[])
         ON CONFLICT (user_id, asset) DO UPDATE SET
            funding_net = b.funding_net + EXCLUDED.funding_net,
            spot_net = b.spot_net + EXCLUDED.spot_net,
            in_flight = b.in_flight + EXCLUDED.in_flight",
    )
    .bind(deltas.iter().map(|(k, _)| k.0).collect::<Vec<_>>())
    .bind(deltas.iter().map(|(k, _)| k.1.clone()).collect::<Vec<_>>())
    .bind(
        deltas
            .iter()
            .map(|(_, d)| d.funding_net)
            .collect::<Vec<_>>(),
    )
    .bind(deltas.iter().map(|(_, d)| d.spot_net).collect::<Vec<_>>())
    .bind(deltas.iter().map(|(_, d)| d.in_flight).collect::<Vec<_>>())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Adds the fold's state count changes to `transfer_state_counts`.
pub(crate) async fn write_counts(
    tx: &mut Transaction<'static, Postgres>,
    fold: &Fold,
) -> Result<(), sqlx::Error> {
    let mut counts: Vec<(i16, i64)> = fold
        .state_counts
        .iter()
        .filter(|(_, n)| **n != 0)
        .map(|(s, n)| (*s, *n))
        .collect();
    if counts.is_empty() {
        return Ok(());
    }
    counts.sort();
    let names: Vec<String> = counts
        .iter()
        .map(|(s, _)| {
            TransferState::from_id(*s)
                .map_or("UNKNOWN", TransferState::as_str)
                .to_owned()
        })
        .collect();
    sqlx::query(
        "INSERT INTO transfer_state_counts AS c (state_id, state, count)
         SELECT * FROM UNNEST($1::smallint[], $2::text[], $3::bigint[])
         ON CONFLICT (state_id) DO UPDATE SET count = c.count + EXCLUDED.count",
    )
    .bind(counts.iter().map(|(s, _)| *s).collect::<Vec<_>>())
    .bind(names)
    .bind(counts.iter().map(|(_, n)| *n).collect::<Vec<_>>())
    .execute(&mut **tx)
    .await?;
    Ok(())
}
