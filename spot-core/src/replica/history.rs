//! A replica's durable epochs (docs/adr/0020-high-availability.md §3):
//!
//! - `EPOCH`: the highest epoch this replica has promised. Frames of a lower epoch are refused
//!   from the moment the promise is answered (fencing).
//! - `EPOCHS`: the epoch history, one `epoch start_seq` line per leadership this replica's log
//!   followed: the records from `start_seq` up to the next line's were written by that epoch's
//!   leader. A line is added only once the log holds every record before `start_seq`.
//!
//! Two replicas' logs agree up to a seq when the same epoch wrote it in both (one leader per
//! epoch, and a leader never rewrites its own log): `divergence` finds the last such seq, as
//! Kafka's "offset for leader epoch" does. `more_advanced` is the order a new leader uses to pick
//! the log to adopt: the last epoch, then the last seq.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The promised epoch's file.
pub const EPOCH_FILE: &str = "EPOCH";
/// The epoch history's file.
pub const EPOCHS_FILE: &str = "EPOCHS";
/// Present while a replica that lost its data (its directory empty in a cell that already
/// existed) has not yet caught up with a leader: it neither promises nor campaigns (ADR 0020
/// §3, "lose any one disk").
pub const WIPED_FILE: &str = "WIPED";

/// One leadership's first seq in this log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochStart {
    pub epoch: u64,
    pub start: u64,
}

/// A log's position as a new leader compares it: its history and its last seq.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub history: Vec<EpochStart>,
    pub last_seq: u64,
}

impl Position {
    /// The epoch of the last history line (0: none).
    pub fn last_epoch(&self) -> u64 {
        self.history.last().map_or(0, |e| e.epoch)
    }

    /// The order a new leader picks the log to adopt by: last epoch, then last seq.
    pub fn more_advanced_than(&self, other: &Position) -> bool {
        (self.last_epoch(), self.last_seq) > (other.last_epoch(), other.last_seq)
    }
}

/// The epoch that wrote `seq` according to `history` (0 before the first line).
pub fn epoch_of(history: &[EpochStart], seq: u64) -> u64 {
    history
        .iter()
        .rev()
        .find(|e| e.start <= seq)
        .map_or(0, |e| e.epoch)
}

/// The first seq written by `epoch` in `history` (0 for epoch 0: the log's beginning).
fn start_of(history: &[EpochStart], epoch: u64) -> u64 {
    history
        .iter()
        .find(|e| e.epoch == epoch)
        .map_or(0, |e| e.start)
}

/// The last seq at which the two logs agree: every record up to it is the same in both.
pub fn divergence(a: &Position, b: &Position) -> u64 {
    let mut seq = a.last_seq.min(b.last_seq);
    while seq > 0 {
        let (ea, eb) = (epoch_of(&a.history, seq), epoch_of(&b.history, seq));
        if ea == eb {
            return seq;
        }
        // Step back past the later of the two epochs' starts: below it, at least one side has
        // another epoch again.
        let back = start_of(&a.history, ea).max(start_of(&b.history, eb));
        seq = back.saturating_sub(1).min(seq - 1);
    }
    0
}

/// The two files, loaded and kept in step with the disk.
#[derive(Debug)]
pub struct Epochs {
    dir: PathBuf,
    pub promised: u64,
    pub history: Vec<EpochStart>,
    /// `WIPED` is present.
    pub wiped: bool,
}

impl Epochs {
    /// Loads both files from `dir` (absent: none). History lines starting after `last_seq + 1`
    /// are dropped (the records they would follow were never made durable here).
    pub fn load(dir: &Path, last_seq: u64) -> anyhow::Result<Epochs> {
        let promised = match std::fs::read_to_string(dir.join(EPOCH_FILE)) {
            Ok(text) => text.trim().parse().context("parsing EPOCH")?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e).context("reading EPOCH"),
        };
        let mut history = Vec::new();
        match std::fs::read_to_string(dir.join(EPOCHS_FILE)) {
            Ok(text) => {
                for line in text.lines().filter(|l| !l.trim().is_empty()) {
                    let mut parts = line.split_whitespace();
                    let (Some(epoch), Some(start)) = (parts.next(), parts.next()) else {
                        anyhow::bail!("a malformed EPOCHS line: {line:?}");
                    };
                    history.push(EpochStart {
                        epoch: epoch.parse()?,
                        start: start.parse()?,
                    });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).context("reading EPOCHS"),
        }
        let before = history.len();
        history.retain(|e| e.start <= last_seq + 1);
        let epochs = Epochs {
            dir: dir.to_path_buf(),
            promised,
            history,
            wiped: dir.join(WIPED_FILE).exists(),
        };
        if epochs.history.len() != before {
            epochs.write_history()?;
        }
        Ok(epochs)
    }

    /// Records a promise of `epoch` durably; refused when a higher one was promised.
    pub fn promise(&mut self, epoch: u64) -> anyhow::Result<()> {
        anyhow::ensure!(
            epoch >= self.promised,
            "epoch {epoch} is older than the promised {}",
            self.promised
        );
        if epoch > self.promised {
            write_durably(&self.dir, EPOCH_FILE, format!("{epoch}\n").as_bytes())?;
            self.promised = epoch;
        }
        Ok(())
    }

    /// Adds `epoch` starting at `start` (the log holds every record before it), durably.
    pub fn adopt(&mut self, epoch: u64, start: u64) -> anyhow::Result<()> {
        if self.history.last().is_some_and(|e| e.epoch >= epoch) {
            return Ok(());
        }
        self.promise(epoch)?;
        self.history.push(EpochStart { epoch, start });
        self.write_history()
    }

    /// True when nothing was ever recorded here: no promise, no history (a new replica, or one
    /// whose disk was lost).
    pub fn blank(&self) -> bool {
        self.promised == 0 && self.history.is_empty()
    }

    /// Marks this replica as one that lost its data (`WIPED`), durably.
    pub fn mark_wiped(&mut self) -> anyhow::Result<()> {
        write_durably(&self.dir, WIPED_FILE, b"")?;
        self.wiped = true;
        Ok(())
    }

    /// Ends `WIPED`: the log holds every record its leader had when it joined this replica
    /// (every one acknowledged before then), in the leader's epoch (`wal/follow.rs`).
    pub fn clear_wiped(&mut self) -> anyhow::Result<()> {
        if self.wiped {
            std::fs::remove_file(self.dir.join(WIPED_FILE))?;
            File::open(&self.dir)?.sync_all()?;
            self.wiped = false;
        }
        Ok(())
    }

    /// This log's position.
    pub fn position(&self, last_seq: u64) -> Position {
        Position {
            history: self.history.clone(),
            last_seq,
        }
    }

    fn write_history(&self) -> anyhow::Result<()> {
        let mut text = String::new();
        for e in &self.history {
            text.push_str(&format!("{} {}\n", e.epoch, e.start));
        }
        write_durably(&self.dir, EPOCHS_FILE, text.as_bytes())
    }
}

/// Writes `name` in `dir` through a synced temporary file renamed over it, the directory synced.
pub fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    {
        let mut f: File = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(name))?;
    File::open(dir)?.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(history: &[(u64, u64)], last_seq: u64) -> Position {
        Position {
            history: history
                .iter()
                .map(|&(epoch, start)| EpochStart { epoch, start })
                .collect(),
            last_seq,
        }
    }

    #[test]
    fn a_prefix_agrees_up_to_its_end() {
        let leader = pos(&[(5, 1), (9, 40)], 70);
        assert_eq!(divergence(&pos(&[(5, 1)], 30), &leader), 30);
        assert_eq!(divergence(&pos(&[(5, 1), (9, 40)], 55), &leader), 55);
        assert_eq!(divergence(&pos(&[], 0), &leader), 0);
    }

    #[test]
    fn a_deposed_leaders_tail_is_cut_where_the_next_epoch_began() {
        // Epoch 5 wrote 1..=45 on the old leader; epoch 9 took over from 40 (41..45 were never
        // acknowledged) and wrote on.
        let old = pos(&[(5, 1)], 45);
        let new = pos(&[(5, 1), (9, 40)], 60);
        assert_eq!(divergence(&old, &new), 39);
        assert_eq!(divergence(&new, &old), 39);
    }

    #[test]
    fn an_epoch_the_other_never_saw_diverges_from_its_start() {
        // Epoch 7 led alone (wrote 31..=33 and died); epoch 9 started from 31 elsewhere.
        let lonely = pos(&[(5, 1), (7, 31)], 33);
        let new = pos(&[(5, 1), (9, 31)], 50);
        assert_eq!(divergence(&lonely, &new), 30);
    }

    #[test]
    fn the_last_epoch_outranks_a_longer_log() {
        // Raft's figure 8: a longer log of an older epoch must not win over a shorter one that a
        // newer leader wrote its epoch into.
        let longer_older = pos(&[(5, 1), (7, 11)], 12);
        let newer = pos(&[(5, 1), (9, 12)], 11);
        assert!(newer.more_advanced_than(&longer_older));
        assert!(!longer_older.more_advanced_than(&newer));
    }

    #[test]
    fn files_round_trip_and_drop_lines_past_the_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut e = Epochs::load(dir.path(), 0).expect("load");
        e.promise(3).expect("promise");
        e.adopt(3, 1).expect("adopt");
        e.adopt(8, 20).expect("adopt");
        assert!(e.promise(2).is_err(), "an older epoch is refused");
        let again = Epochs::load(dir.path(), 25).expect("load");
        assert_eq!(again.promised, 8);
        assert_eq!(again.history.len(), 2);
        let cut = Epochs::load(dir.path(), 10).expect("load");
        assert_eq!(cut.history, vec![EpochStart { epoch: 3, start: 1 }]);
    }
}
