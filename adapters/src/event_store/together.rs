//! Creations written together with their client keys' claims and their daily charges (ADR 0022):
//! one transaction on the appender's connection claims the keys (`transfer_cids`), locks,
//! decides and writes the daily counters (`limits::reserve_in`, the product's one rule), takes
//! back the claims of creations a limit refused, and appends the events of the rest with the
//! batch's other commits. A creation is then all or nothing with its claim and its charge, and
//! a request with a cid and limits on waits for one durable commit instead of three.
//!
//! Locks are taken in one order by every writer: claims in key order, then counters in user
//! (and asset) order, then the feed's advisory lock in the INSERT. The separate steps' writers
//! (`PgClientKeys::claim_many`, `limits::reserve_many`) each take only one kind, in the same
//! order, so no two transactions ever wait on each other in a circle.

use std::sync::Arc;

use application::daily::{Charge, DailyLimits};
use application::ports::CidClaim;
use chrono::NaiveDate;
use domain::ErrorCode;
use sqlx::{Connection, PgConnection};

use super::insert::{insert, Pending};
use crate::pg::claims::{claim_in, unclaim_in};
use crate::pg::limits::reserve_in;

/// What a job's creations write with them: one entry per commit of the job.
#[derive(Debug)]
pub struct Extras {
    pub claims: Vec<Option<CidClaim>>,
    pub charges: Vec<Option<Charge>>,
    pub limits: Arc<DailyLimits>,
    pub day: NaiveDate,
}

/// What one commit of a job came to, when its transaction committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Appended,
    /// Its key was claimed already: nothing of it was written.
    KeyTaken,
    /// A daily limit refused its charge: nothing of it was written.
    Refused(ErrorCode),
}

/// One commit of a batch with what it writes beside its events.
pub(super) struct Item<'a> {
    pub(super) pending: Pending<'a>,
    pub(super) claim: Option<&'a CidClaim>,
    /// The charge, under its job's limits, on its day.
    pub(super) charge: Option<(&'a Charge, &'a DailyLimits, NaiveDate)>,
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
    // The charges of the items still standing, in order, one reservation per (limits, day).
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
        let answers = reserve_in(&mut tx, limits, &charges, day).await?;
        for (&i, answer) in members.iter().zip(answers) {
            if let Err(code) = answer {
                written[i] = Written::Refused(code);
                unclaim.extend(items[i].claim);
            }
        }
    }
    unclaim_in(&mut tx, &unclaim).await?;
    let appended: Vec<Pending<'_>> = items
        .iter()
        .zip(&written)
        .filter(|(_, w)| **w == Written::Appended)
        .map(|(item, _)| item.pending)
        .collect();
    if !appended.is_empty() {
        insert(&mut tx, &appended).await?;
    }
    tx.commit().await?;
    Ok(written)
}
