//! The SPOT account state machine: pure, deterministic, no I/O.
//!
//! `Engine::apply` turns a request into a response plus, for anything that changes durable
//! state, the WAL record to persist. Every state change, whether live or during replay, goes
//! through `Engine::apply_record`, so replaying the WAL rebuilds exactly the state that
//! produced it.
//!
//! Memory follows what is live, not history: accounts, and one compact entry per remembered
//! `(req_id, op)` keyed by the req_id's ULID value. Entries whose ULID is older than the
//! idempotency horizon are forgotten with one split of the ordered map; such req_ids are refused
//! `REQ_ID_EXPIRED` from then on (final, since the horizon never moves backwards). The journal
//! itself is not kept here: it is served from the WAL segments on disk.
//!
//! Its parts: this file holds the state and its queries; in `engine/`, `apply.rs` decides
//! requests, `replay.rs` applies records, `values.rs` checks a request's values and
//! `outcome.rs` numbers recorded outcomes, `moves.rs` moves a partition out and in.

mod apply;
mod moves;
mod outcome;
mod replay;
mod values;

use std::collections::{BTreeMap, HashMap};

use rust_decimal::Decimal;

use crate::assets::Assets;
use crate::protocol::{
    AccountStatus, BalanceEntry, CoreStatus, JournalRecord, LookupOp, MoveKind, MoveRecord,
    MovementOp, RefusalCode, Response, TotalEntry,
};

use outcome::decode_outcome;
pub(crate) use outcome::try_decode_outcome;
pub use values::{max_amount, parse_amount, valid_req_id, valid_user_id, MAX_REQ_ID_FUTURE_MS};

/// What the engine decided for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Effect {
    pub response: Response,
    /// The record to make durable before `response` may be sent; `None` for reads and for
    /// refusals that are not recorded.
    pub record: Option<JournalRecord>,
}

impl Effect {
    fn reply(response: Response) -> Effect {
        Effect {
            response,
            record: None,
        }
    }

    fn refuse(code: RefusalCode) -> Effect {
        Effect::reply(Response::refused(code, false, None))
    }
}

/// A WAL record that cannot have been produced by this engine from the preceding records.
#[derive(Debug, thiserror::Error)]
#[error("WAL record seq {seq} is inconsistent with the records before it: {reason}")]
pub struct ReplayError {
    pub seq: u64,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Account {
    pub(crate) available: Decimal,
    pub(crate) status: AccountStatus,
}

/// What is kept of one recorded `(req_id, op)`: enough to answer a duplicate verbatim, a
/// `lookup`, a `cancel` and a refund's matching check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Remembered {
    pub(crate) user_id: u64,
    pub(crate) seq: u64,
    pub(crate) amount: Decimal,
    /// Balance right after an applied movement; `None` for refusals.
    pub(crate) balance: Option<Decimal>,
    /// Index into `Engine::asset_names`.
    pub(crate) asset: u16,
    /// `encode_outcome` of the outcome and refusal code.
    pub(crate) outcome: u8,
}

/// Key of a remembered record: the req_id's ULID value, then the op. Ordered by creation time.
pub(crate) type Key = (u128, MovementOp);

#[derive(Debug, Clone, PartialEq)]
pub struct Engine {
    pub(crate) assets: Assets,
    /// Every asset symbol met in a record, interned; accounts and remembered records refer to
    /// them by index. Only grows by configured symbols (and any a replayed record names).
    pub(crate) asset_names: Vec<String>,
    pub(crate) asset_ids: HashMap<String, u16>,
    pub(crate) accounts: BTreeMap<(u64, u16), Account>,
    /// Sum of `available` per asset index, kept up to date so `totals` is cheap.
    pub(crate) totals: BTreeMap<u16, Decimal>,
    pub(crate) last_seq: u64,
    /// Idempotency horizon, Unix ms: req_ids created before it are forgotten and refused.
    pub(crate) horizon_ms: u64,
    /// The conservation check's consumed position (`retain`).
    pub(crate) retain_after: u64,
    /// The highest cell map version a `hello` has named (0: none seen): a `hello` naming a
    /// lower one is refused `STALE_MAP` (ADR 0023 §1).
    pub(crate) map_version: u64,
    pub(crate) remembered: BTreeMap<Key, Remembered>,
    /// The partitions moved out of this engine (ADR 0023 §4), each with the `move_id` that moved
    /// it: their users' movements are answered `MOVED`.
    pub(crate) moved_out: BTreeMap<u8, String>,
    /// Every move this engine took part in, by `move_id`: what a retry and `move_lookup` answer.
    /// Kept for good (moves are rare; each holds its partition's state).
    pub(crate) moves: BTreeMap<String, (MoveKind, MoveRecord)>,
}

impl Engine {
    pub fn new(assets: Assets) -> Engine {
        Engine {
            assets,
            asset_names: Vec::new(),
            asset_ids: HashMap::new(),
            accounts: BTreeMap::new(),
            totals: BTreeMap::new(),
            last_seq: 0,
            horizon_ms: 0,
            retain_after: 0,
            map_version: 0,
            remembered: BTreeMap::new(),
            moved_out: BTreeMap::new(),
            moves: BTreeMap::new(),
        }
    }

    /// Seq of the newest record (0 when empty).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    pub fn horizon_ms(&self) -> u64 {
        self.horizon_ms
    }

    pub fn retain_after(&self) -> u64 {
        self.retain_after
    }

    /// The highest cell map version a `hello` has named (0: none).
    pub fn map_version(&self) -> u64 {
        self.map_version
    }

    /// `(req_id, op)` records remembered in RAM.
    pub fn remembered(&self) -> usize {
        self.remembered.len()
    }

    /// Available balance and status of one account, if it exists.
    pub fn account(&self, user_id: u64, asset: &str) -> Option<(Decimal, AccountStatus)> {
        let id = *self.asset_ids.get(asset)?;
        self.accounts
            .get(&(user_id, id))
            .map(|a| (a.available, a.status))
    }

    /// The counters this engine knows; the storage fields are left for the WAL layer to fill.
    pub fn core_status(&self) -> CoreStatus {
        CoreStatus {
            last_seq: self.last_seq,
            horizon_ms: self.horizon_ms,
            retain_after: self.retain_after,
            remembered: self.remembered.len() as u64,
            accounts: self.accounts.len() as u64,
            map_version: self.map_version,
            ..CoreStatus::default()
        }
    }

    fn core_response(&self) -> Response {
        Response::Ok {
            ops: None,
            balances: None,
            totals: None,
            records: None,
            core: Some(self.core_status()),
            protocol: None,
            moves: None,
        }
    }

    fn account_of(&self, user_id: u64, asset: &str) -> Option<&Account> {
        let id = *self.asset_ids.get(asset)?;
        self.accounts.get(&(user_id, id))
    }

    fn lookup_op(&self, op: MovementOp, r: &Remembered) -> LookupOp {
        let (outcome, code) = decode_outcome(r.outcome);
        LookupOp {
            op,
            user_id: r.user_id,
            asset: self.asset_names[usize::from(r.asset)].clone(),
            amount: r.amount,
            outcome,
            code,
            seq: r.seq,
        }
    }

    pub fn balances(&self, user_id: u64) -> Vec<BalanceEntry> {
        let mut out: Vec<BalanceEntry> = self
            .accounts
            .range((user_id, 0)..=(user_id, u16::MAX))
            .map(|((_, asset), a)| BalanceEntry {
                asset: self.asset_names[usize::from(*asset)].clone(),
                available: a.available,
                status: a.status,
            })
            .collect();
        out.sort_by(|a, b| a.asset.cmp(&b.asset));
        out
    }

    /// Every asset's total added up: a batch's money before and after it (`wal/commit.rs`'s
    /// check). O(assets). `None` past `Decimal`'s range (then there is nothing to compare).
    pub(crate) fn money(&self) -> Option<Decimal> {
        self.totals
            .values()
            .try_fold(Decimal::ZERO, |sum, t| sum.checked_add(*t))
    }

    /// Per-asset sum of balances, listing every configured asset even at zero.
    pub fn totals(&self) -> Vec<TotalEntry> {
        let mut all: BTreeMap<&str, Decimal> =
            self.assets.symbols().map(|s| (s, Decimal::ZERO)).collect();
        for (asset, sum) in &self.totals {
            all.insert(&self.asset_names[usize::from(*asset)], *sum);
        }
        all.into_iter()
            .map(|(asset, sum)| TotalEntry {
                asset: asset.to_string(),
                sum: sum.normalize(),
            })
            .collect()
    }

    /// The index of an asset symbol, interning it on first use.
    fn intern(&mut self, asset: &str) -> Result<u16, String> {
        if let Some(id) = self.asset_ids.get(asset) {
            return Ok(*id);
        }
        let id = u16::try_from(self.asset_names.len())
            .map_err(|_| "more than 65536 distinct assets".to_string())?;
        self.asset_names.push(asset.to_string());
        self.asset_ids.insert(asset.to_string(), id);
        Ok(id)
    }

    /// The account, created active and empty when missing.
    fn account_mut(&mut self, user_id: u64, asset: u16) -> &mut Account {
        self.accounts.entry((user_id, asset)).or_insert(Account {
            available: Decimal::ZERO,
            status: AccountStatus::Active,
        })
    }
}

#[cfg(test)]
mod tests;
