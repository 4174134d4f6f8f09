//! Applying a record: the only way the engine's state changes, live or at start-up. Each record
//! is checked against the state before it (contiguous seq, balance arithmetic, horizon and
//! retained position and map version only forward, a move whole: `moves.rs`) before anything
//! changes.

use rust_decimal::Decimal;

use super::outcome::{encode_outcome, APPLIED};
use super::values::{credit, max_amount};
use super::{Engine, Remembered, ReplayError};
use crate::invariant;
use crate::protocol::{JournalRecord, MovementOp, MovementRecord, Outcome};
use crate::ulid;

impl Engine {
    /// The only way state changes. Checks that `record` follows from the current state
    /// (contiguous seq, arithmetic matches the recorded balance, req_id not below the horizon,
    /// horizon and retain only forward) before touching anything.
    pub fn apply_record(&mut self, record: JournalRecord) -> Result<(), ReplayError> {
        let seq = record.seq();
        let replayed = if seq != self.last_seq + 1 {
            Err(format!("expected seq {}", self.last_seq + 1))
        } else {
            match &record {
                JournalRecord::Horizon(h) => self.replay_horizon(h.before_ms),
                JournalRecord::Retain(r) => self.replay_retain(r.after_seq, seq),
                JournalRecord::MapVersion(v) => self.replay_map_version(v.version),
                JournalRecord::MoveOut(m) => self.replay_move_out(m),
                JournalRecord::MoveIn(m) => self.replay_move_in(m),
                JournalRecord::SetStatus(s) => self
                    .intern(&s.asset)
                    .map(|asset| self.account_mut(s.user_id, asset).status = s.status),
                JournalRecord::Withdraw(_)
                | JournalRecord::Deposit(_)
                | JournalRecord::Refund(_) => match record.as_movement() {
                    Some((op, m)) => self.replay_movement(seq, op, m),
                    None => Err("not a movement".into()),
                },
            }
        };
        replayed.map_err(|reason| ReplayError { seq, reason })?;
        self.last_seq = seq;
        Ok(())
    }

    fn replay_horizon(&mut self, before_ms: u64) -> Result<(), String> {
        if before_ms <= self.horizon_ms {
            return Err(format!(
                "horizon {} does not move forward from {}",
                before_ms, self.horizon_ms
            ));
        }
        self.horizon_ms = before_ms;
        // Everything created before the horizon goes in one split.
        let keep = self
            .remembered
            .split_off(&(ulid::lower_bound(before_ms), MovementOp::Withdraw));
        self.remembered = keep;
        Ok(())
    }

    fn replay_retain(&mut self, after_seq: u64, seq: u64) -> Result<(), String> {
        if after_seq <= self.retain_after || after_seq >= seq {
            return Err(format!(
                "retain {} does not move forward from {} or is not before its own seq",
                after_seq, self.retain_after
            ));
        }
        self.retain_after = after_seq;
        Ok(())
    }

    fn replay_map_version(&mut self, version: u64) -> Result<(), String> {
        if version <= self.map_version {
            return Err(format!(
                "map version {version} does not move forward from {}",
                self.map_version
            ));
        }
        self.map_version = version;
        Ok(())
    }

    /// A recorded movement, checked whole (key, horizon, amount, outcome, balance arithmetic)
    /// before anything changes.
    fn replay_movement(
        &mut self,
        seq: u64,
        op: MovementOp,
        m: &MovementRecord,
    ) -> Result<(), String> {
        let Some(id) = ulid::parse(&m.req_id) else {
            return Err(format!("req_id {} is not a ULID", m.req_id));
        };
        if ulid::time_ms(id) < self.horizon_ms {
            return Err(format!(
                "req_id {} is older than the horizon {}",
                m.req_id, self.horizon_ms
            ));
        }
        if self.remembered.contains_key(&(id, op)) {
            return Err(format!("second {} for req_id {}", op.as_str(), m.req_id));
        }
        if m.amount <= Decimal::ZERO || m.amount > max_amount() {
            return Err("invalid amount".into());
        }
        let outcome = match (m.outcome, m.code, m.balance) {
            (Outcome::Refused, Some(code), None) => encode_outcome(Some(code)),
            (Outcome::Applied, None, Some(_)) => APPLIED,
            _ => return Err("outcome, code and balance disagree".into()),
        };
        // Check everything before changing anything (interning included).
        let new_balance = self.replayed_balance(op, m)?;
        let asset = self.intern(&m.asset)?;
        if let Some(new) = new_balance {
            let total = self.totals.entry(asset).or_insert(Decimal::ZERO);
            *total = if op == MovementOp::Withdraw {
                *total - m.amount
            } else {
                *total + m.amount
            };
            let total = *total;
            self.account_mut(m.user_id, asset).available = new.normalize();
            // Checked above (`replayed_balance`, a withdraw within the balance): so no balance,
            // and no asset's total, is ever below zero, whatever the record said.
            invariant!(
                new >= Decimal::ZERO && total >= Decimal::ZERO,
                "seq {seq}: {} left {} {} at {new}, the asset's total at {total}",
                op.as_str(),
                m.user_id,
                m.asset
            );
        }
        let remembered = Remembered {
            user_id: m.user_id,
            seq,
            amount: m.amount,
            balance: m.balance,
            asset,
            outcome,
        };
        self.remembered.insert((id, op), remembered);
        Ok(())
    }

    /// The balance an applied movement leaves, checked against the one it recorded (none for a
    /// refusal).
    fn replayed_balance(
        &self,
        op: MovementOp,
        m: &MovementRecord,
    ) -> Result<Option<Decimal>, String> {
        let Some(recorded) = m.balance else {
            return Ok(None);
        };
        let current = self
            .asset_ids
            .get(&m.asset)
            .and_then(|a| self.accounts.get(&(m.user_id, *a)))
            .map(|a| a.available);
        let new = match (op, current) {
            (MovementOp::Withdraw, Some(cur)) if cur >= m.amount => cur - m.amount,
            (MovementOp::Withdraw, _) => return Err("withdraw exceeds the balance".into()),
            (MovementOp::Refund, None) => return Err("refund into a missing account".into()),
            (_, cur) => match credit(cur.unwrap_or(Decimal::ZERO), m.amount) {
                Ok(v) => v,
                Err(_) => return Err("credit exceeds 10^20".into()),
            },
        };
        if new != recorded {
            return Err(format!("computed balance {new} but recorded {recorded}"));
        }
        Ok(Some(new))
    }
}
