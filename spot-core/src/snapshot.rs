//! Snapshots: everything spot-core needs to start, in one checksummed binary file, so a
//! restart reads the snapshot and only the WAL after it instead of the whole history.
//!
//! File `snapshot-<seq, 20 digits>.snap`, little endian:
//!
//! ```text
//! header (32 bytes): magic "SPOTSNAP" | u32 format version (1, 2 or 3) | u32 crc32 of the body
//!                    | u64 seq | u64 body length
//! body:  u64 last_seq | u64 horizon_ms | u64 retain_after
//!        | u64 first seq of the WAL segment holding seq + 1 | u64 its byte offset
//!        | u32 n, n × (u16 len, asset symbol bytes)                          asset table
//!        | u64 n, n × (u64 user, u16 asset, u8 status, [16] available)       accounts, sorted
//!        | u32 n, n × (u16 asset, [16] sum)                                  totals, sorted
//!        | u64 n, n × ([16] req_id ULID, u8 op, u64 user, u16 asset, u8 outcome, u64 seq,
//!                      [16] amount, u8 has balance, [16] balance)            remembered, sorted
//!        | format 2 only: u64 map version (never 0)
//!        | format 3 only: u64 map version (0: none)
//!          | u32 n, n × (u8 partition, u16 len, move_id bytes)   moved-out partitions, ascending
//!          | u32 n, n × (u8 kind 0 out / 1 in, u32 len, JSON)    moves by move_id (n > 0), each
//!                                                               its WAL record's `MoveRecord`
//! ```
//!
//! Format 3 adds the partitions moved out and every move the engine took part in (ADR 0023 §4):
//! written only when there is a move, so an engine without one writes format 1 or 2 as before.
//! A move's JSON is what `serde_json` writes for it: a decoder refuses any other spelling (one
//! state, one file), and a moved-out partition whose move is not its `move_out`.
//!
//! Format 2 adds the highest cell map version a `hello` named (ADR 0023 §1). It is written only
//! when the engine has seen one; an engine that has not writes format 1, byte for byte what an
//! older spot-core writes and reads, and a format 1 file reads as map version 0. One state, one
//! file: a format 2 file with map version 0 is invalid.
//!
//! Decimals are `rust_decimal`'s 16-byte serialization. A file that is short, long, has another
//! magic or version, a seq that disagrees with its name, a checksum that does not match, or a
//! body that does not decode to a consistent state (unsorted keys, unknown enum values, totals
//! that are not the sum of the balances) is invalid; start-up then uses the previous snapshot.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use rust_decimal::Decimal;

use crate::assets::Assets;
use crate::engine::{max_amount, try_decode_outcome, Account, Engine, Key, Remembered};
use crate::invariant;
use crate::protocol::{AccountStatus, MoveKind, MoveRecord, MovementOp};
use crate::storage::{parse_seq_name, sync_dir, FailPoints};

pub const MAGIC: &[u8; 8] = b"SPOTSNAP";
/// The newest format, written when the engine has seen a map version.
pub const FORMAT_VERSION: u32 = 2;
/// The format without a map version: written when the engine has seen none, and still read.
pub const FORMAT_VERSION_NO_MAP: u32 = 1;
/// The format with the partitions moved out and the moves (ADR 0023 §4):
/// written when the engine took part in a move.
pub const FORMAT_VERSION_MOVES: u32 = 3;
pub const HEADER_BYTES: usize = 32;

/// Where the WAL record after a snapshot's seq starts: the segment (by its first seq) and the
/// byte offset in it. Lets start-up seek there instead of reading the segment from its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalPosition {
    pub segment: u64,
    pub offset: u64,
}

pub fn file_name(seq: u64) -> String {
    format!("snapshot-{seq:020}.snap")
}

/// The seq of a snapshot file name (not of its `.tmp`).
pub fn parse_name(name: &str) -> Option<u64> {
    parse_seq_name(name, "snapshot-", ".snap")
}

/// The whole file (header and body) for the engine's current state.
pub fn encode(engine: &Engine, pos: WalPosition) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(engine, pos, &mut out);
    out
}

/// `encode` into `out` (cleared first). Reusing the buffer of the previous snapshot spares
/// the engine thread the page faults of a fresh allocation, which dominate the pause.
pub fn encode_into(engine: &Engine, pos: WalPosition, out: &mut Vec<u8>) {
    out.clear();
    out.reserve(HEADER_BYTES + 64 + engine.accounts.len() * 35 + engine.remembered.len() * 80);
    out.extend_from_slice(&[0u8; HEADER_BYTES]);
    let put64 = |out: &mut Vec<u8>, v: u64| out.extend_from_slice(&v.to_le_bytes());
    put64(out, engine.last_seq);
    put64(out, engine.horizon_ms);
    put64(out, engine.retain_after);
    put64(out, pos.segment);
    put64(out, pos.offset);
    out.extend_from_slice(&(engine.asset_names.len() as u32).to_le_bytes());
    for name in &engine.asset_names {
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
    }
    encode_accounts(engine, out);
    out.extend_from_slice(&(engine.totals.len() as u32).to_le_bytes());
    for (asset, sum) in &engine.totals {
        out.extend_from_slice(&asset.to_le_bytes());
        out.extend_from_slice(&sum.serialize());
    }
    put64(out, engine.remembered.len() as u64);
    for ((id, op), r) in &engine.remembered {
        out.extend_from_slice(&id.to_le_bytes());
        out.push(op_byte(*op));
        put64(out, r.user_id);
        out.extend_from_slice(&r.asset.to_le_bytes());
        out.push(r.outcome);
        put64(out, r.seq);
        out.extend_from_slice(&r.amount.serialize());
        out.push(u8::from(r.balance.is_some()));
        out.extend_from_slice(&r.balance.unwrap_or(Decimal::ZERO).serialize());
    }
    let format = if !engine.moves.is_empty() {
        put64(out, engine.map_version);
        encode_moves(engine, out);
        FORMAT_VERSION_MOVES
    } else if engine.map_version == 0 {
        FORMAT_VERSION_NO_MAP
    } else {
        put64(out, engine.map_version);
        FORMAT_VERSION
    };
    let body_len = (out.len() - HEADER_BYTES) as u64;
    let crc = crc32fast::hash(&out[HEADER_BYTES..]);
    out[0..8].copy_from_slice(MAGIC);
    out[8..12].copy_from_slice(&format.to_le_bytes());
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    out[16..24].copy_from_slice(&engine.last_seq.to_le_bytes());
    out[24..32].copy_from_slice(&body_len.to_le_bytes());
}

/// The accounts, sorted, and the engine's invariant over them checked as they are written.
fn encode_accounts(engine: &Engine, out: &mut Vec<u8>) {
    let put64 = |out: &mut Vec<u8>, v: u64| out.extend_from_slice(&v.to_le_bytes());
    put64(out, engine.accounts.len() as u64);
    // The balances added up per asset as they are written: the engine's invariant that no
    // balance is below zero and every total is the sum of its balances, checked once per
    // snapshot (its cost is the write's own walk). `decode` refuses a body that breaks it, so a
    // snapshot written from a broken state would be set aside at the next start.
    let mut sums: Vec<Option<Decimal>> = vec![Some(Decimal::ZERO); engine.asset_names.len()];
    for ((user, asset), a) in &engine.accounts {
        put64(out, *user);
        out.extend_from_slice(&asset.to_le_bytes());
        out.push(status_byte(a.status));
        out.extend_from_slice(&a.available.serialize());
        invariant!(
            a.available >= Decimal::ZERO,
            "account {user} holds {} of asset {asset}",
            a.available
        );
        if let Some(sum) = sums.get_mut(usize::from(*asset)) {
            *sum = sum.and_then(|s| s.checked_add(a.available));
        }
    }
    check_totals(engine, &sums);
}

/// Every asset's total is the sum of its balances (`sums`, per asset index; `None` past
/// `Decimal`'s range), and an asset without a total holds nothing.
fn check_totals(engine: &Engine, sums: &[Option<Decimal>]) {
    for (asset, sum) in sums.iter().enumerate() {
        let total = u16::try_from(asset)
            .ok()
            .and_then(|a| engine.totals.get(&a))
            .copied()
            .unwrap_or(Decimal::ZERO);
        invariant!(
            *sum == Some(total),
            "asset {} totals {total}, its balances add up to {sum:?}",
            engine.asset_names[asset]
        );
    }
    invariant!(
        engine
            .totals
            .keys()
            .all(|a| usize::from(*a) < engine.asset_names.len()),
        "a total for an asset the engine never named"
    );
}

/// The seq a file's header claims, if the header is readable (no body check).
pub fn header_seq(bytes: &[u8]) -> Option<u64> {
    (bytes.len() >= HEADER_BYTES && &bytes[0..8] == MAGIC)
        .then(|| u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes")))
}

/// Check and decode a whole snapshot file into an engine with `assets`.
pub fn decode(bytes: &[u8], assets: Assets) -> anyhow::Result<(Engine, WalPosition)> {
    let (format, seq, body) = checked_body(bytes)?;
    let mut r = Reader { bytes: body, at: 0 };
    let mut engine = Engine::new(assets);
    engine.last_seq = r.u64()?;
    if engine.last_seq != seq {
        bail!("body seq {} differs from header seq {seq}", engine.last_seq);
    }
    engine.horizon_ms = r.u64()?;
    engine.retain_after = r.u64()?;
    let pos = WalPosition {
        segment: r.u64()?,
        offset: r.u64()?,
    };
    let n_assets = decode_assets(&mut r, &mut engine)?;
    let sums = decode_accounts(&mut r, &mut engine, n_assets)?;
    decode_totals(&mut r, &mut engine, n_assets, &sums)?;
    decode_remembered(&mut r, &mut engine, n_assets)?;
    if format == FORMAT_VERSION {
        engine.map_version = r.u64()?;
        if engine.map_version == 0 {
            bail!("format {FORMAT_VERSION} with map version 0 (written as format {FORMAT_VERSION_NO_MAP})");
        }
    }
    if format == FORMAT_VERSION_MOVES {
        engine.map_version = r.u64()?;
        decode_moves(&mut r, &mut engine)?;
    }
    if r.at != body.len() {
        bail!("{} unread bytes after the body", body.len() - r.at);
    }
    Ok((engine, pos))
}

/// The header's checks (length, magic, version, body length, checksum); the format, the seq it
/// claims and the body.
fn checked_body(bytes: &[u8]) -> anyhow::Result<(u32, u64, &[u8])> {
    if bytes.len() < HEADER_BYTES {
        bail!("{} bytes is shorter than the header", bytes.len());
    }
    let mut header = Reader { bytes, at: 0 };
    if header.take(8)? != MAGIC {
        bail!("bad magic");
    }
    let version = header.u32()?;
    if ![FORMAT_VERSION_NO_MAP, FORMAT_VERSION, FORMAT_VERSION_MOVES].contains(&version) {
        bail!(
            "format version {version}, this spot-core reads {FORMAT_VERSION_NO_MAP} to \
             {FORMAT_VERSION_MOVES}"
        );
    }
    let crc = header.u32()?;
    let seq = header.u64()?;
    let body_len = header.u64()?;
    let body = &bytes[HEADER_BYTES..];
    if body.len() as u64 != body_len {
        bail!(
            "body is {} bytes, the header says {body_len} (truncated or extended)",
            body.len()
        );
    }
    if crc32fast::hash(body) != crc {
        bail!("checksum mismatch");
    }
    Ok((version, seq, body))
}

/// An asset index within the asset table.
fn asset_ok(a: u16, n_assets: u32) -> anyhow::Result<u16> {
    if u32::from(a) < n_assets {
        Ok(a)
    } else {
        bail!("asset index {a} out of range")
    }
}

/// The asset table; returns its length.
fn decode_assets(r: &mut Reader<'_>, engine: &mut Engine) -> anyhow::Result<u32> {
    let n_assets = r.u32()?;
    for _ in 0..n_assets {
        let len = usize::from(r.u16()?);
        let name = std::str::from_utf8(r.take(len)?)
            .context("asset symbol is not UTF-8")?
            .to_string();
        let id = u16::try_from(engine.asset_names.len()).context("too many assets")?;
        if engine.asset_ids.insert(name.clone(), id).is_some() {
            bail!("asset {name} listed twice");
        }
        engine.asset_names.push(name);
    }
    Ok(n_assets)
}

/// The accounts, sorted; returns each asset's sum of balances.
fn decode_accounts(
    r: &mut Reader<'_>,
    engine: &mut Engine,
    n_assets: u32,
) -> anyhow::Result<BTreeMap<u16, Decimal>> {
    let n = r.u64()?;
    let mut accounts = Vec::with_capacity(usize::try_from(n.min(1 << 24))?);
    let mut sums: BTreeMap<u16, Decimal> = BTreeMap::new();
    for _ in 0..n {
        let user = r.u64()?;
        let asset = asset_ok(r.u16()?, n_assets)?;
        let status = match r.u8()? {
            0 => AccountStatus::Active,
            1 => AccountStatus::Frozen,
            2 => AccountStatus::Disabled,
            s => bail!("unknown account status {s}"),
        };
        let available = r.decimal()?;
        if available < Decimal::ZERO || available > max_amount() {
            bail!("balance {available} is outside 0..=10^20");
        }
        if accounts.last().is_some_and(|(k, _)| *k >= (user, asset)) {
            bail!("accounts are not sorted");
        }
        let sum = sums.entry(asset).or_insert(Decimal::ZERO);
        *sum = sum
            .checked_add(available)
            .context("the balances of one asset overflow a decimal")?;
        accounts.push(((user, asset), Account { available, status }));
    }
    engine.accounts = accounts.into_iter().collect();
    Ok(sums)
}

/// The per-asset totals, each the sum of its balances.
fn decode_totals(
    r: &mut Reader<'_>,
    engine: &mut Engine,
    n_assets: u32,
    sums: &BTreeMap<u16, Decimal>,
) -> anyhow::Result<()> {
    let n = r.u32()?;
    for _ in 0..n {
        let asset = asset_ok(r.u16()?, n_assets)?;
        let sum = r.decimal()?;
        if sums.get(&asset).copied().unwrap_or(Decimal::ZERO) != sum {
            bail!("total of asset index {asset} is not the sum of its balances");
        }
        if engine.totals.insert(asset, sum).is_some() {
            bail!("total of asset index {asset} listed twice");
        }
    }
    if sums
        .iter()
        .any(|(a, s)| !s.is_zero() && !engine.totals.contains_key(a))
    {
        bail!("balances of an asset without a total");
    }
    Ok(())
}

/// The remembered first results, sorted by key.
fn decode_remembered(r: &mut Reader<'_>, engine: &mut Engine, n_assets: u32) -> anyhow::Result<()> {
    let n = r.u64()?;
    let mut remembered: Vec<(Key, Remembered)> =
        Vec::with_capacity(usize::try_from(n.min(1 << 26))?);
    for _ in 0..n {
        let id = r.u128()?;
        let o = r.u8()?;
        let op = *OP_CODES
            .get(usize::from(o))
            .with_context(|| format!("unknown op {o}"))?;
        let user_id = r.u64()?;
        let asset = asset_ok(r.u16()?, n_assets)?;
        let outcome = r.u8()?;
        let (_, code) = try_decode_outcome(outcome).context("unknown outcome")?;
        let seq = r.u64()?;
        let amount = r.decimal()?;
        let has_balance = r.u8()?;
        let balance = r.decimal()?;
        let balance = match (has_balance, code) {
            (1, None) => Some(balance),
            // A refusal has no balance: the writer puts a plain zero there, and anything else
            // would be a second file for the same state (ignored bytes hide damage).
            (0, Some(_)) if balance.serialize() == Decimal::ZERO.serialize() => None,
            (0, Some(_)) => bail!("a refused record carries a balance {balance}"),
            _ => bail!("outcome and balance disagree"),
        };
        if remembered.last().is_some_and(|(k, _)| *k >= (id, op)) {
            bail!("remembered records are not sorted");
        }
        let record = Remembered {
            user_id,
            seq,
            amount,
            balance,
            asset,
            outcome,
        };
        remembered.push(((id, op), record));
    }
    engine.remembered = remembered.into_iter().collect();
    Ok(())
}

fn status_byte(s: AccountStatus) -> u8 {
    match s {
        AccountStatus::Active => 0,
        AccountStatus::Frozen => 1,
        AccountStatus::Disabled => 2,
    }
}

/// Every movement op by its stored number (its index). Append only: snapshots store these
/// numbers.
const OP_CODES: [MovementOp; 3] = [
    MovementOp::Withdraw,
    MovementOp::Deposit,
    MovementOp::Refund,
];

fn op_byte(op: MovementOp) -> u8 {
    let i = OP_CODES
        .iter()
        .position(|o| *o == op)
        .expect("every op is listed");
    u8::try_from(i).expect("fewer than 256 ops")
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> anyhow::Result<&[u8]> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        let Some(end) = end else {
            bail!("body ends early at byte {}", self.at)
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn u8(&mut self) -> anyhow::Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn array<const N: usize>(&mut self) -> anyhow::Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    fn u16(&mut self) -> anyhow::Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> anyhow::Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> anyhow::Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn u128(&mut self) -> anyhow::Result<u128> {
        Ok(u128::from_le_bytes(self.array()?))
    }
    fn decimal(&mut self) -> anyhow::Result<Decimal> {
        let raw: [u8; 16] = self.array()?;
        // Byte 2 is the scale; Decimal supports at most 28.
        if raw[2] > 28 {
            bail!("decimal with scale {}", raw[2]);
        }
        // Bit 7 of byte 3 is the sign; `serialize` writes every other flag bit as zero. One
        // set is damage: `deserialize` would ignore it, and the file would not be the one
        // this state encodes to.
        if raw[0] != 0 || raw[1] != 0 || raw[3] & 0x7f != 0 {
            bail!("decimal with unknown flag bits {:02x?}", &raw[..4]);
        }
        Ok(Decimal::deserialize(raw))
    }
}

/// Appends format 3's tail: the moved-out partitions, then the moves (see the module doc).
fn encode_moves(engine: &Engine, out: &mut Vec<u8>) {
    out.extend_from_slice(&(engine.moved_out.len() as u32).to_le_bytes());
    for (partition, move_id) in &engine.moved_out {
        out.push(*partition);
        out.extend_from_slice(&(move_id.len() as u16).to_le_bytes());
        out.extend_from_slice(move_id.as_bytes());
    }
    out.extend_from_slice(&(engine.moves.len() as u32).to_le_bytes());
    for (kind, record) in engine.moves.values() {
        out.push(match kind {
            MoveKind::Out => 0,
            MoveKind::In => 1,
        });
        let json = serde_json::to_vec(record).expect("a move record serializes");
        out.extend_from_slice(&(json.len() as u32).to_le_bytes());
        out.extend_from_slice(&json);
    }
}

/// Reads the moves' tail into `engine`.
fn decode_moves(r: &mut Reader<'_>, engine: &mut Engine) -> anyhow::Result<()> {
    let n = r.u32()?;
    for _ in 0..n {
        let partition = r.u8()?;
        let len = usize::from(r.u16()?);
        let move_id = std::str::from_utf8(r.take(len)?)
            .context("move_id is not UTF-8")?
            .to_owned();
        if engine
            .moved_out
            .last_key_value()
            .is_some_and(|(p, _)| *p >= partition)
        {
            bail!("moved-out partitions are not ascending");
        }
        engine.moved_out.insert(partition, move_id);
    }
    let n = r.u32()?;
    if n == 0 {
        bail!("format 3 without a move");
    }
    for _ in 0..n {
        let kind = match r.u8()? {
            0 => MoveKind::Out,
            1 => MoveKind::In,
            k => bail!("unknown move kind {k}"),
        };
        let len = usize::try_from(r.u32()?)?;
        let json = r.take(len)?;
        let record: MoveRecord = serde_json::from_slice(json).context("a move record")?;
        if serde_json::to_vec(&record)? != json {
            bail!("move {} is not spelled as it is written", record.move_id);
        }
        if record.seq > engine.last_seq {
            bail!(
                "move {} at seq {} after the snapshot's",
                record.move_id,
                record.seq
            );
        }
        if engine
            .moves
            .last_key_value()
            .is_some_and(|(id, _)| *id >= record.move_id)
        {
            bail!("moves are not sorted by move_id");
        }
        engine.moves.insert(record.move_id.clone(), (kind, record));
    }
    for (partition, move_id) in &engine.moved_out {
        match engine.moves.get(move_id) {
            Some((MoveKind::Out, m)) if m.partition == *partition => {}
            _ => bail!("partition {partition} moved out by {move_id}, which is not its move_out"),
        }
    }
    Ok(())
}

/// Make `bytes` the durable snapshot `<dir>/snapshot-<seq>.snap`: write a `.tmp`, fsync it,
/// rename it into place, fsync the directory. The fail points abort the process between the
/// steps (crash tests).
pub fn write_file(dir: &Path, seq: u64, bytes: &[u8], fail: FailPoints) -> anyhow::Result<PathBuf> {
    let path = dir.join(file_name(seq));
    let tmp = dir.join(format!("{}.tmp", file_name(seq)));
    let mut f = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    drop(f);
    fail.hit(fail.snapshot_before_rename, "snapshot_before_rename");
    std::fs::rename(&tmp, &path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    fail.hit(fail.snapshot_before_dir_sync, "snapshot_before_dir_sync");
    sync_dir(dir)?;
    fail.hit(fail.snapshot_after_rename, "snapshot_after_rename");
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Request;
    use crate::ulid;
    use rust_decimal::Decimal;

    fn id(n: u128) -> String {
        ulid::format(ulid::from_parts(1_700_000_000_000 + n as u64, n))
    }

    fn sample() -> Engine {
        let mut e = Engine::new(Assets::builtin());
        for i in 0..50u128 {
            e.apply(&Request::deposit(
                id(i),
                1 + (i as u64 % 7),
                "USDT",
                Decimal::new(i as i64 + 1, 2),
            ));
            e.apply(&Request::withdraw(
                id(i),
                1 + (i as u64 % 7),
                "USDT",
                Decimal::new(3, 2),
            ));
        }
        e.apply(&Request::SetStatus {
            user_id: 3,
            asset: "BTC".into(),
            status: AccountStatus::Frozen,
        });
        e.apply(&Request::AdvanceHorizon {
            before_ms: 1_700_000_000_010,
        });
        e
    }

    #[test]
    fn round_trip_is_exact() {
        let e = sample();
        let pos = WalPosition {
            segment: 1,
            offset: 1234,
        };
        let bytes = encode(&e, pos);
        let (back, p) = decode(&bytes, Assets::builtin()).unwrap();
        assert_eq!(back, e);
        assert_eq!(p, pos);
        assert_eq!(header_seq(&bytes), Some(e.last_seq()));
    }

    #[test]
    fn any_damage_is_detected() {
        let bytes = encode(
            &sample(),
            WalPosition {
                segment: 1,
                offset: 0,
            },
        );
        for cut in [0, 10, HEADER_BYTES, bytes.len() / 2, bytes.len() - 1] {
            assert!(
                decode(&bytes[..cut], Assets::builtin()).is_err(),
                "cut {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer, Assets::builtin()).is_err());
        for byte in (0..bytes.len()).step_by(7) {
            let mut b = bytes.clone();
            b[byte] ^= 0x10;
            assert!(decode(&b, Assets::builtin()).is_err(), "flip at {byte}");
        }
    }

    /// A body the fuzz target gives a correct header: what only damage with a matching
    /// checksum (or a writer's bug) could produce.
    fn with_header(body: &[u8]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&FORMAT_VERSION_NO_MAP.to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
        out.extend_from_slice(&body[..8]);
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(body);
        out
    }

    /// A body with one asset, the given accounts `(user, raw decimal)` and their total.
    fn body(accounts: &[(u64, [u8; 16])], total: [u8; 16]) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [5u64, 0, 0, 1, 0] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&4u16.to_le_bytes());
        b.extend_from_slice(b"USDT");
        b.extend_from_slice(&(accounts.len() as u64).to_le_bytes());
        for (user, raw) in accounts {
            b.extend_from_slice(&user.to_le_bytes());
            b.extend_from_slice(&0u16.to_le_bytes());
            b.push(0);
            b.extend_from_slice(raw);
        }
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&total);
        b.extend_from_slice(&0u64.to_le_bytes());
        b
    }

    /// Found by the `snapshot` fuzz target: two balances whose sum overflows a decimal
    /// panicked in `+=` instead of refusing the file.
    #[test]
    fn cra_balances_whose_sum_overflows_are_refused_not_a_panic() {
        let big = Decimal::MAX.serialize();
        let bytes = with_header(&body(&[(1, big), (2, big)], big));
        let e = decode(&bytes, Assets::builtin()).unwrap_err();
        assert!(format!("{e:#}").contains("outside") || format!("{e:#}").contains("overflow"));
    }

    /// Found by the `snapshot` target's properties: a negative balance decoded (a state the
    /// engine never reaches), and stray flag bits in a decimal were ignored, so the file was
    /// not the one its state encodes to.
    #[test]
    fn cra_negative_balances_and_stray_decimal_flags_are_refused() {
        let minus = Decimal::new(-5, 0).serialize();
        let bytes = with_header(&body(&[(1, minus)], minus));
        assert!(decode(&bytes, Assets::builtin()).is_err());
        let mut stray = Decimal::new(5, 0).serialize();
        stray[0] = 1;
        let bytes = with_header(&body(&[(1, stray)], Decimal::new(5, 0).serialize()));
        assert!(decode(&bytes, Assets::builtin()).is_err());
        let clean = Decimal::new(5, 0).serialize();
        let bytes = with_header(&body(&[(1, clean)], clean));
        let (engine, pos) = decode(&bytes, Assets::builtin()).unwrap();
        assert_eq!(encode(&engine, pos), bytes, "a clean file round-trips");
    }

    /// Found by the fuzz target (`fuzz/regressions/snapshot/crash-fed8fe32…`): the balance field
    /// of a remembered refusal was read and ignored, so a file with any bytes there decoded to
    /// the same state as the canonical one (and re-encoded to other bytes).
    #[test]
    fn cra_a_balance_beside_a_remembered_refusal_is_refused_not_ignored() {
        let mut e = Engine::new(Assets::builtin());
        // A withdraw from an empty account: refused, remembered without a balance, last.
        e.apply(&Request::withdraw(id(1), 1, "USDT", Decimal::new(5, 0)));
        let pos = WalPosition {
            segment: 1,
            offset: 0,
        };
        let bytes = encode(&e, pos);
        assert!(decode(&bytes, Assets::builtin()).is_ok());
        let mut body = bytes[HEADER_BYTES..].to_vec();
        let at = body.len() - 16;
        body[at..].copy_from_slice(&Decimal::new(2, 0).serialize());
        let damaged = with_header(&body);
        let err = decode(&damaged, Assets::builtin()).unwrap_err().to_string();
        assert!(err.contains("carries a balance"), "{err}");
    }

    /// The map version a `hello` named travels in the snapshot (format 2); an engine that has
    /// seen none writes format 1, the file an older spot-core wrote, which reads as version 0.
    #[test]
    fn the_map_version_round_trips_and_an_old_snapshot_reads_as_none() {
        let pos = WalPosition {
            segment: 1,
            offset: 0,
        };
        let old = sample();
        let old_bytes = encode(&old, pos);
        assert_eq!(old_bytes[8..12], FORMAT_VERSION_NO_MAP.to_le_bytes());
        let (back, _) = decode(&old_bytes, Assets::builtin()).unwrap();
        assert_eq!(back.map_version(), 0);
        assert_eq!(back, old);

        let mut e = sample();
        let hello = |v| Request::Hello {
            token: String::new(),
            cell: None,
            epoch: None,
            map_version: Some(v),
        };
        assert!(e.apply(&hello(7)).record.is_some());
        let bytes = encode(&e, pos);
        assert_eq!(bytes[8..12], FORMAT_VERSION.to_le_bytes());
        let (back, _) = decode(&bytes, Assets::builtin()).unwrap();
        assert_eq!(back.map_version(), 7);
        assert_eq!(back, e);
        assert_eq!(encode(&back, pos), bytes);

        // Format 2 naming version 0 is a second file for the format 1 state: refused.
        let mut body = bytes[HEADER_BYTES..].to_vec();
        let at = body.len() - 8;
        body[at..].copy_from_slice(&0u64.to_le_bytes());
        let mut zero = with_header(&body);
        zero[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        let err = decode(&zero, Assets::builtin()).unwrap_err().to_string();
        assert!(err.contains("map version 0"), "{err}");
    }

    #[test]
    fn names() {
        assert_eq!(parse_name(&file_name(42)), Some(42));
        assert_eq!(parse_name("snapshot-42.snap"), None);
        assert_eq!(parse_name(&format!("{}.tmp", file_name(42))), None);
    }
}
