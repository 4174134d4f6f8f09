//! What adds a cell to a running deployment, as the front sees it (`adding.rs` answers the
//! route with it): the request, the refusals and the port the serving process implements
//! (`ledger/src/cellular/adding.rs`).

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;

/// The cell an admin asks for; every field may be left out under `ledger up --cells N`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewCell {
    /// The new cell's PostgreSQL (created if missing, as start-up creates the map's).
    pub database_url: Option<String>,
    /// `HOST:PORT` of its running spot-core, or `"start"` for a child of this process.
    pub spot: Option<String>,
    /// The file holding its spot-core's token (else the process's `SPOT_CORE_TOKEN`).
    pub spot_token_file: Option<String>,
}

/// Why a cell was not added; nothing of the map changed.
#[derive(Debug, thiserror::Error)]
pub enum AddRefusal {
    /// The request cannot be served as asked (a field missing or wrong): 400.
    #[error("{0}")]
    Invalid(String),
    /// Another addition is under way, or the database is already another cell's: 409.
    #[error("{0}")]
    Conflict(String),
    /// A part did not answer (its database, its spot-core, another cell): 503, retry.
    #[error("{0}")]
    Unavailable(String),
}

/// What adds a cell: the serving process's start-up, handed to the front.
#[async_trait]
pub trait CellAdder: Send + Sync {
    /// Adds the cell `asked` names and answers its description (`cell`, `map_version`,
    /// `database`, `spot`).
    async fn add(&self, asked: NewCell) -> Result<Value, AddRefusal>;
}
