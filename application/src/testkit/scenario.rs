//! A given/when/then framework for the coordinator, in the style of cqrs-es's `TestFramework`:
//! `Scenario` sets up what is durable before the command (the ports' rows, prior events, the
//! account systems' books and the faults armed), a `when_*` runs one command in a fresh process
//! (`World::coordinator`) on the manual executor, and `Then` checks what that one command did:
//! the events appended, the calls made to each account system, and its answer (or its crash).
//!
//! The standard transfer every helper speaks of: user 7 moves 10 USDT from FUNDING (holding 100)
//! to SPOT (no account yet).

use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;

use domain::{
    AccountType, Amount, AssetSymbol, Movement, Operation, ReqId, TransferData, TransferEvent,
    TransferState, UserId,
};
use rust_decimal::Decimal;

use crate::coordinator::{Coordinator, CoordinatorError, NewTransfer};
use crate::daily::DailyLimits;
use crate::drive::{Resumed, StillOpen};
use crate::ledger::Ledger;
use crate::ports::Clock;
use crate::testkit::account::Status;
use crate::testkit::exec::{run, run_together};
use crate::testkit::faults::{AccountFault, Call, StoreCall, StoreFault};
use crate::testkit::kinds::EventKind;
use crate::testkit::rows::Stream;
use crate::testkit::world::World;

/// The standard transfer's user.
pub const USER: u64 = 7;
/// The standard transfer's asset.
pub const ASSET: &str = "USDT";
/// The standard transfer's amount.
pub const AMOUNT: &str = "10";
/// The user's FUNDING balance before anything happens.
pub const FUNDING_BALANCE: &str = "100";
/// The req_id of a transfer a scenario is given (`given_transfer_in`): a ULID of the clock's
/// start (`clock::START_MS`) whose random part no req_id the clock mints has.
pub const GIVEN: &str = "01KJPZV280R3ZYW00000000000";

/// The standard user.
pub fn user() -> UserId {
    UserId::new(USER).expect("a valid user id")
}

/// The standard asset.
pub fn asset() -> AssetSymbol {
    AssetSymbol::parse(ASSET).expect("a valid asset")
}

/// A decimal written out.
pub fn dec(text: &str) -> Decimal {
    Decimal::from_str(text).expect("a decimal")
}

/// The req_id of the transfer a scenario is given.
pub fn given_req_id() -> ReqId {
    ReqId::parse(GIVEN).expect("a valid req_id")
}

/// The standard request: 10 USDT from FUNDING to SPOT, with `cid` if any.
pub fn request(cid: Option<&str>) -> NewTransfer {
    NewTransfer {
        user_id: user(),
        from: AccountType::Funding,
        to: AccountType::Spot,
        asset: asset(),
        amount: Amount::parse(AMOUNT).expect("a valid amount"),
        cid: cid.map(str::to_owned),
    }
}

/// The standard transfer's movement under `req_id`.
pub fn movement(req_id: ReqId) -> Movement {
    let r = request(None);
    Movement {
        req_id,
        user_id: r.user_id,
        asset: r.asset,
        amount: r.amount,
    }
}

/// What is durable before the command under test.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub world: World,
}

impl Default for Scenario {
    fn default() -> Self {
        Self::new()
    }
}

impl Scenario {
    /// The standard user holds 100 USDT in FUNDING; nothing else exists.
    pub fn new() -> Self {
        let world = World::default();
        world.funding.open(user(), &asset(), dec(FUNDING_BALANCE));
        Self { world }
    }

    /// The user's FUNDING balance is `balance` instead.
    pub fn given_funding_balance(self, balance: &str) -> Self {
        self.world.funding.open(user(), &asset(), dec(balance));
        self
    }

    /// New transfers are held to `limits`.
    pub fn given_daily_limits(mut self, limits: DailyLimits) -> Self {
        self.world.daily = limits;
        self
    }

    /// The log claims, charges and creates in separate steps, as a log without claims and
    /// counters of its own does (ADR 0022).
    pub fn given_log_apart(mut self) -> Self {
        self.world.apart = true;
        self
    }

    /// The next call at `site` meets `fault`.
    pub fn given_store_fault(self, site: StoreCall, fault: StoreFault) -> Self {
        self.world.faults.arm(site, fault);
        self
    }

    /// The next `call` to `account`'s system meets `fault`.
    pub fn given_fault(self, account: AccountType, call: Call, fault: AccountFault) -> Self {
        self.world.account(account).faults.arm(call, fault);
        self
    }

    /// Every `call` to `account`'s system meets `fault` (until healed).
    pub fn given_fault_always(self, account: AccountType, call: Call, fault: AccountFault) -> Self {
        self.world.account(account).faults.arm_always(call, fault);
        self
    }

    /// The standard transfer under `GIVEN` was left in `state` by a process that died: its
    /// events up to `state`, and the account systems' books as those events prove them (a
    /// withdraw applied once SOURCE_DONE is reached; the deposit refused for COMPENSATING). The
    /// pending call itself was never made; `given_applied` says otherwise.
    pub fn given_transfer_in(self, state: TransferState) -> Self {
        let req_id = given_req_id();
        let events = history(&self.world, req_id, state);
        let m = movement(req_id);
        let reached = |s: TransferState| events.iter().any(|e| e.resulting_state() == s);
        if reached(TransferState::SourceDone) {
            self.world.funding.decide(Operation::Withdraw, &m, None);
        }
        if reached(TransferState::Compensating) {
            let refused = Some("TARGET_REFUSED".to_owned());
            self.world.spot.decide(Operation::Deposit, &m, refused);
        }
        if reached(TransferState::Committed) {
            self.world.spot.decide(Operation::Deposit, &m, None);
        }
        if reached(TransferState::RolledBack) {
            self.world.funding.decide(Operation::Refund, &m, None);
        }
        self.given_events(req_id, events)
    }

    /// The transfer under `req_id` has these durable events.
    pub fn given_events(self, req_id: ReqId, events: Vec<TransferEvent>) -> Self {
        let now = self.world.clock().now_ms();
        let owner = Some(user());
        let mut rows = self.world.store.rows();
        let tx = rows.take_tx();
        let stream = Stream {
            txs: vec![tx; events.len()],
            events,
            owner,
            recorded_at_ms: now,
        };
        rows.streams.insert(req_id, stream);
        drop(rows);
        self
    }

    /// `account`'s system decided `operation` of the given transfer (applied, or refused with
    /// `refused`) but the answer never reached the ledger.
    pub fn given_decided(
        self,
        account: AccountType,
        operation: Operation,
        refused: Option<&str>,
    ) -> Self {
        let m = movement(given_req_id());
        let refuse = refused.map(str::to_owned);
        self.world.account(account).decide(operation, &m, refuse);
        self
    }

    /// `given_decided` with the operation applied.
    pub fn given_applied(self, account: AccountType, operation: Operation) -> Self {
        self.given_decided(account, operation, None)
    }

    /// Runs `process` in a fresh coordinator process, as the one command under test.
    pub fn when<T, F>(&self, process: impl FnOnce(Coordinator) -> F) -> Then<'_, T>
    where
        F: Future<Output = T>,
    {
        let mark = Mark::of(&self.world);
        let answer = run(process(self.world.coordinator()));
        Then {
            world: &self.world,
            mark,
            answer,
        }
    }

    /// Runs `command` on a fresh ledger process (`World::ledger`: the coordinator, the records
    /// and both account systems), as the one command under test: the admin's commands and the
    /// requests go through here.
    pub fn when_ledger<T, F>(&self, command: impl FnOnce(Ledger) -> F) -> Then<'_, T>
    where
        F: Future<Output = T>,
    {
        let mark = Mark::of(&self.world);
        let answer = run(command(self.world.ledger()));
        Then {
            world: &self.world,
            mark,
            answer,
        }
    }

    /// Runs `count` fresh processes interleaved (`run_together`): process `i` runs
    /// `process(i, its coordinator)`. The answer is each one's, `None` for one that crashed.
    pub fn when_together<T, F>(
        &self,
        count: usize,
        process: impl Fn(usize, Coordinator) -> F,
    ) -> Then<'_, Vec<Option<T>>>
    where
        F: Future<Output = T>,
    {
        let mark = Mark::of(&self.world);
        let processes = (0..count)
            .map(|i| {
                Box::pin(process(i, self.world.coordinator())) as Pin<Box<dyn Future<Output = T>>>
            })
            .collect();
        let answers = run_together(processes);
        Then {
            world: &self.world,
            mark,
            answer: Some(answers),
        }
    }

    /// `Coordinator::submit` of `request`.
    pub fn when_submit(
        &self,
        request: NewTransfer,
    ) -> Then<'_, Result<TransferData, CoordinatorError>> {
        self.when(|c| async move { c.submit(request).await })
    }

    /// `Coordinator::resume` of the given transfer (a recovery worker's drive).
    pub fn when_resume(&self) -> Then<'_, Result<Resumed, CoordinatorError>> {
        let req_id = given_req_id();
        self.when(|c| async move { c.resume(&req_id).await })
    }

    /// `Coordinator::resume` of `req_id`.
    pub fn when_resume_of(&self, req_id: ReqId) -> Then<'_, Result<Resumed, CoordinatorError>> {
        self.when(|c| async move { c.resume(&req_id).await })
    }

    /// `Coordinator::drive` of the given transfer (no lookup first).
    pub fn when_drive(&self) -> Then<'_, Result<TransferData, CoordinatorError>> {
        let req_id = given_req_id();
        self.when(|c| async move { c.drive(&req_id).await })
    }
}

/// The standard transfer's events from its creation up to `state` along the table's path.
fn history(world: &World, req_id: ReqId, state: TransferState) -> Vec<TransferEvent> {
    use TransferEvent as E;
    use TransferState as S;
    let at = world.clock().now();
    let r = request(None);
    let created = E::TransferCreated {
        req_id,
        user_id: r.user_id,
        from: r.from,
        to: r.to,
        asset: r.asset,
        amount: r.amount,
        cid: None,
        at,
    };
    let refused = |code: &str| (code.to_owned(), format!("refused: {code}"));
    let path = match state {
        S::Init => vec![],
        S::SourcePending => vec![E::SourceWithdrawStarted { at }],
        S::Failed => {
            let (code, message) = refused("INSUFFICIENT_BALANCE");
            vec![
                E::SourceWithdrawStarted { at },
                E::TransferFailed { code, message, at },
            ]
        }
        _ => {
            let mut path = vec![E::SourceWithdrawStarted { at }, E::SourceWithdrawn { at }];
            let target = match state {
                S::SourceDone => vec![],
                S::TargetPending => vec![E::TargetDepositStarted { at }],
                S::Committed => vec![E::TargetDepositStarted { at }, E::TransferCommitted { at }],
                _ => {
                    let (code, message) = refused("TARGET_REFUSED");
                    let compensating = E::CompensationStarted { code, message, at };
                    let mut events = vec![E::TargetDepositStarted { at }, compensating];
                    if state == S::RolledBack {
                        events.push(E::TransferRolledBack { at });
                    }
                    events
                }
            };
            path.extend(target);
            path
        }
    };
    std::iter::once(created).chain(path).collect()
}

/// What was there before the command: each stream's length and each account's calls.
#[derive(Debug, Clone)]
struct Mark {
    lengths: Vec<(ReqId, usize)>,
    funding_calls: usize,
    spot_calls: usize,
}

impl Mark {
    fn of(world: &World) -> Self {
        let rows = world.store.rows();
        Self {
            lengths: rows
                .streams
                .iter()
                .map(|(id, s)| (*id, s.events.len()))
                .collect(),
            funding_calls: world.funding.books().calls.len(),
            spot_calls: world.spot.books().calls.len(),
        }
    }

    fn before(&self, req_id: &ReqId) -> usize {
        self.lengths
            .iter()
            .find(|(id, _)| id == req_id)
            .map_or(0, |(_, n)| *n)
    }
}

/// What one command did. Every check panics with what it saw, and returns `self` for the next.
#[derive(Debug)]
pub struct Then<'a, T> {
    world: &'a World,
    mark: Mark,
    /// `None` when the process crashed.
    answer: Option<T>,
}

impl<T: std::fmt::Debug> Then<'_, T> {
    /// The command's answer; panics when the process crashed.
    pub fn answer(&self) -> &T {
        self.answer
            .as_ref()
            .expect("the process crashed instead of answering")
    }

    /// The process crashed (a crash fault fired) before it could answer.
    pub fn crashed(&self) -> &Self {
        assert!(
            self.answer.is_none(),
            "expected a crash, the process answered {:?}",
            self.answer
        );
        self
    }

    /// The events the command appended, by type, over all transfers (in req_id order).
    pub fn appended_events(&self) -> Vec<TransferEvent> {
        let rows = self.world.store.rows();
        rows.streams
            .iter()
            .flat_map(|(id, s)| s.events[self.mark.before(id)..].iter().cloned())
            .collect()
    }

    /// The command appended exactly these events (by kind, in order).
    pub fn appended(&self, expected: &[EventKind]) -> &Self {
        let kinds: Vec<EventKind> = self.appended_events().iter().map(EventKind::of).collect();
        assert_eq!(kinds, expected, "events appended");
        self
    }

    /// The command appended nothing.
    pub fn nothing_appended(&self) -> &Self {
        self.appended(&[])
    }

    /// The calls the command made to `account`'s system, in order.
    pub fn calls_to(&self, account: AccountType) -> Vec<Call> {
        let skip = match account {
            AccountType::Funding => self.mark.funding_calls,
            _ => self.mark.spot_calls,
        };
        let calls = self.world.account(account).calls();
        calls.into_iter().skip(skip).map(|(call, _)| call).collect()
    }

    /// The command made exactly these calls to FUNDING.
    pub fn funding_calls(&self, expected: &[Call]) -> &Self {
        assert_eq!(
            self.calls_to(AccountType::Funding),
            expected,
            "FUNDING calls"
        );
        self
    }

    /// The command made exactly these calls to SPOT.
    pub fn spot_calls(&self, expected: &[Call]) -> &Self {
        assert_eq!(self.calls_to(AccountType::Spot), expected, "SPOT calls");
        self
    }

    /// The transfer `req_id` is durably in `state`.
    pub fn state_of(&self, req_id: ReqId, state: TransferState) -> &Self {
        assert_eq!(self.world.state(req_id), Some(state), "durable state");
        self
    }

    /// The given transfer is durably in `state`.
    pub fn state(&self, state: TransferState) -> &Self {
        self.state_of(given_req_id(), state)
    }

    /// Whether the standard user's client key `cid` is claimed (durably).
    pub fn claimed(&self, cid: &str, claimed: bool) -> &Self {
        let held = self
            .world
            .store
            .rows()
            .claims
            .contains_key(&(user(), cid.to_owned()));
        assert_eq!(held, claimed, "the claim of {cid}");
        self
    }

    /// The standard user's transfers charged to the daily limits, over every day.
    pub fn charged(&self, count: u64) -> &Self {
        let counted: u64 = self
            .world
            .store
            .rows()
            .daily
            .values()
            .filter_map(|usage| usage.counts.get(&user()))
            .sum();
        assert_eq!(counted, count, "transfers charged");
        self
    }

    /// The status of the standard user's account in `account`'s system (`None`: no account).
    pub fn account_status(&self, account: AccountType, status: Option<Status>) -> &Self {
        let held = (self.world.account(account).books().accounts)
            .get(&(user(), asset()))
            .map(|a| a.status);
        assert_eq!(held, status, "{account} account status");
        self
    }

    /// The standard user's balances: FUNDING, and SPOT (`None`: no account).
    pub fn balances(&self, funding: &str, spot: Option<&str>) -> &Self {
        let balance = |a: AccountType| self.world.account(a).balance(user(), &asset());
        assert_eq!(balance(AccountType::Funding), Some(dec(funding)), "FUNDING");
        assert_eq!(balance(AccountType::Spot), spot.map(dec), "SPOT");
        self
    }
}

impl Then<'_, Result<TransferData, CoordinatorError>> {
    /// The command answered with the transfer in `state`.
    pub fn answered(&self, state: TransferState) -> &Self {
        match self.answer() {
            Ok(data) => assert_eq!(data.state, state, "answered state"),
            Err(e) => panic!("expected a transfer in {state}, got {e:?}"),
        }
        self
    }

    /// The command was refused with `code` (nothing created).
    pub fn refused(&self, code: domain::ErrorCode) -> &Self {
        assert_eq!(self.answer(), &Err(CoordinatorError::Refused(code)));
        self
    }

    /// The command failed with an error that is not a refusal: its outcome is unknown.
    pub fn failed(&self) -> &Self {
        match self.answer() {
            Err(CoordinatorError::Refused(code)) => panic!("refused with {code:?}"),
            Err(_) => {}
            Ok(data) => panic!("expected an error, the transfer is in {}", data.state),
        }
        self
    }

    /// The answered transfer's req_id.
    pub fn req_id(&self) -> ReqId {
        match self.answer() {
            Ok(data) => data.req_id,
            Err(e) => panic!("no transfer: {e:?}"),
        }
    }
}

impl Then<'_, Result<Resumed, CoordinatorError>> {
    /// The drive ended in `state`, terminal.
    pub fn finished(&self, state: TransferState) -> &Self {
        match self.answer() {
            Ok(r) => {
                assert_eq!(r.data.state, state, "resumed state");
                assert_eq!(r.unknown, None, "still open");
            }
            Err(e) => panic!("expected {state}, got {e:?}"),
        }
        self
    }

    /// The drive stopped in `state` on `operation`'s unknown outcome.
    pub fn still_open(&self, state: TransferState, operation: Operation) -> &Self {
        match self.answer() {
            Ok(Resumed {
                data,
                unknown: Some(StillOpen::Call { operation: op, .. }),
            }) => {
                assert_eq!(data.state, state, "state left open");
                assert_eq!(*op, operation, "pending operation");
            }
            other => panic!("expected {state} open on {operation}, got {other:?}"),
        }
        self
    }

    /// The drive failed with an error (a store fault): the transfer was not driven through.
    pub fn failed(&self) -> &Self {
        assert!(
            self.answer().is_err(),
            "expected an error: {:?}",
            self.answer()
        );
        self
    }
}
