//! The event store's append statement (see `insert` in `event_store.rs` for what it does): as it
//! always was, and with the step that keeps the first traces of traced creations
//! (`traces.rs`, `docs/adr/0018-traces.md`). One text for both, so they never drift apart.

/// The events' INSERT, after the claim guard and the feed head; `$traced` adds a step to the
/// same statement (the first traces, `traces.rs`).
macro_rules! insert_events {
    ($traced:literal) => {
        concat!(
            "WITH guard AS MATERIALIZED (SELECT cid_claims_hold($10::bigint[], $11::text[],
                                                      $12::text[]) AS held),
                  head AS MATERIALIZED (SELECT feed_take() AS before FROM guard)",
            $traced,
            "
             INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version,
                                 payload, metadata, user_id, occurred_at, feed_position)
             SELECT u.t, u.id, u.seq, u.et, u.v, u.p, u.m, u.owner, COALESCE(u.at, now()),
                    head.before + u.n
             FROM head,
                  UNNEST($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::json[],
                         $7::json[], $8::bigint[], $9::timestamptz[])
                      WITH ORDINALITY AS u(t, id, seq, et, v, p, m, owner, at, n)"
        )
    };
}

/// The append of a batch with no first trace to keep: the statement as it always was.
pub(super) const INSERT_EVENTS: &str = insert_events!("");

/// The append of a batch that creates traced transfers: their first traces are written by the
/// same statement, so they exist exactly when the creations do.
pub(super) const INSERT_EVENTS_TRACED: &str = insert_events!(
    ",
              traced AS (INSERT INTO transfer_traces (req_id, traceparent)
                         SELECT * FROM UNNEST($13::text[], $14::text[])
                         ON CONFLICT (req_id) DO NOTHING)"
);
