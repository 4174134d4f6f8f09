//! `MemClaims`: the claim cell's external_id claims in memory (`external_ids.rs`'s port), with
//! a switch that makes the store fail, as a claim cell whose database does not answer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use domain::UserId;

use crate::error::StoreError;
use crate::external_ids::ExternalClaims;

/// External_id claims in memory. Cheap to clone: clones share the claims.
#[derive(Debug, Clone, Default)]
pub struct MemClaims {
    held: Arc<Mutex<HashMap<String, UserId>>>,
    failing: Arc<AtomicBool>,
}

impl MemClaims {
    /// While `failing`, every claim fails and changes nothing.
    pub fn fail(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// Who holds `external_id`, if anyone.
    pub fn holder(&self, external_id: &str) -> Option<UserId> {
        self.held.lock().expect("claims").get(external_id).copied()
    }
}

#[async_trait]
impl ExternalClaims for MemClaims {
    async fn claim(&self, external_id: &str, user: UserId) -> Result<UserId, StoreError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(StoreError::msg("the claim cell does not answer"));
        }
        let mut held = self.held.lock().expect("claims");
        Ok(*held.entry(external_id.to_owned()).or_insert(user))
    }
}
