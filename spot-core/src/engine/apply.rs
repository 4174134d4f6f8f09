//! Deciding requests: `Engine::apply` and everything it answers (movements, cancels, status
//! changes, lookups, the horizon, the retained position, a hello's map version; a partition's
//! move is `moves.rs`'), each change made through the record it returns.

use rust_decimal::Decimal;

use super::outcome::{decode_outcome, APPLIED};
use super::values::{credit, parse_amount, valid_user_id, MAX_REQ_ID_FUTURE_MS};
use super::{Effect, Engine, Remembered};
use crate::assets::MAX_PRECISION;
use crate::invariant;
use crate::protocol::{
    AccountStatus, ErrorCode, HorizonRecord, JournalRecord, LookupOp, MapVersionRecord, MovementOp,
    MovementRecord, MovementRequest, Outcome, RefusalCode, Request, Response, RetainRecord,
    StatusRecord,
};
use crate::ulid;

impl Engine {
    /// Applies a record this engine just made from its own state. Its replay cannot refuse it:
    /// a refusal means the decision and the replay disagree, and the state is not to be trusted.
    pub(super) fn apply_own(&mut self, record: JournalRecord) {
        let seq = record.seq();
        let applied = self.apply_record(record);
        invariant!(
            applied.is_ok() && self.last_seq == seq,
            "the engine's own record {seq} does not follow from its state: {:?}",
            applied.err()
        );
    }

    /// Decide a request with spot-core's clock.
    pub fn apply(&mut self, req: &Request) -> Effect {
        self.apply_at(req, ulid::now_ms())
    }

    /// Decide a request as at `now_ms` (Unix ms; only `advance_horizon` and the req_id's
    /// future check read it). State changes only through the returned record, which is already
    /// applied to memory; the caller must make it durable before sending the response.
    /// `journal` is not answered here (the engine keeps no records): the WAL layer serves it.
    pub fn apply_at(&mut self, req: &Request, now_ms: u64) -> Effect {
        match req {
            Request::Withdraw(m) => self.movement(MovementOp::Withdraw, m, now_ms),
            Request::Deposit(m) => self.movement(MovementOp::Deposit, m, now_ms),
            Request::Refund(m) => self.movement(MovementOp::Refund, m, now_ms),
            Request::SetStatus {
                user_id,
                asset,
                status,
            } => self.set_status(*user_id, asset, *status),
            Request::Lookup { req_id } => self.lookup(req_id, now_ms),
            Request::Balances { user_id } => self.moved(*user_id).unwrap_or_else(|| {
                Effect::reply(Response::Ok {
                    ops: None,
                    balances: Some(self.balances(*user_id)),
                    totals: None,
                    records: None,
                    core: None,
                    protocol: None,
                    moves: None,
                })
            }),
            Request::Totals {} => Effect::reply(Response::Ok {
                ops: None,
                balances: None,
                totals: Some(self.totals()),
                records: None,
                core: None,
                protocol: None,
                moves: None,
            }),
            Request::Journal { .. } => Effect::reply(Response::bad_request(
                "journal is served from the WAL, not by the engine",
            )),
            Request::Cancel {
                req_id,
                movement,
                user_id,
                asset,
                amount,
            } => self.cancel(
                *movement,
                &MovementRequest {
                    req_id: req_id.clone(),
                    user_id: *user_id,
                    asset: asset.clone(),
                    amount: amount.clone(),
                    trace: None,
                },
                now_ms,
            ),
            // The server answers `hello` itself (token, cell, epoch); only its map version is
            // the engine's, and the server asks only when the hello names one.
            Request::Hello { map_version, .. } => self.hello_map(*map_version),
            Request::Ping {} => Effect::reply(Response::ok()),
            Request::AdvanceHorizon { before_ms } => self.advance_horizon(*before_ms, now_ms),
            Request::Retain { after_seq } => self.retain(*after_seq),
            Request::Status {} => Effect::reply(self.core_response()),
            Request::MoveOut { move_id, partition } => self.move_out(move_id, *partition),
            Request::MoveIn {
                move_id,
                partition,
                payload,
            } => self.move_in(move_id, *partition, payload),
            Request::MoveLookup { move_id } => self.move_lookup(move_id),
        }
    }

    /// The req_id's ULID value, or the refusal: not canonical or too far in the future
    /// (`INVALID_REQ_ID`), older than the horizon (`REQ_ID_EXPIRED`).
    fn key_of(&self, req_id: &str, now_ms: u64) -> Result<u128, RefusalCode> {
        let id = ulid::parse(req_id).ok_or(RefusalCode::InvalidReqId)?;
        let created = ulid::time_ms(id);
        if created > now_ms.saturating_add(MAX_REQ_ID_FUTURE_MS) {
            return Err(RefusalCode::InvalidReqId);
        }
        if created < self.horizon_ms {
            return Err(RefusalCode::ReqIdExpired);
        }
        Ok(id)
    }

    fn advance_horizon(&mut self, before_ms: u64, now_ms: u64) -> Effect {
        if before_ms > now_ms {
            return Effect::reply(Response::bad_request(format!(
                "before_ms {before_ms} is later than spot-core's clock ({now_ms})"
            )));
        }
        if before_ms <= self.horizon_ms {
            return Effect::reply(self.core_response());
        }
        let record = JournalRecord::Horizon(HorizonRecord {
            seq: self.last_seq + 1,
            before_ms,
        });
        self.apply_own(record.clone());
        Effect {
            response: self.core_response(),
            record: Some(record),
        }
    }

    /// A `hello` naming the cell map version `version` (ADR 0023 §1): a higher one than any seen
    /// is recorded (durable before the `ok`), an equal one is `ok`, a lower one is refused
    /// `STALE_MAP`; none (an old client, no map) is `ok`.
    fn hello_map(&mut self, version: Option<u64>) -> Effect {
        let Some(version) = version else {
            return Effect::reply(Response::ok());
        };
        let known = self.map_version;
        if version < known {
            return Effect::reply(Response::Error {
                code: ErrorCode::StaleMap,
                message: format!(
                    "this client routes by map version {version}; this spot-core has seen \
                     version {known}: reload the map"
                ),
            });
        }
        if version == known {
            return Effect::reply(Response::ok());
        }
        let record = JournalRecord::MapVersion(MapVersionRecord {
            seq: self.last_seq + 1,
            version,
        });
        self.apply_own(record.clone());
        Effect {
            response: Response::ok(),
            record: Some(record),
        }
    }

    fn retain(&mut self, after_seq: u64) -> Effect {
        if after_seq > self.last_seq {
            return Effect::reply(Response::bad_request(format!(
                "after_seq {after_seq} is beyond the last seq {}",
                self.last_seq
            )));
        }
        if after_seq <= self.retain_after {
            return Effect::reply(self.core_response());
        }
        let record = JournalRecord::Retain(RetainRecord {
            seq: self.last_seq + 1,
            after_seq,
        });
        self.apply_own(record.clone());
        Effect {
            response: self.core_response(),
            record: Some(record),
        }
    }

    /// Settle `(req_id, op)`: when nothing is recorded under that key, record a `CANCELLED`
    /// refusal so every later copy of the movement is refused as a duplicate. Either way the
    /// answer is the one record now standing for the key, shaped like a `lookup` entry, and
    /// left for the caller to compare with the movement it meant (like `lookup`, a record with
    /// other details is reported, not refused).
    fn cancel(&mut self, op: MovementOp, m: &MovementRequest, now_ms: u64) -> Effect {
        if let Some(moved) = self.moved(m.user_id) {
            return moved;
        }
        let id = match self.key_of(&m.req_id, now_ms) {
            Ok(id) => id,
            Err(code) => return Effect::refuse(code),
        };
        if let Some(first) = self.remembered.get(&(id, op)) {
            return Effect::reply(ops_response(vec![self.lookup_op(op, first)]));
        }
        // The same validations as the movement itself: the record must be one the movement
        // could have produced, and replay checks the amount.
        if !valid_user_id(m.user_id) {
            return Effect::refuse(RefusalCode::InvalidUserId);
        }
        let Some(precision) = self.assets.precision(&m.asset) else {
            return Effect::refuse(RefusalCode::InvalidAsset);
        };
        let amount = match parse_amount(&m.amount, precision) {
            Ok(a) => a,
            Err(code) => return Effect::refuse(code),
        };
        let rec = MovementRecord {
            seq: self.last_seq + 1,
            req_id: m.req_id.clone(),
            user_id: m.user_id,
            asset: m.asset.clone(),
            amount,
            outcome: Outcome::Refused,
            code: Some(RefusalCode::Cancelled),
            balance: None,
        };
        let response = ops_response(vec![LookupOp {
            op,
            user_id: rec.user_id,
            asset: rec.asset.clone(),
            amount: rec.amount,
            outcome: rec.outcome,
            code: rec.code,
            seq: rec.seq,
        }]);
        let record = JournalRecord::from_movement(op, rec);
        self.apply_own(record.clone());
        Effect {
            response,
            record: Some(record),
        }
    }

    fn movement(&mut self, op: MovementOp, m: &MovementRequest, now_ms: u64) -> Effect {
        // Before the idempotency check: after a move only the target's answer is whole.
        if let Some(moved) = self.moved(m.user_id) {
            return moved;
        }
        let id = match self.key_of(&m.req_id, now_ms) {
            Ok(id) => id,
            Err(code) => return Effect::refuse(code),
        };
        // The idempotency check comes before the other validations on purpose: a retry of
        // something already recorded must get the recorded answer even if the asset config
        // changed since, otherwise a caller could mistake an applied movement for a refusal.
        if let Some(first) = self.remembered.get(&(id, op)) {
            let same = first.user_id == m.user_id
                && self.asset_names[usize::from(first.asset)] == m.asset
                && parse_amount(&m.amount, MAX_PRECISION).is_ok_and(|a| a == first.amount);
            return Effect::reply(if same {
                remembered_response(first, true)
            } else {
                Response::refused(RefusalCode::ReqIdConflict, false, None)
            });
        }
        if !valid_user_id(m.user_id) {
            return Effect::refuse(RefusalCode::InvalidUserId);
        }
        let Some(precision) = self.assets.precision(&m.asset) else {
            return Effect::refuse(RefusalCode::InvalidAsset);
        };
        let amount = match parse_amount(&m.amount, precision) {
            Ok(a) => a,
            Err(code) => return Effect::refuse(code),
        };

        let decision = self.decide(op, id, m, amount);
        let (outcome, code, balance) = match decision {
            Ok(new_balance) => (Outcome::Applied, None, Some(new_balance)),
            Err(code) => (Outcome::Refused, Some(code), None),
        };
        let rec = MovementRecord {
            seq: self.last_seq + 1,
            req_id: m.req_id.clone(),
            user_id: m.user_id,
            asset: m.asset.clone(),
            amount,
            outcome,
            code,
            balance,
        };
        let response = movement_response(&rec, false);
        let before = self.account_of(m.user_id, &m.asset).map(|a| a.available);
        let record = JournalRecord::from_movement(op, rec);
        self.apply_own(record.clone());
        self.check_moved(op, m, amount, before, balance);
        Effect {
            response,
            record: Some(record),
        }
    }

    /// Postconditions of a decided movement: an applied one moved its account by exactly its
    /// amount, to the balance it records, never below zero; a refused one moved nothing.
    fn check_moved(
        &self,
        op: MovementOp,
        m: &MovementRequest,
        amount: Decimal,
        before: Option<Decimal>,
        balance: Option<Decimal>,
    ) {
        let after = self.account_of(m.user_id, &m.asset).map(|a| a.available);
        let moved = match (op, before) {
            (MovementOp::Withdraw, Some(b)) => Some((b - amount).normalize()),
            (MovementOp::Withdraw, None) => None,
            (_, b) => Some((b.unwrap_or(Decimal::ZERO) + amount).normalize()),
        };
        invariant!(
            match balance {
                Some(recorded) =>
                    after == Some(recorded) && moved == Some(recorded) && recorded >= Decimal::ZERO,
                None => after == before,
            },
            "{} {} of {} {}: balance {before:?} -> {after:?}, recorded {balance:?}",
            op.as_str(),
            m.req_id,
            amount,
            m.asset
        );
    }

    /// Business rules: the new available balance, or the refusal to record.
    fn decide(
        &self,
        op: MovementOp,
        id: u128,
        m: &MovementRequest,
        amount: Decimal,
    ) -> Result<Decimal, RefusalCode> {
        let account = self.account_of(m.user_id, &m.asset);
        match op {
            MovementOp::Withdraw => {
                let a = account.ok_or(RefusalCode::SourceAccountNotFound)?;
                match a.status {
                    AccountStatus::Frozen => return Err(RefusalCode::AccountFrozen),
                    AccountStatus::Disabled => return Err(RefusalCode::AccountDisabled),
                    AccountStatus::Active => {}
                }
                if a.available < amount {
                    return Err(RefusalCode::InsufficientBalance);
                }
                Ok((a.available - amount).normalize())
            }
            MovementOp::Deposit => {
                if account.is_some_and(|a| a.status == AccountStatus::Disabled) {
                    return Err(RefusalCode::AccountDisabled);
                }
                credit(account.map_or(Decimal::ZERO, |a| a.available), amount)
            }
            MovementOp::Refund => {
                // Status is ignored: a refund puts money back where it was taken from.
                let matching = self
                    .remembered
                    .get(&(id, MovementOp::Withdraw))
                    .is_some_and(|w| {
                        w.outcome == APPLIED
                            && w.user_id == m.user_id
                            && self.asset_names[usize::from(w.asset)] == m.asset
                            && w.amount == amount
                    });
                if !matching {
                    return Err(RefusalCode::NoMatchingWithdraw);
                }
                credit(account.map_or(Decimal::ZERO, |a| a.available), amount)
            }
        }
    }

    fn set_status(&mut self, user_id: u64, asset: &str, status: AccountStatus) -> Effect {
        if let Some(moved) = self.moved(user_id) {
            return moved;
        }
        if !valid_user_id(user_id) {
            return Effect::refuse(RefusalCode::InvalidUserId);
        }
        if self.assets.precision(asset).is_none() {
            return Effect::refuse(RefusalCode::InvalidAsset);
        }
        let record = JournalRecord::SetStatus(StatusRecord {
            seq: self.last_seq + 1,
            user_id,
            asset: asset.to_string(),
            status,
        });
        self.apply_own(record.clone());
        Effect {
            response: Response::ok(),
            record: Some(record),
        }
    }

    /// Every op recorded under `req_id`; `REQ_ID_EXPIRED` (never an empty list) when the
    /// req_id is older than the horizon, since its records may have been forgotten.
    fn lookup(&self, req_id: &str, now_ms: u64) -> Effect {
        let id = match self.key_of(req_id, now_ms) {
            Ok(id) => id,
            Err(code) => return Effect::refuse(code),
        };
        let ops: Vec<LookupOp> = self
            .remembered
            .range((id, MovementOp::Withdraw)..=(id, MovementOp::Refund))
            .map(|((_, op), r)| self.lookup_op(*op, r))
            .collect();
        // The records of a moved-out partition's user are the target's to answer: it holds them
        // and any made since.
        if let Some(moved) = ops.first().and_then(|o| self.moved(o.user_id)) {
            return moved;
        }
        Effect::reply(ops_response(ops))
    }
}

fn ops_response(ops: Vec<LookupOp>) -> Response {
    Response::Ok {
        ops: Some(ops),
        balances: None,
        totals: None,
        records: None,
        core: None,
        protocol: None,
        moves: None,
    }
}

fn remembered_response(r: &Remembered, duplicate: bool) -> Response {
    match decode_outcome(r.outcome) {
        (Outcome::Applied, _) => Response::Applied {
            balance: r.balance.expect("applied records carry a balance"),
            duplicate,
            seq: r.seq,
        },
        (Outcome::Refused, code) => Response::refused(
            code.expect("refused records carry a code"),
            duplicate,
            Some(r.seq),
        ),
    }
}

fn movement_response(rec: &MovementRecord, duplicate: bool) -> Response {
    match (rec.outcome, rec.code) {
        (Outcome::Applied, _) => Response::Applied {
            balance: rec.balance.expect("applied records carry a balance"),
            duplicate,
            seq: rec.seq,
        },
        (Outcome::Refused, code) => Response::refused(
            code.expect("refused records carry a code"),
            duplicate,
            Some(rec.seq),
        ),
    }
}
