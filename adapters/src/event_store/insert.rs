//! The group commit's write of a batch's events: every commit's events as the columns of
//! `eventlog::append`'s one statement, with the claim guard of its creations. Both the
//! one-statement append (`event_store.rs`) and the explicit transaction of creations with
//! their claims and charges (`together.rs`) write their events through it.

use cqrs_es::persist::SerializedEvent;
use serde_json::Value;
use sqlx::PgConnection;

use eventlog::append::{append, Columns};

use super::traces;

/// One commit as the appender writes it, with its job's first trace if any.
pub(super) type Pending<'a> = (&'static str, &'a [SerializedEvent], Option<&'a str>);

/// One multi-row INSERT for every event of every job (`eventlog::append`), as one statement in
/// its own implicit transaction: atomic, and durable when it returns (the server answers after
/// the commit is flushed), in one round trip instead of three (BEGIN, INSERT, COMMIT).
///
/// The same statement takes the events' feed positions (migrations 0013 and 0015): `feed_take()`
/// holds the feed's advisory lock until the commit and reads the last position handed out, so the
/// next append anywhere takes the positions after these only once they are visible, or after they
/// were given back by a rollback. No row is updated for it, so an old snapshot held elsewhere
/// costs the append nothing (an updated counter row would keep a version per append). Each
/// event also carries its owner (the commit's `user_id` metadata) and its domain time, which the
/// feed serves.
pub(super) async fn insert(
    conn: &mut PgConnection,
    commits: &[Pending<'_>],
) -> Result<(), sqlx::Error> {
    let n: usize = commits.iter().map(|(_, events, _)| events.len()).sum();
    let mut types = Vec::with_capacity(n);
    let mut ids = Vec::with_capacity(n);
    let mut seqs = Vec::with_capacity(n);
    let mut event_types = Vec::with_capacity(n);
    let mut versions = Vec::with_capacity(n);
    let mut payloads = Vec::with_capacity(n);
    let mut metadata = Vec::with_capacity(n);
    let mut owners = Vec::with_capacity(n);
    let mut times = Vec::with_capacity(n);
    // A traced creation's metadata with its first trace added (`traces.rs`), made before the
    // references below are taken.
    let traced = traces::traced_metadata(commits);
    for (aggregate_type, events, _) in commits {
        for e in *events {
            types.push(*aggregate_type);
            ids.push(e.aggregate_id.as_str());
            seqs.push(i64::try_from(e.sequence).unwrap_or(i64::MAX));
            event_types.push(e.event_type.as_str());
            versions.push(e.event_version.as_str());
            payloads.push(&e.payload);
            metadata.push(
                traced
                    .get(&(e.aggregate_id.as_str(), e.sequence))
                    .unwrap_or(&e.metadata),
            );
            owners.push(eventlog::owner(&e.metadata));
            times.push(eventlog::occurred_at(&e.payload));
        }
    }
    let guards = ClaimGuards::of(commits);
    append(
        conn,
        &Columns {
            aggregate_types: &types,
            aggregate_ids: &ids,
            sequences: &seqs,
            event_types: &event_types,
            event_versions: &versions,
            payloads: &payloads,
            metadata: &metadata,
            owners: &owners,
            occurred_at: &times,
            claim_users: &guards.users,
            claim_cids: &guards.cids,
            claim_req_ids: &guards.req_ids,
        },
    )
    .await
}

/// The client-key claims the creations in a batch were made under: each must still name its
/// transfer when the batch commits (`cid_claims_hold`, migration 0020), or the batch is refused
/// with `CLAIM_MOVED` and retried commit by commit, so only the creation whose claim was re-keyed
/// is refused. A creation is the first event (sequence 1) of a `TransferCreated` with a `cid`.
#[derive(Default)]
struct ClaimGuards<'a> {
    users: Vec<i64>,
    cids: Vec<&'a str>,
    req_ids: Vec<&'a str>,
}

impl<'a> ClaimGuards<'a> {
    fn of(commits: &[Pending<'a>]) -> Self {
        let mut guards = Self::default();
        for e in commits.iter().flat_map(|(_, events, _)| events.iter()) {
            if e.sequence != 1 || e.event_type != "TransferCreated" {
                continue;
            }
            let Some(fields) = e.payload.get("TransferCreated") else {
                continue;
            };
            let (Some(user), Some(cid)) = (
                fields.get("user_id").and_then(Value::as_i64),
                fields.get("cid").and_then(Value::as_str),
            ) else {
                continue;
            };
            guards.users.push(user);
            guards.cids.push(cid);
            guards.req_ids.push(e.aggregate_id.as_str());
        }
        guards
    }
}
