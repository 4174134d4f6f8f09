//! The group commit's one append statement: every event of a batch of commits in one multi-row
//! INSERT, after the client-key claim guard and the feed head (what each part is for is said at
//! `adapters::event_store`'s `insert`, which gathers the columns).

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;

/// The events' INSERT, after the claim guard and the feed head.
const INSERT_EVENTS: &str =
    "WITH guard AS MATERIALIZED (SELECT cid_claims_hold($10::bigint[], $11::text[],
                                                  $12::text[]) AS held),
          head AS MATERIALIZED (SELECT feed_take() AS before FROM guard)
     INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version,
                         payload, metadata, user_id, occurred_at, feed_position)
     SELECT u.t, u.id, u.seq, u.et, u.v, u.p, u.m, u.owner, COALESCE(u.at, now()),
            head.before + u.n
     FROM head,
          UNNEST($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::json[],
                 $7::json[], $8::bigint[], $9::timestamptz[])
              WITH ORDINALITY AS u(t, id, seq, et, v, p, m, owner, at, n)";

/// One batch's events as columns (every slice one entry per event, in append order; the
/// feed positions follow that order), and the client-key claims its creations were made under
/// (one entry per creation with a client key).
#[derive(Debug)]
pub struct Columns<'a> {
    pub aggregate_types: &'a [&'a str],
    pub aggregate_ids: &'a [&'a str],
    pub sequences: &'a [i64],
    pub event_types: &'a [&'a str],
    pub event_versions: &'a [&'a str],
    pub payloads: &'a [&'a Value],
    pub metadata: &'a [&'a Value],
    /// [`crate::owner`] of each event's metadata.
    pub owners: &'a [Option<i64>],
    /// [`crate::occurred_at`] of each event's payload.
    pub occurred_at: &'a [Option<DateTime<Utc>>],
    pub claim_users: &'a [i64],
    pub claim_cids: &'a [&'a str],
    pub claim_req_ids: &'a [&'a str],
}

/// Appends one batch as one statement in its own implicit transaction: atomic, and durable
/// when it returns, in one round trip. Refused whole when a sequence is taken or a claim moved
/// ([`is_conflict`]).
pub async fn append(conn: &mut PgConnection, c: &Columns<'_>) -> Result<(), sqlx::Error> {
    sqlx::query(INSERT_EVENTS)
        .bind(c.aggregate_types)
        .bind(c.aggregate_ids)
        .bind(c.sequences)
        .bind(c.event_types)
        .bind(c.event_versions)
        .bind(c.payloads)
        .bind(c.metadata)
        .bind(c.owners)
        .bind(c.occurred_at)
        .bind(c.claim_users)
        .bind(c.claim_cids)
        .bind(c.claim_req_ids)
        .execute(conn)
        .await?;
    Ok(())
}

/// The SQLSTATE `cid_claims_hold` raises when a creation's client-key claim was re-keyed.
const CLAIM_MOVED: &str = "LC001";

/// An append refused for what it wrote (a sequence already taken, or a creation whose
/// client-key claim moved): nothing of it was applied, and the rest of its batch can be retried
/// alone.
pub fn is_conflict(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == "23505" || c == CLAIM_MOVED)
}

/// The SQLSTATE the partition fence raises (migration 0029): the statement wrote for a user of
/// a partition this cell does not own or has frozen for a move, and nothing of it was applied.
const FENCED: &str = "LC002";

/// Whether `e` is the partition fence's refusal.
pub fn is_fenced(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == FENCED)
}

/// Whether a batch's statement was refused for what one of its commits wrote ([`is_conflict`],
/// or the fence): nothing was applied, the connection stays usable, and the batch's commits are
/// tried alone so that one refusal does not fail the others.
pub fn refused_alone(e: &sqlx::Error) -> bool {
    is_conflict(e) || is_fenced(e)
}
