//! A partition's move (ADR 0023 §4, `SPOT_MOVED`): `move_out` answers the partition's accounts
//! and its users' `(req_id, op)` records, takes the accounts out and marks the partition moved
//! out; `move_in` credits them into another engine and installs the records; `move_lookup`
//! answers either again. Both are WAL records, checked whole on replay before anything changes,
//! and idempotent by `move_id` (a retry gets the recorded answer).
//!
//! The source keeps its records of the moved users (they are what it answered), but answers
//! `MOVED` for every movement, cancel, status change, balance and lookup that concerns them:
//! after the move only the target's answer is whole. A `move_in` of a record the engine already
//! holds with the same details (a move back) keeps the one it holds.

use rust_decimal::Decimal;

use super::outcome::{decode_outcome, encode_outcome, APPLIED};
use super::values::{max_amount, valid_user_id};
use super::{Effect, Engine, Remembered};
use crate::invariant;
use crate::partition::partition_of;
use crate::protocol::{
    valid_move_id, ErrorCode, JournalRecord, MoveAnswer, MoveKind, MovePayload, MoveRecord,
    MovedAccount, MovedRecord, Outcome, Response,
};
use crate::storage::MAX_RECORD_BYTES;
use crate::ulid;

impl Engine {
    /// `MOVED` when `user_id`'s partition moved out of this engine; `None` otherwise (and at no
    /// cost while nothing moved out).
    pub(super) fn moved(&self, user_id: u64) -> Option<Effect> {
        if self.moved_out.is_empty() {
            return None;
        }
        let partition = partition_of(user_id);
        let move_id = self.moved_out.get(&partition)?;
        Some(Effect::reply(Response::Error {
            code: ErrorCode::Moved,
            message: format!(
                "user {user_id}'s partition {partition} moved out of this spot-core (move \
                 {move_id}): route it again under the new cell map"
            ),
        }))
    }

    /// The moved-out partitions, ascending.
    pub fn moved_out(&self) -> Vec<u8> {
        self.moved_out.keys().copied().collect()
    }

    pub(super) fn move_out(&mut self, move_id: &str, partition: u8) -> Effect {
        if let Some(answer) = self.known_move(move_id, MoveKind::Out, partition, None) {
            return answer;
        }
        if let Some(by) = self.moved_out.get(&partition) {
            return refused(format!(
                "partition {partition} already moved out of this spot-core (move {by})"
            ));
        }
        let record = JournalRecord::MoveOut(MoveRecord {
            seq: self.last_seq + 1,
            move_id: move_id.to_owned(),
            partition,
            payload: self.partition_state(partition),
        });
        let bytes = serde_json::to_vec(&record).map_or(usize::MAX, |v| v.len());
        if bytes > MAX_RECORD_BYTES as usize {
            return refused(format!(
                "partition {partition}'s state is {bytes} bytes of JSON; one WAL record holds at \
                 most {MAX_RECORD_BYTES}"
            ));
        }
        self.apply_own(record.clone());
        self.moved_effect(record)
    }

    pub(super) fn move_in(
        &mut self,
        move_id: &str,
        partition: u8,
        payload: &MovePayload,
    ) -> Effect {
        if let Some(answer) = self.known_move(move_id, MoveKind::In, partition, Some(payload)) {
            return answer;
        }
        // Records older than the horizon would be refused `REQ_ID_EXPIRED` here anyway: they are
        // not installed (replay refuses them).
        let horizon = self.horizon_ms;
        let mut payload = payload.clone();
        payload
            .records
            .retain(|r| ulid::parse(&r.req_id).is_none_or(|id| ulid::time_ms(id) >= horizon));
        let record = MoveRecord {
            seq: self.last_seq + 1,
            move_id: move_id.to_owned(),
            partition,
            payload,
        };
        let unknown_asset = (record.payload.accounts.iter().map(|a| &a.asset))
            .chain(record.payload.records.iter().map(|r| &r.asset))
            .find(|asset| self.assets.precision(asset).is_none());
        if let Some(asset) = unknown_asset {
            return refused(format!("asset {asset} is not configured here"));
        }
        if let Err(why) = self.check_move_in(&record) {
            return refused(why);
        }
        let record = JournalRecord::MoveIn(record);
        self.apply_own(record.clone());
        self.moved_effect(record)
    }

    pub(super) fn move_lookup(&self, move_id: &str) -> Effect {
        let moves = self
            .moves
            .get(move_id)
            .map(|(kind, record)| MoveAnswer::of(*kind, record))
            .into_iter()
            .collect();
        Effect::reply(moves_response(moves))
    }

    /// The answer to a move whose `move_id` is recorded (the same move: its first answer; another
    /// move: `MOVE_REFUSED`), or to an invalid `move_id`; `None` for a new one.
    fn known_move(
        &self,
        move_id: &str,
        kind: MoveKind,
        partition: u8,
        payload: Option<&MovePayload>,
    ) -> Option<Effect> {
        if !valid_move_id(move_id) {
            return Some(Effect::reply(Response::bad_request(
                "move_id must be 1 to 128 printable ASCII characters",
            )));
        }
        let (done, record) = self.moves.get(move_id)?;
        // A retried `move_in` carries the payload it first carried (less any records the
        // horizon has since passed, which the first one may have kept).
        let same_payload = payload.is_none_or(|p| {
            p.accounts == record.payload.accounts
                && record.payload.records.iter().all(|r| p.records.contains(r))
        });
        Some(
            if *done == kind && record.partition == partition && same_payload {
                Effect::reply(moves_response(vec![MoveAnswer::of(kind, record)]))
            } else {
                refused(format!(
                    "move_id {move_id} was a move_{} of partition {} with another payload",
                    if *done == MoveKind::Out { "out" } else { "in" },
                    record.partition
                ))
            },
        )
    }

    /// The answer to a move just recorded.
    fn moved_effect(&self, record: JournalRecord) -> Effect {
        let answer = match &record {
            JournalRecord::MoveOut(m) => MoveAnswer::of(MoveKind::Out, m),
            JournalRecord::MoveIn(m) => MoveAnswer::of(MoveKind::In, m),
            _ => unreachable!("only moves are answered here"),
        };
        Effect {
            response: moves_response(vec![answer]),
            record: Some(record),
        }
    }

    /// Partition `partition`'s accounts, sorted by user and asset symbol, and its users'
    /// remembered records, sorted by key. O(accounts + remembered).
    fn partition_state(&self, partition: u8) -> MovePayload {
        let mut last_user = None;
        let mut ours = false;
        let mut accounts = Vec::new();
        for ((user, asset), a) in &self.accounts {
            if last_user != Some(*user) {
                last_user = Some(*user);
                ours = partition_of(*user) == partition;
            }
            if ours {
                accounts.push(MovedAccount {
                    user_id: *user,
                    asset: self.asset_names[usize::from(*asset)].clone(),
                    available: a.available,
                    status: a.status,
                });
            }
        }
        accounts.sort_by(|a, b| (a.user_id, &a.asset).cmp(&(b.user_id, &b.asset)));
        let records = self
            .remembered
            .iter()
            .filter(|(_, r)| partition_of(r.user_id) == partition)
            .map(|((id, op), r)| {
                let (outcome, code) = decode_outcome(r.outcome);
                MovedRecord {
                    req_id: ulid::format(*id),
                    op: *op,
                    user_id: r.user_id,
                    asset: self.asset_names[usize::from(r.asset)].clone(),
                    amount: r.amount,
                    outcome,
                    code,
                    balance: r.balance,
                }
            })
            .collect();
        MovePayload { accounts, records }
    }

    /// A `move_out` record, checked against the state it took, then applied: the accounts
    /// leave, the partition is marked moved out.
    pub(super) fn replay_move_out(&mut self, m: &MoveRecord) -> Result<(), String> {
        if self.moves.contains_key(&m.move_id) {
            return Err(format!("move_id {} recorded twice", m.move_id));
        }
        if self.moved_out.contains_key(&m.partition) {
            return Err(format!("partition {} is already moved out", m.partition));
        }
        if self.partition_state(m.partition) != m.payload {
            return Err(format!(
                "the move_out's payload is not partition {}'s state",
                m.partition
            ));
        }
        for a in &m.payload.accounts {
            let asset = self.asset_ids[&a.asset];
            self.accounts.remove(&(a.user_id, asset));
            let total = self.totals.entry(asset).or_insert(Decimal::ZERO);
            *total -= a.available;
            invariant!(
                *total >= Decimal::ZERO,
                "seq {}: moving out {} of {} left the asset's total at {total}",
                m.seq,
                a.available,
                a.asset
            );
        }
        self.moved_out.insert(m.partition, m.move_id.clone());
        self.moves
            .insert(m.move_id.clone(), (MoveKind::Out, m.clone()));
        Ok(())
    }

    /// A `move_in` record, checked whole, then applied: balances credited, records installed,
    /// the partition's moved-out mark cleared.
    pub(super) fn replay_move_in(&mut self, m: &MoveRecord) -> Result<(), String> {
        self.check_move_in(m)?;
        for asset in (m.payload.accounts.iter().map(|a| &a.asset))
            .chain(m.payload.records.iter().map(|r| &r.asset))
        {
            self.intern(asset)?;
        }
        for a in &m.payload.accounts {
            let asset = self.asset_ids[&a.asset];
            let account = self.account_mut(a.user_id, asset);
            account.available = (account.available + a.available).normalize();
            account.status = a.status;
            *self.totals.entry(asset).or_insert(Decimal::ZERO) += a.available;
        }
        for r in &m.payload.records {
            let key = (ulid::parse(&r.req_id).expect("checked"), r.op);
            let remembered = Remembered {
                user_id: r.user_id,
                seq: m.seq,
                amount: r.amount,
                balance: r.balance,
                asset: self.asset_ids[&r.asset],
                outcome: encode_outcome(r.code),
            };
            self.remembered.entry(key).or_insert(remembered);
        }
        self.moved_out.remove(&m.partition);
        self.moves
            .insert(m.move_id.clone(), (MoveKind::In, m.clone()));
        Ok(())
    }

    /// Everything a `move_in` must be before it changes anything: a new `move_id`; accounts and
    /// records sorted, each once, all of users of the named partition; balances within 0..=10^20
    /// before and after the credit; records well formed, not older than the horizon, and none
    /// held here with other details.
    fn check_move_in(&self, m: &MoveRecord) -> Result<(), String> {
        if self.moves.contains_key(&m.move_id) {
            return Err(format!("move_id {} recorded twice", m.move_id));
        }
        let of_partition = |user: u64| -> Result<(), String> {
            if !valid_user_id(user) {
                return Err(format!("user_id {user} is invalid"));
            }
            let p = partition_of(user);
            if p != m.partition {
                return Err(format!(
                    "user {user} is of partition {p}, not {}",
                    m.partition
                ));
            }
            Ok(())
        };
        let accounts = &m.payload.accounts;
        if accounts
            .windows(2)
            .any(|w| (w[0].user_id, &w[0].asset) >= (w[1].user_id, &w[1].asset))
        {
            return Err("accounts are not sorted by user and asset, each once".into());
        }
        for a in accounts {
            of_partition(a.user_id)?;
            let held = self
                .account(a.user_id, &a.asset)
                .map_or(Decimal::ZERO, |h| h.0);
            let credited = held.checked_add(a.available);
            if a.available < Decimal::ZERO || credited.is_none_or(|c| c > max_amount()) {
                return Err(format!(
                    "user {}'s {} balance {} (held here: {held}) would leave 0..=10^20",
                    a.user_id, a.asset, a.available
                ));
            }
        }
        let mut last = None;
        for r in &m.payload.records {
            of_partition(r.user_id)?;
            let key = ulid::parse(&r.req_id)
                .map(|id| (id, r.op))
                .ok_or_else(|| format!("req_id {} is not a ULID", r.req_id))?;
            if last.is_some_and(|l| l >= key) {
                return Err("records are not sorted by req_id and op, each once".into());
            }
            last = Some(key);
            self.check_moved_record(key, r)?;
        }
        Ok(())
    }

    /// One moved record: not older than the horizon, well formed, and the same as any record
    /// held here under its key.
    fn check_moved_record(
        &self,
        key: (u128, crate::protocol::MovementOp),
        r: &MovedRecord,
    ) -> Result<(), String> {
        if ulid::time_ms(key.0) < self.horizon_ms {
            return Err(format!("req_id {} is older than the horizon", r.req_id));
        }
        if r.amount <= Decimal::ZERO || r.amount > max_amount() {
            return Err(format!("req_id {}: invalid amount {}", r.req_id, r.amount));
        }
        let outcome = match (r.outcome, r.code, r.balance) {
            (Outcome::Refused, Some(code), None) => encode_outcome(Some(code)),
            (Outcome::Applied, None, Some(b)) if b >= Decimal::ZERO && b <= max_amount() => APPLIED,
            _ => {
                return Err(format!(
                    "req_id {}: outcome, code and balance disagree",
                    r.req_id
                ))
            }
        };
        let Some(held) = self.remembered.get(&key) else {
            return Ok(());
        };
        let same = held.user_id == r.user_id
            && self.asset_names[usize::from(held.asset)] == r.asset
            && held.amount == r.amount
            && held.outcome == outcome
            && held.balance == r.balance;
        if !same {
            return Err(format!(
                "{} {} is held here with other details",
                r.op.as_str(),
                r.req_id
            ));
        }
        Ok(())
    }
}

fn refused(message: String) -> Effect {
    Effect::reply(Response::Error {
        code: ErrorCode::MoveRefused,
        message,
    })
}

fn moves_response(moves: Vec<MoveAnswer>) -> Response {
    Response::Ok {
        ops: None,
        balances: None,
        totals: None,
        records: None,
        core: None,
        protocol: None,
        moves: Some(Box::new(moves)),
    }
}

#[cfg(test)]
mod tests;
