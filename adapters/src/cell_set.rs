//! The cells a process reaches, keyed by id, as the partition moves' adapters hold them
//! (`pg::move_stores`, `pg::map_moves`, `spot::moves`). A cell added while the process serves
//! (`ledger cells add`, ADR 0023 §1) joins with [`CellSet::insert`]; every clone sees it.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use cells::CellId;

/// Each cell's `T`, shared by every clone; cells are added, never removed.
#[derive(Clone)]
pub struct CellSet<T>(Arc<RwLock<BTreeMap<CellId, T>>>);

impl<T: Clone> CellSet<T> {
    pub fn new(cells: BTreeMap<CellId, T>) -> Self {
        Self(Arc::new(RwLock::new(cells)))
    }

    /// Cell `id`'s, if the set has it.
    pub fn get(&self, id: CellId) -> Option<T> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }

    /// Every cell's, ascending by id (a snapshot).
    pub fn all(&self) -> Vec<(CellId, T)> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, t)| (*id, t.clone()))
            .collect()
    }

    /// Every cell's id, ascending.
    pub fn ids(&self) -> Vec<CellId> {
        self.all().into_iter().map(|(id, _)| id).collect()
    }

    /// Adds (or replaces) cell `id`'s.
    pub fn insert(&self, id: CellId, t: T) {
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, t);
    }
}
