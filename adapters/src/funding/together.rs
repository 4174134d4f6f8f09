//! FUNDING's movements decided inside another writer's transaction (ADR 0024): the event
//! appender's, so that a movement, its announcement and the events recording its decision are
//! durable together or not at all. The same database function decides them
//! (`funding_fresh_movements`: the account locked, status, balance and overflow checked, the
//! journal's `(req_id, operation)` key claimed, the balance changed only when applied), in one
//! lock order (by account, as the group commit sorts them); the asset check of `with_assets`
//! is asked first (`FundingLedger::decides_here`).

use application::ports::FundingDecision;
use domain::{Movement, Operation};
use sqlx::PgConnection;

use super::{batch, refusal, FundingLedger};
use domain::AdapterOutcome;

impl FundingLedger {
    /// Whether this movement may be decided in another writer's transaction: a refund always
    /// (it is bound to an applied withdraw, never refused for an asset setting), a withdraw or
    /// a deposit when the asset check passes. One that fails it is left to the adapter's own
    /// call, which refuses and records it (`movement_general`).
    pub(crate) fn decides_here(&self, op: Operation, m: &Movement) -> bool {
        op == Operation::Refund || self.invalid(m).is_none()
    }
}

/// Decides `movements` on `conn` (inside the caller's transaction), answering in their order:
/// FUNDING's decision of each fresh one, `None` for one whose key was claimed before (nothing
/// changed; the caller leaves its call to the separate steps). An applied movement that moved
/// no single account is an error: the caller's transaction must not commit.
pub(crate) async fn decide_in(
    conn: &mut PgConnection,
    movements: &[(Operation, &Movement)],
) -> Result<Vec<Option<FundingDecision>>, sqlx::Error> {
    // One lock order for every writer of the accounts: by (user, asset).
    let mut order: Vec<usize> = (0..movements.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (movements[a].1, movements[b].1);
        (a.user_id.as_i64(), a.asset.as_str()).cmp(&(b.user_id.as_i64(), b.asset.as_str()))
    });
    let sorted: Vec<(Operation, &Movement)> = order.iter().map(|&i| movements[i]).collect();
    let decided = batch::decide_in(conn, &sorted).await?;
    let mut answers: Vec<Option<FundingDecision>> = movements.iter().map(|_| None).collect();
    for (&i, decided) in order.iter().zip(decided) {
        let Some(d) = decided else { continue };
        answers[i] = Some(match d.outcome.as_str() {
            "APPLIED" if d.moved == 1 => FundingDecision::Applied,
            "APPLIED" => {
                return Err(sqlx::Error::Protocol(format!(
                    "applied funding movement {} touched {} accounts",
                    movements[i].1.req_id, d.moved
                )))
            }
            _ => match refusal(d.code.unwrap_or_else(|| "REFUSED".into())) {
                AdapterOutcome::ExplicitFail { code, message } => {
                    FundingDecision::Refused { code, message }
                }
                other => {
                    return Err(sqlx::Error::Protocol(format!(
                        "unexpected funding refusal {other:?}"
                    )))
                }
            },
        });
    }
    Ok(answers)
}
