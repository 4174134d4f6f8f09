//! The funding ledger in memory (`SimFunding`): the testkit's books, decisions and journal
//! answers (`application::testkit::account`, the rules of `funding_fresh_movements`), behind the
//! network's faults on each message.

use std::time::Duration;

use application::books::{
    AccountStatus, DepositReceipt, FundingBalance, FundingBook, FundingError, FundingItem,
    FundingRead, JournalEntry,
};
use application::testkit::{account, books};
use application::StoreError;
use async_trait::async_trait;
use domain::{
    AccountPort, AccountType, AdapterOutcome, Amount, AssetSymbol, Movement, Operation, Recorded,
    ReqId, UserId,
};
use rust_decimal::Decimal;

use crate::exec::Role;
use crate::world::{short, System, World};

use super::{Fate, Sim, NETWORK};

/// The funding ledger in memory (the world's `funding` books), with the decisions of
/// `funding_fresh_movements` (migration 0014) and the journal answers of `adapters::funding`:
/// idempotent by (req_id, operation), a refusal recorded for good, `cancel` claiming an
/// undecided key with `CANCELLED`.
#[derive(Debug, Clone)]
pub struct SimFunding {
    pub sim: Sim,
}

/// Decides and applies one movement arriving at the funding ledger, by the testkit's rules
/// (`application::testkit::account::decide`), with the arrival checks: its announcement is
/// durable, a fresh movement is applied at most once, a refund is never refused.
pub fn funding_apply(w: &mut World, op: Operation, m: &Movement) -> AdapterOutcome {
    w.check_arrival(System::Funding, &m.req_id.to_string(), op);
    funding_decide(w, op, m)
}

/// `funding_apply` without the arrival check: the caller made it (a movement decided in the
/// log's own write, ADR 0024, checks its announcement in the rows it holds).
pub fn funding_decide(w: &mut World, op: Operation, m: &Movement) -> AdapterOutcome {
    let id = m.req_id.to_string();
    let before = account::record(&w.funding, op, m);
    if before == Recorded::Applied
        && op == Operation::Refund
        && application::plant::active(application::plant::Bug::RefundNotIdempotent)
    {
        // Planted: a repeated refund is applied again.
        if let Some(a) = w.funding.accounts.get_mut(&(m.user_id, m.asset.clone())) {
            a.balance += m.amount.value();
        }
        w.count_applied(System::Funding, &id, op);
    }
    let outcome = account::decide(&mut w.funding, AccountType::Funding, op, m, None);
    if before != Recorded::NotSeen {
        return outcome;
    }
    match &outcome {
        AdapterOutcome::Success => {
            w.count_applied(System::Funding, &id, op);
            w.note(|| format!("funding applied {} of {}", op.as_str(), short(&id)));
        }
        AdapterOutcome::ExplicitFail { code, .. } => {
            if op == Operation::Refund {
                // Refused only without an applied withdraw of the same details: the protocol
                // asked for money back that it never took.
                w.violation(format!("funding refused the refund of {id}: {code}"));
            }
            w.note(|| format!("funding refused {} of {}: {code}", op.as_str(), short(&id)));
        }
        _ => {}
    }
    outcome
}

impl SimFunding {
    async fn movement(&self, op: Operation, m: &Movement) -> AdapterOutcome {
        let id = m.req_id.to_string();
        let name = format!("funding.{}", op.as_str());
        self.sim.world().track_call(System::Funding, &id, op);
        let fate = self.sim.fate(&name).await;
        match fate {
            Fate::Unsent => return AdapterOutcome::NetworkError("sim: connection refused".into()),
            Fate::Late => {
                if let Some(ms) = self.sim.late_delivery() {
                    self.deliver_later(op, m, ms);
                }
                return AdapterOutcome::Timeout;
            }
            Fate::AnswerLost | Fate::Delivered => {}
        }
        let outcome = funding_apply(&mut self.sim.world(), op, m);
        if let Some(ms) = self.sim.maybe_duplicate(&name) {
            self.deliver_later(op, m, ms);
        }
        if fate == Fate::AnswerLost {
            return AdapterOutcome::Unknown("sim: the answer was lost".into());
        }
        self.sim
            .world()
            .note(|| format!("funding {} {} -> {outcome:?}", op.as_str(), short(&id)));
        outcome
    }

    fn deliver_later(&self, op: Operation, m: &Movement, ms: u64) {
        let sim = self.sim.clone();
        let m = m.clone();
        self.sim.rt.spawn(NETWORK, Role::Network, async move {
            sim.rt.sleep(Duration::from_millis(ms)).await;
            let mut w = sim.world();
            w.note(|| {
                format!(
                    "late copy of funding {} {} arrives",
                    op.as_str(),
                    short(&m.req_id.to_string())
                )
            });
            funding_apply(&mut w, op, &m);
        });
    }

    async fn read(&self, op: Operation, m: &Movement, cancel: bool) -> Recorded {
        let id = m.req_id.to_string();
        self.sim.world().track_lookup(System::Funding, &id, op);
        let name = if cancel {
            "funding.cancel"
        } else {
            "funding.lookup"
        };
        match self.sim.fate(name).await {
            Fate::Unsent => return Recorded::Unavailable("sim: no answer".into()),
            Fate::Late => {
                // A cancel that timed out may still commit later.
                if let Some(ms) = self.sim.late_delivery().filter(|_| cancel) {
                    let (sim, m) = (self.sim.clone(), m.clone());
                    self.sim.rt.spawn(NETWORK, Role::Network, async move {
                        sim.rt.sleep(Duration::from_millis(ms)).await;
                        let mut w = sim.world();
                        w.note(|| {
                            format!(
                                "late copy of funding cancel {} arrives",
                                short(&m.req_id.to_string())
                            )
                        });
                        account::cancel(&mut w.funding, op, &m);
                    });
                }
                return Recorded::Unavailable("sim: no answer".into());
            }
            Fate::AnswerLost => {
                if cancel {
                    account::cancel(&mut self.sim.world().funding, op, m);
                }
                return Recorded::Unavailable("sim: the answer was lost".into());
            }
            Fate::Delivered => {}
        }
        let mut w = self.sim.world();
        if cancel {
            account::cancel(&mut w.funding, op, m);
        }
        let recorded = account::record(&w.funding, op, m);
        w.note(|| format!("{name} {} {} -> {recorded:?}", op.as_str(), short(&id)));
        recorded
    }
}

#[async_trait]
impl AccountPort for SimFunding {
    fn account_type(&self) -> AccountType {
        AccountType::Funding
    }

    async fn withdraw(&self, m: &Movement) -> AdapterOutcome {
        self.movement(Operation::Withdraw, m).await
    }

    async fn deposit(&self, m: &Movement) -> AdapterOutcome {
        self.movement(Operation::Deposit, m).await
    }

    async fn refund(&self, m: &Movement) -> AdapterOutcome {
        self.movement(Operation::Refund, m).await
    }

    async fn lookup(&self, m: &Movement, operation: Operation) -> Recorded {
        self.read(operation, m, false).await
    }

    async fn cancel(&self, m: &Movement, operation: Operation) -> Recorded {
        self.read(operation, m, true).await
    }
}

/// The funding ledger's books as the conservation check reads them: one consistent read of the
/// world's books (a snapshot: nothing else runs while the world is locked), by the testkit's
/// own read (`application::testkit::books::funding_read`). The calls the simulation's processes
/// never make answer that they are not simulated.
#[async_trait]
impl FundingBook for SimFunding {
    async fn balances(&self, user: UserId) -> Result<Vec<FundingBalance>, FundingError> {
        Ok(books::funding_balances(&self.sim.world().funding, user))
    }

    async fn balance(
        &self,
        user: UserId,
        asset: &AssetSymbol,
    ) -> Result<Option<Decimal>, FundingError> {
        let w = self.sim.world();
        Ok(w.funding
            .accounts
            .get(&(user, asset.clone()))
            .map(|a| a.balance))
    }

    async fn account_exists(
        &self,
        user: UserId,
        asset: &AssetSymbol,
    ) -> Result<bool, FundingError> {
        Ok(FundingBook::balance(self, user, asset).await?.is_some())
    }

    async fn journal_for(&self, _req_id: &ReqId) -> Result<Vec<JournalEntry>, FundingError> {
        Err(not_simulated("journal_for"))
    }

    async fn external_deposit(
        &self,
        _external_id: &str,
        _user: UserId,
        _asset: &AssetSymbol,
        _amount: Amount,
    ) -> Result<DepositReceipt, FundingError> {
        Err(not_simulated("external_deposit"))
    }

    async fn set_status(
        &self,
        _user: UserId,
        _asset: &AssetSymbol,
        _status: AccountStatus,
    ) -> Result<(), FundingError> {
        Err(not_simulated("set_status"))
    }

    async fn audit_read(
        &self,
        since: u64,
        sink: &mut (dyn FnMut(FundingItem) + Send),
    ) -> Result<FundingRead, FundingError> {
        let w = self.sim.world();
        Ok(books::funding_read(&w.funding, since, sink))
    }
}

fn not_simulated(call: &str) -> FundingError {
    FundingError::Store(StoreError::msg(format!("sim: {call} is not simulated")))
}
