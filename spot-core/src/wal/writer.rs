//! The WAL's writing end: the active segment, where every synced batch is appended (one
//! `fdatasync` per batch), its rotation into a new segment once it is full, and the storage
//! options that size segments and snapshots.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::Context;

use crate::journal::{self, LiveSegment, SharedCatalog};
use crate::storage::{segment_name, sync_dir};

/// Where and how often spot-core writes segments, snapshots and archives.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct StorageOptions {
    /// Take a snapshot after this many WAL records since the previous one (0: never by count).
    #[arg(
        long,
        env = "SPOT_CORE_SNAPSHOT_EVERY_RECORDS",
        default_value_t = 100_000
    )]
    pub snapshot_every_records: u64,
    /// Take a snapshot after this many WAL bytes since the previous one (0: never by size).
    #[arg(
        long,
        env = "SPOT_CORE_SNAPSHOT_EVERY_BYTES",
        default_value_t = 64 << 20
    )]
    pub snapshot_every_bytes: u64,
    /// Start a new WAL segment once the active one reaches this size.
    #[arg(long, env = "SPOT_CORE_SEGMENT_BYTES", default_value_t = 64 << 20)]
    pub segment_bytes: u64,
    /// Move compacted segments here instead of deleting them (an operator keeps them for
    /// audits; `journal` serves them).
    #[arg(long, env = "SPOT_CORE_ARCHIVE_DIR")]
    pub archive_dir: Option<PathBuf>,
}

impl Default for StorageOptions {
    fn default() -> Self {
        StorageOptions {
            snapshot_every_records: 100_000,
            snapshot_every_bytes: 64 << 20,
            segment_bytes: 64 << 20,
            archive_dir: None,
        }
    }
}

/// The active segment and what the commit thread needs to rotate it and publish it.
#[derive(Debug)]
pub struct Wal {
    pub(super) file: File,
    pub(super) dir: PathBuf,
    pub(super) active_first: u64,
    pub(super) active_bytes: u64,
    pub(super) options: StorageOptions,
    pub(super) catalog: SharedCatalog,
    /// Records replayed after the snapshot start-up began from: they count towards the next
    /// snapshot, so a spot-core restarted more often than every N records still takes one (the
    /// WAL to replay at start stays bounded however often the process dies).
    pub(super) since_snapshot_records: u64,
    /// The data directory's `LOCK`, held while this process uses it.
    pub(super) _lock: File,
}

impl Wal {
    /// Write already-framed records and make them durable.
    pub fn append(&mut self, framed: &[u8]) -> io::Result<()> {
        self.file.write_all(framed)?;
        self.file.sync_data()?;
        self.active_bytes += framed.len() as u64;
        Ok(())
    }

    /// Write already-framed records without syncing them (visible to readers of the file);
    /// `sync` makes them durable. A leader ships a batch between the two, so the followers'
    /// fsyncs run beside its own.
    pub fn write(&mut self, framed: &[u8]) -> io::Result<()> {
        self.file.write_all(framed)?;
        self.active_bytes += framed.len() as u64;
        Ok(())
    }

    /// Make everything written durable.
    pub fn sync(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// Path of the active segment.
    pub fn path(&self) -> PathBuf {
        self.dir.join(segment_name(self.active_first))
    }

    pub fn catalog(&self) -> &SharedCatalog {
        &self.catalog
    }

    /// Start a new segment at `next_seq` when the active one is full. Only called with every
    /// written record synced, so sealed segments never end torn.
    pub(super) fn maybe_rotate(&mut self, next_seq: u64) -> anyhow::Result<()> {
        if self.active_bytes < self.options.segment_bytes || next_seq == self.active_first {
            return Ok(());
        }
        let path = self.dir.join(segment_name(next_seq));
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        sync_dir(&self.dir)?;
        let sealed = (self.active_first, self.active_bytes);
        self.file = file;
        self.active_first = next_seq;
        self.active_bytes = 0;
        let mut c = journal::lock(&self.catalog);
        if let Some(s) = c.live.last_mut().filter(|s| s.first_seq == sealed.0) {
            s.bytes = sealed.1;
        }
        c.live.push(LiveSegment {
            first_seq: next_seq,
            bytes: 0,
        });
        Ok(())
    }

    /// Fill the storage fields of a status answer.
    pub(super) fn fill_status(&self, core: &mut crate::protocol::CoreStatus) {
        let c = journal::lock(&self.catalog);
        c.fill(core);
        core.wal_bytes += self.active_bytes;
    }
}
