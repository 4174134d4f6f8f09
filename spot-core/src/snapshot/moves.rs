//! Format 3's tail: the partitions moved out of the engine and every move it took part in (ADR
//! 0023 §4), after the map version.
//!
//! ```text
//! u32 n, n × (u8 partition, u16 len, move_id bytes)          moved-out partitions, ascending
//! u32 n, n × (u8 kind 0 out / 1 in, u32 len, JSON bytes)      moves (their WAL records'
//!                                                             MoveRecord), by move_id
//! ```
//!
//! The JSON is what `serde_json` writes for the record: a decoder refuses any other spelling of
//! it (one state, one file), a moved-out partition whose move is not its `move_out`, and a
//! format 3 file without a move (which is written as format 1 or 2).

use anyhow::{bail, Context};

use super::Reader;
use crate::engine::Engine;
use crate::protocol::{MoveKind, MoveRecord};

/// Appends the moves' tail.
pub(super) fn encode(engine: &Engine, out: &mut Vec<u8>) {
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
pub(super) fn decode(r: &mut Reader<'_>, engine: &mut Engine) -> anyhow::Result<()> {
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
