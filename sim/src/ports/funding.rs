//! The funding ledger in memory (`SimFunding`): the decisions of `funding_fresh_movements`
//! and the journal's answers, with the network's faults on each message.

use std::time::Duration;

use async_trait::async_trait;
use domain::{AccountPort, AccountType, AdapterOutcome, Movement, Operation, Recorded};

use crate::exec::Role;
use crate::world::{short, JournalRow, System, World};

use super::{Fate, Sim, NETWORK};

/// The funding ledger in memory, with the decisions of `funding_fresh_movements` (migration
/// 0014) and the journal answers of `adapters::funding`: idempotent by (req_id, operation), a
/// refusal recorded for good, `cancel` claiming an undecided key with `CANCELLED`.
#[derive(Debug, Clone)]
pub struct SimFunding {
    pub sim: Sim,
}

/// Decides and applies one movement arriving at the funding ledger.
// long: the funding ledger's decision table (migration 0014's rules), whole to read against the SQL.
pub fn funding_apply(w: &mut World, op: Operation, m: &Movement) -> AdapterOutcome {
    let id = m.req_id.to_string();
    let asset = m.asset.to_string();
    let user = m.user_id.get();
    let amount = m.amount.value();
    w.check_arrival(System::Funding, &id, op);
    if let Some(row) = w.journal.get(&(id.clone(), op)).cloned() {
        if row.user != user || row.asset != asset || row.amount != amount {
            return AdapterOutcome::Mismatch(format!("req_id {id} recorded for another movement"));
        }
        if row.applied {
            if op == Operation::Refund
                && application::plant::active(application::plant::Bug::RefundNotIdempotent)
            {
                // Planted: a repeated refund is applied again.
                if let Some(a) = w.funding.get_mut(&(user, asset.clone())) {
                    a.balance += amount;
                }
                w.count_applied(System::Funding, &id, op);
            }
            return AdapterOutcome::Success;
        }
        let code = row.code.unwrap_or_else(|| "REFUSED".to_owned());
        return AdapterOutcome::ExplicitFail {
            message: format!("refused: {code}"),
            code,
        };
    }
    let account = w.funding.get(&(user, asset.clone())).cloned();
    let decided: Option<&str> = match op {
        Operation::Withdraw => match &account {
            None => Some("SOURCE_ACCOUNT_NOT_FOUND"),
            Some(a) if a.status == "FROZEN" => Some("ACCOUNT_FROZEN"),
            Some(a) if a.status == "DISABLED" => Some("ACCOUNT_DISABLED"),
            Some(a) if a.balance < amount => Some("INSUFFICIENT_BALANCE"),
            Some(_) => None,
        },
        Operation::Deposit => match &account {
            None => Some("TARGET_ACCOUNT_NOT_FOUND"),
            Some(a) if a.status == "DISABLED" => Some("ACCOUNT_DISABLED"),
            Some(_) => None,
        },
        Operation::Refund => {
            let matching = w
                .journal
                .get(&(id.clone(), Operation::Withdraw))
                .is_some_and(|r| {
                    r.applied && r.user == user && r.asset == asset && r.amount == amount
                });
            (account.is_none() || !matching).then_some("NO_MATCHING_WITHDRAW")
        }
    };
    w.journal.insert(
        (id.clone(), op),
        JournalRow {
            user,
            asset: asset.clone(),
            amount,
            applied: decided.is_none(),
            code: decided.map(str::to_owned),
        },
    );
    match decided {
        None => {
            if let Some(a) = w.funding.get_mut(&(user, asset)) {
                if op == Operation::Withdraw {
                    a.balance -= amount;
                } else {
                    a.balance += amount;
                }
            }
            w.count_applied(System::Funding, &id, op);
            w.note(|| format!("funding applied {} of {}", op.as_str(), short(&id)));
            AdapterOutcome::Success
        }
        Some(code) => {
            if op == Operation::Refund {
                // Refused only without an applied withdraw of the same details: the protocol
                // asked for money back that it never took.
                w.violation(format!("funding refused the refund of {id}: {code}"));
            }
            w.note(|| format!("funding refused {} of {}: {code}", op.as_str(), short(&id)));
            AdapterOutcome::ExplicitFail {
                code: code.to_owned(),
                message: format!("refused: {code}"),
            }
        }
    }
}

/// What the funding journal holds for (req_id, op), read as `adapters::funding` reads it.
fn funding_record(w: &World, op: Operation, m: &Movement) -> Recorded {
    let Some(row) = w.journal.get(&(m.req_id.to_string(), op)) else {
        return Recorded::NotSeen;
    };
    if row.user != m.user_id.get()
        || row.asset != m.asset.as_str()
        || row.amount != m.amount.value()
    {
        return Recorded::Mismatch(format!("req_id {} recorded for another movement", m.req_id));
    }
    if row.applied {
        return Recorded::Applied;
    }
    let code = row.code.clone().unwrap_or_else(|| "REFUSED".to_owned());
    Recorded::Refused {
        message: format!("refused: {code}"),
        code,
    }
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
                        funding_cancel(&mut w, op, &m);
                    });
                }
                return Recorded::Unavailable("sim: no answer".into());
            }
            Fate::AnswerLost => {
                if cancel {
                    funding_cancel(&mut self.sim.world(), op, m);
                }
                return Recorded::Unavailable("sim: the answer was lost".into());
            }
            Fate::Delivered => {}
        }
        let mut w = self.sim.world();
        if cancel {
            funding_cancel(&mut w, op, m);
        }
        let recorded = funding_record(&w, op, m);
        w.note(|| format!("{name} {} {} -> {recorded:?}", op.as_str(), short(&id)));
        recorded
    }
}

fn funding_cancel(w: &mut World, op: Operation, m: &Movement) {
    w.journal
        .entry((m.req_id.to_string(), op))
        .or_insert_with(|| JournalRow {
            user: m.user_id.get(),
            asset: m.asset.to_string(),
            amount: m.amount.value(),
            applied: false,
            code: Some("CANCELLED".to_owned()),
        });
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
