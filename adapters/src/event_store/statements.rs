//! The event store's append statement (see `insert` in `event_store.rs` for what it does).

/// The events' INSERT, after the claim guard and the feed head.
pub(super) const INSERT_EVENTS: &str =
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
