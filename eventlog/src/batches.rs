//! The projector's reads of the log in commit order: a page of events below the commit
//! watermark between two (tx_id, global_position) bounds, the same read as one COPY stream for
//! the bulk rebuild, and the log's length.

use sqlx::{PgConnection, PgPool};

/// The event query of both passes: events below the commit watermark ($1), after the stored
/// pair ($2, $3), at or before a bound ($4, $5), in the one fixed order. The ORDER BY names the
/// table's columns (`e.`), not the text-cast output column of the same name, so the
/// (tx_id, global_position) index serves it; ordering by the alias made every pass sort the
/// whole log. The payload is read as its stored JSON text and decoded once in Rust. A macro so
/// the page's statement is one constant text with its LIMIT.
macro_rules! select_events {
    () => {
        "SELECT e.tx_id::text::bigint AS tx_id, e.global_position,
        e.aggregate_type, e.aggregate_id, e.sequence, e.event_version,
        e.payload::text AS payload
     FROM events e
     WHERE e.tx_id < $1::text::xid8
       AND (e.tx_id, e.global_position) > ($2::text::xid8, $3)
       AND (e.tx_id, e.global_position) <= ($4::text::xid8, $5)
     ORDER BY e.tx_id, e.global_position"
    };
}

/// [`select_events`] as text, for the COPY form.
const SELECT_EVENTS: &str = select_events!();

/// A page: [`SELECT_EVENTS`] with at most $6 rows.
const SELECT_EVENTS_PAGE: &str = concat!(select_events!(), " LIMIT $6");

/// One row as the event query returns it, in its columns' order (the COPY form's fields come
/// in this order too).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct EventRow {
    pub tx_id: i64,
    pub global_position: i64,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub sequence: i64,
    pub event_version: String,
    /// The stored JSON text.
    pub payload: String,
}

/// Where a read of the log stands: below the commit watermark (a transaction id), after
/// `from` and at or before `upto`, each a (tx_id, global_position) pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub watermark: i64,
    pub from: (i64, i64),
    pub upto: (i64, i64),
}

/// Up to `limit` events within `bounds`, in commit order, on the caller's connection (the
/// projector's pass transaction).
pub async fn events_page(
    conn: &mut PgConnection,
    bounds: Bounds,
    limit: i64,
) -> Result<Vec<EventRow>, sqlx::Error> {
    sqlx::query_as(SELECT_EVENTS_PAGE)
        .bind(bounds.watermark.to_string())
        .bind(bounds.from.0.to_string())
        .bind(bounds.from.1)
        .bind(bounds.upto.0.to_string())
        .bind(bounds.upto.1)
        .bind(limit)
        .fetch_all(conn)
        .await
}

/// The statement that streams every event within `bounds` with `COPY ... TO STDOUT`, in
/// COPY's text format, fields in [`EventRow`]'s order: [`SELECT_EVENTS`] with the bounds
/// inlined (COPY takes no parameters, and they are integers). An error names a parameter left
/// in the text that this substitution does not know.
pub fn copy_events(bounds: Bounds) -> Result<String, String> {
    let query = SELECT_EVENTS
        .replace("$1::text::xid8", &format!("'{}'::xid8", bounds.watermark))
        .replace("$2::text::xid8", &format!("'{}'::xid8", bounds.from.0))
        .replace("$3", &bounds.from.1.to_string())
        .replace("$4::text::xid8", &format!("'{}'::xid8", bounds.upto.0))
        .replace("$5", &bounds.upto.1.to_string());
    if query.contains('$') {
        return Err(format!("a parameter is left in the COPY query: {query}"));
    }
    Ok(format!("COPY ({query}) TO STDOUT"))
}

/// How many events the log holds.
pub async fn count(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM events")
        .fetch_one(pool)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_statement_inlines_every_bound() {
        let q = copy_events(Bounds {
            watermark: 9,
            from: (3, 4),
            upto: (7, 8),
        })
        .unwrap();
        assert!(q.starts_with("COPY (SELECT e.tx_id::text::bigint"));
        assert!(q.contains("e.tx_id < '9'::xid8"));
        assert!(q.contains("> ('3'::xid8, 4)"));
        assert!(q.contains("<= ('7'::xid8, 8)"));
        assert!(!q.contains('$'));
    }

    #[test]
    fn the_page_is_the_select_with_its_limit() {
        assert_eq!(SELECT_EVENTS_PAGE, format!("{SELECT_EVENTS} LIMIT $6"));
    }
}
