//! Creations written together with their client keys' claims and their daily charges (ADR 0022):
//! one transaction on the appender's connection claims the keys (`transfer_cids`), locks,
//! decides and writes the daily counters (`limits::reserve_in`, the product's one rule), takes
//! back the claims of creations a limit refused, and appends the events of the rest with the
//! batch's other commits. A creation is then all or nothing with its claim and its charge, and
//! a request with a cid and limits on waits for one durable commit instead of three.
//!
//! The same transaction makes the FUNDING movement a commit announces, when it carries one
//! (ADR 0024, `Call`): after the claims and counters, FUNDING's own function decides and applies
//! it (`funding::together`), and the events recording its decision follow the commit's own in
//! the INSERT. The movement and its events are then durable together or not at all.
//!
//! Locks are taken in one order by every writer: claims in key order, then counters in user
//! (and asset) order, then FUNDING's accounts in (user, asset) order, then the feed's advisory
//! lock in the INSERT. The separate steps' writers
//! (`PgClientKeys::claim_many`, `limits::reserve_many`) each take only one kind, in the same
//! order, so no two transactions ever wait on each other in a circle.

use std::sync::Arc;

use application::daily::{Charge, DailyLimits};
use application::ports::{CidClaim, FundingDecision};
use chrono::NaiveDate;
use cqrs_es::persist::SerializedEvent;
use domain::{ErrorCode, Movement, Operation};
use sqlx::{Connection, PgConnection};

use super::insert::{insert, Pending};
use crate::funding::together::decide_in;
use crate::pg::claims::{claim_in, unclaim_in};
use crate::pg::limits::reserve_in;

/// What a job's creations write with them: one entry per commit of the job (`calls` may be
/// empty: no commit carries a FUNDING call).
#[derive(Debug)]
pub struct Extras {
    pub claims: Vec<Option<CidClaim>>,
    pub charges: Vec<Option<Charge>>,
    pub limits: Arc<DailyLimits>,
    pub day: NaiveDate,
    pub calls: Vec<Option<Call>>,
}

/// The events recording FUNDING's decision, after a commit's own (serialized, at the
/// sequences after them).
pub type Record =
    Arc<dyn Fn(&FundingDecision) -> Result<Vec<SerializedEvent>, String> + Send + Sync>;

/// The FUNDING movement a commit announces, made in its transaction (ADR 0024).
#[derive(Clone)]
pub struct Call {
    pub op: Operation,
    pub movement: Movement,
    pub record: Record,
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call")
            .field("op", &self.op)
            .field("movement", &self.movement)
            .finish_non_exhaustive()
    }
}

/// What one commit of a job came to, when its transaction committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// Its events (and, with a call, only the announcement: the movement was not fresh).
    Appended,
    /// Its key was claimed already: nothing of it was written.
    KeyTaken,
    /// A daily limit refused its charge: nothing of it was written.
    Refused(ErrorCode),
    /// Its events, its FUNDING movement decided so, and that decision's events after them.
    Funded(FundingDecision),
}

/// One commit of a batch with what it writes beside its events.
pub(super) struct Item<'a> {
    pub(super) pending: Pending<'a>,
    pub(super) claim: Option<&'a CidClaim>,
    /// The charge, under its job's limits, on its day.
    pub(super) charge: Option<(&'a Charge, &'a DailyLimits, NaiveDate)>,
    pub(super) call: Option<&'a Call>,
}

/// Writes `items` in one transaction on `conn`: what each came to, or the error that rolled
/// the whole transaction back (nothing of any item written).
pub(super) async fn write(
    conn: &mut PgConnection,
    items: &[Item<'_>],
) -> Result<Vec<Written>, sqlx::Error> {
    let mut written = vec![Written::Appended; items.len()];
    let mut tx = conn.begin().await?;
    // The claims, all in one statement.
    let (at, claims): (Vec<usize>, Vec<CidClaim>) = items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| Some((i, item.claim?.clone())))
        .unzip();
    let claimed = claim_in(&mut tx, &claims).await?;
    for (&i, claimed) in at.iter().zip(claimed) {
        if !claimed {
            written[i] = Written::KeyTaken;
        }
    }
    let unclaim = charge(&mut tx, items, &mut written).await?;
    unclaim_in(&mut tx, &unclaim).await?;
    let recorded = fund(&mut tx, items, &mut written).await?;
    let whole: Vec<Option<Vec<SerializedEvent>>> = items
        .iter()
        .zip(&recorded)
        .map(|(item, recorded)| {
            let recorded = recorded.as_ref()?;
            Some(item.pending.1.iter().chain(recorded).cloned().collect())
        })
        .collect();
    let appended: Vec<Pending<'_>> = items
        .iter()
        .zip(&written)
        .zip(&whole)
        .filter(|((_, w), _)| matches!(w, Written::Appended | Written::Funded(_)))
        .map(|((item, _), whole)| match whole {
            Some(events) => (item.pending.0, events.as_slice(), item.pending.2),
            None => item.pending,
        })
        .collect();
    if !appended.is_empty() {
        insert(&mut tx, &appended).await?;
    }
    tx.commit().await?;
    Ok(written)
}

/// The FUNDING movements of the items still standing (`Written::Appended`), after the claims
/// and counters and before the feed's lock (the INSERT), in one call on `conn`: each decided
/// one marked `Funded`, with the events recording its decision (to follow its own).
async fn fund(
    conn: &mut PgConnection,
    items: &[Item<'_>],
    written: &mut [Written],
) -> Result<Vec<Option<Vec<SerializedEvent>>>, sqlx::Error> {
    let (at, calls): (Vec<usize>, Vec<(Operation, &Movement)>) = items
        .iter()
        .enumerate()
        .filter(|(i, _)| written[*i] == Written::Appended)
        .filter_map(|(i, item)| Some((i, item.call.map(|c| (c.op, &c.movement))?)))
        .unzip();
    let mut recorded: Vec<Option<Vec<SerializedEvent>>> = items.iter().map(|_| None).collect();
    if calls.is_empty() {
        return Ok(recorded);
    }
    let decided = decide_in(conn, &calls).await?;
    for (&i, decision) in at.iter().zip(decided) {
        let (Some(decision), Some(call)) = (decision, items[i].call) else {
            continue;
        };
        let events = (call.record)(&decision).map_err(sqlx::Error::Protocol)?;
        recorded[i] = Some(events);
        written[i] = Written::Funded(decision);
    }
    Ok(recorded)
}

/// The charges of the items still standing, in order, one reservation per (limits, day): each
/// refused one marked `Refused`; the claims to take back (the refused items').
async fn charge<'a>(
    conn: &mut PgConnection,
    items: &[Item<'a>],
    written: &mut [Written],
) -> Result<Vec<&'a CidClaim>, sqlx::Error> {
    let mut groups: Vec<((&DailyLimits, NaiveDate), Vec<usize>)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let Some((_, limits, day)) = item.charge else {
            continue;
        };
        if written[i] != Written::Appended {
            continue;
        }
        match groups
            .iter_mut()
            .find(|((l, d), _)| *l == limits && *d == day)
        {
            Some((_, members)) => members.push(i),
            None => groups.push(((limits, day), vec![i])),
        }
    }
    let mut unclaim = Vec::new();
    for ((limits, day), members) in groups {
        let charges: Vec<Charge> = members
            .iter()
            .filter_map(|&i| Some(items[i].charge?.0.clone()))
            .collect();
        let answers = reserve_in(conn, limits, &charges, day).await?;
        for (&i, answer) in members.iter().zip(answers) {
            if let Err(code) = answer {
                written[i] = Written::Refused(code);
                unclaim.extend(items[i].claim);
            }
        }
    }
    Ok(unclaim)
}
