//! The stuck listing: open transfers with their retry records, as the admin routes show them
//! (`GET /api/v1/admin/transfers/stuck`). Read from `open_transfers` and `transfer_retries`, with
//! each one's creation from the event log (the query is `eventlog::transfers::stuck_transfers`,
//! since it joins the `events` table), never from the read models.

use std::time::Duration;

use sqlx::PgPool;

use crate::worker::millis;

pub use application::reads::StuckTransfer;

/// Open transfers unchanged for at least `older_than`, oldest first, with their retry records.
pub async fn stuck_transfers(
    pool: &PgPool,
    older_than: Duration,
    limit: i64,
) -> Result<Vec<StuckTransfer>, sqlx::Error> {
    let rows: Vec<crate::rows::StuckRow> =
        eventlog::transfers::stuck_transfers(pool, millis(older_than), limit).await?;
    Ok(rows.into_iter().map(|r| r.0).collect())
}
