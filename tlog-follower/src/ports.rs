//! The tamper-evident log's side of the read ports (`application::reads::LogReads`), over
//! [`LogReads`](crate::LogReads): its answers become the core's values, and its errors the
//! core's `StoreError` (the log's own words kept, as the error's cause).

use std::sync::Arc;

use application::reads::{
    self, Hash, Inclusion, LogEntry, LogLag, ProofError, ReceiptEntry, TreeHead,
};
use application::StoreError;
use async_trait::async_trait;

use crate::proofs;

fn proof_error(e: proofs::ProofError) -> ProofError {
    match e {
        proofs::ProofError::BeyondTree { size } => ProofError::BeyondTree { size },
        proofs::ProofError::OutOfRange => ProofError::OutOfRange,
        proofs::ProofError::Log(e) => ProofError::Store(StoreError::new(e)),
    }
}

#[async_trait]
impl reads::LogReads for crate::LogReads {
    fn cell(&self) -> Option<u16> {
        crate::LogReads::cell(self)
    }

    fn of_cell(&self, cell: u16) -> Arc<dyn reads::LogReads> {
        Arc::new(self.clone().of_cell(cell))
    }

    async fn head(&self) -> Result<TreeHead, StoreError> {
        let head = crate::LogReads::head(self).await.map_err(StoreError::new)?;
        Ok(TreeHead {
            size: head.size,
            origin: head.origin,
            vkey: head.vkey,
        })
    }

    async fn lag(&self) -> Result<Option<LogLag>, StoreError> {
        let lag = crate::LogReads::lag(self).await.map_err(StoreError::new)?;
        Ok(lag.map(|l| LogLag {
            tree_size: l.tree_size,
            positions: l.positions,
            seconds: l.seconds,
        }))
    }

    async fn latest_checkpoint(&self) -> Result<Option<String>, StoreError> {
        crate::LogReads::latest_checkpoint(self)
            .await
            .map_err(StoreError::new)
    }

    async fn entry_at(&self, position: i64) -> Result<Option<LogEntry>, StoreError> {
        let row = crate::LogReads::entry_at(self, position)
            .await
            .map_err(StoreError::new)?;
        Ok(row.map(|row| LogEntry {
            position: row.position,
            user_id: row.user_id,
            leaf: row.leaf(),
        }))
    }

    async fn of_transfer(&self, req_id: &str) -> Result<Vec<ReceiptEntry>, StoreError> {
        let entries = crate::LogReads::of_transfer(self, req_id)
            .await
            .map_err(StoreError::new)?;
        Ok(entries
            .into_iter()
            .map(|e| ReceiptEntry {
                position: e.position,
                sequence: e.sequence,
                event_type: e.event_type,
                user_id: e.user_id,
            })
            .collect())
    }

    async fn inclusion(&self, position: u64, size: u64) -> Result<Inclusion, ProofError> {
        let proof = crate::LogReads::inclusion(self, position, size)
            .await
            .map_err(proof_error)?;
        Ok(Inclusion {
            leaf_hash: proof.leaf_hash,
            hashes: proof.hashes,
        })
    }

    async fn consistency(&self, from: u64, to: u64) -> Result<Vec<Hash>, ProofError> {
        crate::LogReads::consistency(self, from, to)
            .await
            .map_err(proof_error)
    }
}
