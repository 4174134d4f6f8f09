//! What the simulated systems hold: the durable rows of the event log and its bookkeeping (the
//! shared in-memory stores' `application::testkit::Rows`), the funding ledger and spot-core's
//! engine (the real one), the run's fault rates and counters, the trace, and the invariants
//! checked at every event (`check_append`, `check_arrival`, `count_applied`). A crash never touches any of it: everything here is durable; what a process
//! held in memory lived in its tasks.

use std::collections::{BTreeMap, BTreeSet};

use adapters::spot::movement_op;
use application::testkit::{Account, Books, Durable, Rows, Stream};
use domain::{
    manual_resolution_target, AccountType, AssetSymbol, Operation, ReqId, TransferEvent,
    TransferState, UserId,
};
use rust_decimal::Decimal;
use spot_core::engine::Effect;
use spot_core::engine::Engine;
use spot_core::protocol::{JournalRecord, Outcome, Request, Response};

use crate::exec::{Role, TaskId};

/// The state whose announcing event must be durable before `op`'s call is made.
fn announced_by(op: Operation) -> TransferState {
    match op {
        Operation::Withdraw => TransferState::SourcePending,
        Operation::Deposit => TransferState::TargetPending,
        Operation::Refund => TransferState::Compensating,
    }
}

/// The two account systems.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum System {
    Funding,
    Spot,
}

impl System {
    pub fn of(account: AccountType) -> System {
        match account {
            AccountType::Spot => System::Spot,
            _ => System::Funding,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            System::Funding => "funding",
            System::Spot => "spot",
        }
    }
}

/// What a transfer's creation says: whose, what and between which systems.
#[derive(Debug, Clone)]
pub struct Made {
    pub user: u64,
    pub asset: String,
    pub amount: Decimal,
    pub from: AccountType,
    pub to: AccountType,
    pub cid: Option<String>,
}

/// What `stream`'s creation says (`None` for a stream not opened by `TransferCreated`).
pub fn made(stream: &Stream) -> Option<Made> {
    match stream.events.first()? {
        TransferEvent::TransferCreated {
            user_id,
            from,
            to,
            asset,
            amount,
            cid,
            ..
        } => Some(Made {
            user: user_id.get(),
            asset: asset.to_string(),
            amount: amount.value(),
            from: *from,
            to: *to,
            cid: cid.clone(),
        }),
        _ => None,
    }
}

/// Per (system, req_id, op): calls made, and the tasks that looked the key up since their own
/// last call (a resuming task must, before it calls again).
#[derive(Debug, Clone, Default)]
pub struct CallTrack {
    pub calls: u32,
    pub looked: BTreeSet<TaskId>,
}

/// Fault rates of one run, per mille per opportunity, drawn from its seed.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    pub store_fail_before: u32,
    pub store_fail_after: u32,
    pub store_delay: u32,
    pub net_unsent: u32,
    pub net_delay: u32,
    pub net_late: u32,
    pub net_duplicate: u32,
    pub net_answer_lost: u32,
    pub crash: u32,
    pub clock_jump: u32,
    pub lease_steal: u32,
}

/// Everything durable, plus the run's bookkeeping of faults, trace and violations.
pub struct World {
    /// The event log, the client keys' claims, `transfer_retries` and the daily counters: the
    /// shared in-memory stores' rows.
    pub rows: Rows,
    /// The funding ledger's accounts and journal (the testkit's books).
    pub funding: Books,
    pub engine: Engine,
    /// Every record spot-core's engine made, in seq order: its WAL, which serves `journal`.
    pub spot_journal: Vec<JournalRecord>,
    pub applied: BTreeMap<(System, String, Operation), u32>,
    pub deposits: BTreeMap<(u64, String), Decimal>,
    pub calls: BTreeMap<(System, String, Operation), CallTrack>,
    /// (user, cid) → the req_ids its requests were answered with.
    pub answers: BTreeMap<(u64, String), BTreeSet<String>>,
    pub faults: Faults,
    pub faults_on: bool,
    pub fault_counts: BTreeMap<&'static str, u64>,
    pub trace: Option<Vec<String>>,
    pub violations: Vec<String>,
    pub now_ms: u64,
    pub start_ms: u64,
    pub current: Option<(TaskId, Role)>,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("violations", &self.violations)
            .finish_non_exhaustive()
    }
}

/// The last characters of a req_id: enough to tell the transfers of one run apart in a trace.
pub fn short(req_id: &str) -> &str {
    &req_id[req_id.len().saturating_sub(6)..]
}

/// Whether `event` is a move of the transition table from `state`.
fn legal(state: Option<TransferState>, event: &TransferEvent) -> bool {
    use TransferEvent as E;
    use TransferState as S;
    match (state, event) {
        (None, E::TransferCreated { .. }) => true,
        (Some(S::Init), E::SourceWithdrawStarted { .. }) => true,
        (Some(S::SourcePending), E::SourceWithdrawn { .. } | E::TransferFailed { .. }) => true,
        (Some(S::SourceDone), E::TargetDepositStarted { .. }) => true,
        (Some(S::TargetPending), E::TransferCommitted { .. } | E::CompensationStarted { .. }) => {
            true
        }
        (Some(S::Compensating), E::TransferRolledBack { .. }) => true,
        (
            Some(s),
            E::TransferManuallyResolved {
                resolution,
                from_state,
                to_state,
                ..
            },
        ) => *from_state == s && manual_resolution_target(s, *resolution) == Some(*to_state),
        _ => false,
    }
}

impl World {
    /// Applies `req` to spot-core's engine now, keeping the record it makes in the journal, as
    /// spot-core's server writes its WAL; `journal` itself is served from that journal, as the
    /// server serves it from its WAL.
    pub fn engine_apply(&mut self, req: &Request) -> Effect {
        if let Request::Journal { after_seq, limit } = req {
            let records: Vec<JournalRecord> = self
                .spot_journal
                .iter()
                .filter(|r| r.seq() > *after_seq)
                .take(usize::try_from(*limit).unwrap_or(usize::MAX))
                .cloned()
                .collect();
            return Effect {
                response: Response::Ok {
                    ops: None,
                    balances: None,
                    totals: None,
                    records: Some(records),
                    core: None,
                    protocol: None,
                    moves: None,
                },
                record: None,
            };
        }
        let effect = self.engine.apply_at(req, self.now_ms);
        if let Some(record) = &effect.record {
            self.spot_journal.push(record.clone());
        }
        effect
    }

    pub fn new(engine: Engine, start_ms: u64) -> Self {
        Self {
            rows: Rows::default(),
            funding: Books::default(),
            engine,
            spot_journal: Vec::new(),
            applied: BTreeMap::new(),
            deposits: BTreeMap::new(),
            calls: BTreeMap::new(),
            answers: BTreeMap::new(),
            faults: Faults::default(),
            faults_on: true,
            fault_counts: BTreeMap::new(),
            trace: None,
            violations: Vec::new(),
            now_ms: start_ms,
            start_ms,
            current: None,
        }
    }

    /// `user`'s FUNDING account of `asset`, if it exists.
    pub fn funding_account(&mut self, user: u64, asset: &str) -> Option<&mut Account> {
        let key = (UserId::new(user).ok()?, AssetSymbol::parse(asset).ok()?);
        self.funding.accounts.get_mut(&key)
    }

    /// Adds a line to the trace (when tracing), stamped with simulated time and the task.
    pub fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(trace) = self.trace.as_mut() {
            let at = self.now_ms.saturating_sub(self.start_ms);
            let who = match self.current {
                Some((id, role)) => format!("#{id} {role:?}"),
                None => "-".to_owned(),
            };
            trace.push(format!("{at:>8}ms {who:<14} {}", line()));
        }
    }

    /// Counts a fault of `kind` and traces it.
    pub fn fault(&mut self, kind: &'static str, at: &str) {
        *self.fault_counts.entry(kind).or_insert(0) += 1;
        self.note(|| format!("FAULT {kind} at {at}"));
    }

    pub fn violation(&mut self, what: String) {
        self.note(|| format!("VIOLATION {what}"));
        self.violations.push(what);
    }

    /// The continuous checks on an append that is about to take effect: only the transition
    /// table's moves, no change after a terminal state, and a refusal recorded by the account
    /// system behind every FAILED and COMPENSATING (money moves back only after an explicit
    /// refusal). `rows` are the log's, locked by the append.
    pub fn check_append(&mut self, rows: &Durable, req_id: &ReqId, events: &[TransferEvent]) {
        let id = req_id.to_string();
        let id = id.as_str();
        let stream = rows.streams.get(req_id);
        let mut state = stream.and_then(Stream::state);
        for event in events {
            if let Some(s) = state.filter(|s| s.is_terminal()) {
                self.violation(format!("transfer {id}: terminal {s} changed by {event:?}"));
                return;
            }
            if !legal(state, event) {
                self.violation(format!(
                    "transfer {id}: {event:?} is not a move from {state:?}"
                ));
                return;
            }
            let next = event.resulting_state();
            let (from, to) = match (stream.and_then(made), event) {
                (Some(m), _) => (m.from, m.to),
                (None, TransferEvent::TransferCreated { from, to, .. }) => (*from, *to),
                (None, _) => return,
            };
            let proof = match next {
                TransferState::Failed => Some((System::of(from), Operation::Withdraw)),
                TransferState::Compensating => Some((System::of(to), Operation::Deposit)),
                _ => None,
            };
            if let Some((system, op)) = proof {
                if !self.recorded_refusal(system, id, op) {
                    self.violation(format!(
                        "transfer {id}: {next} recorded without a refusal of its {} in {}",
                        op.as_str(),
                        system.name()
                    ));
                }
            }
            state = Some(next);
        }
    }

    /// Whether `system` recorded a refusal of (req_id, op).
    pub fn recorded_refusal(&mut self, system: System, id: &str, op: Operation) -> bool {
        match system {
            System::Funding => ReqId::parse(id).is_ok_and(|req_id| {
                self.funding
                    .journal
                    .get(&(req_id, op))
                    .is_some_and(|r| !r.applied)
            }),
            System::Spot => {
                let effect = self.engine.apply_at(
                    &Request::Lookup {
                        req_id: id.to_owned(),
                    },
                    self.now_ms,
                );
                match effect.response {
                    Response::Ok { ops: Some(ops), .. } => ops
                        .iter()
                        .any(|o| o.op == movement_op(op) && o.outcome == Outcome::Refused),
                    _ => false,
                }
            }
        }
    }

    /// Whether `system` applied (req_id, op).
    pub fn recorded_applied(&self, system: System, id: &str, op: Operation) -> bool {
        self.applied
            .get(&(system, id.to_owned(), op))
            .is_some_and(|n| *n > 0)
    }

    /// A movement issued to, or arriving at, an account system: its announcing event must be
    /// durable.
    pub fn check_arrival(&mut self, system: System, id: &str, op: Operation) {
        let rows = self.rows.clone();
        self.check_arrival_in(&rows.lock(), system, id, op);
    }

    /// `check_arrival` against rows the caller holds (a movement decided inside the log's own
    /// write, ADR 0024: its announcement must be in the rows of that write, before it).
    pub fn check_arrival_in(&mut self, rows: &Durable, system: System, id: &str, op: Operation) {
        let announcing = announced_by(op);
        let announced = ReqId::parse(id).is_ok_and(|req_id| {
            rows.streams
                .get(&req_id)
                .is_some_and(|s| s.events.iter().any(|e| e.resulting_state() == announcing))
        });
        if !announced {
            self.violation(format!(
                "{} {} of {id} called or arrived before its announcing event ({}) was durable",
                system.name(),
                op.as_str(),
                announced_by(op)
            ));
        }
    }

    /// A movement an account system applied (fresh): each (req_id, op) at most once.
    pub fn count_applied(&mut self, system: System, id: &str, op: Operation) {
        let n = self.applied.entry((system, id.to_owned(), op)).or_insert(0);
        *n += 1;
        if *n > 1 {
            let n = *n;
            self.violation(format!(
                "{} applied {} of {id} {n} times",
                system.name(),
                op.as_str()
            ));
        }
    }

    /// A call issued by the current task; a resuming task (worker, operator) must have looked
    /// the key up since its own last call when the key was called before.
    pub fn track_call(&mut self, system: System, id: &str, op: Operation) {
        // Issued only once its announcement is durable (checked again where it arrives, for the
        // copies the network delivers late).
        self.check_arrival(system, id, op);
        let current = self.current;
        let track = self.calls.entry((system, id.to_owned(), op)).or_default();
        let mut retried_blind = false;
        if let Some((task, role)) = current {
            let resuming = matches!(role, Role::Worker | Role::Operator);
            if resuming && track.calls > 0 && !track.looked.contains(&task) {
                retried_blind = true;
            }
            track.looked.remove(&task);
        }
        track.calls += 1;
        if retried_blind {
            self.violation(format!(
                "{} {} of {id} retried by a resuming task without a lookup first",
                system.name(),
                op.as_str()
            ));
        }
    }

    /// A lookup (or cancel) of (req_id, op) by the current task.
    pub fn track_lookup(&mut self, system: System, id: &str, op: Operation) {
        if let Some((task, _)) = self.current {
            self.calls
                .entry((system, id.to_owned(), op))
                .or_default()
                .looked
                .insert(task);
        }
    }
}
