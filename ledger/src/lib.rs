//! The `ledger` binary's library: the command line (`cli.rs`), the one `Settings`
//! (`settings.rs`), the serving commands `up` and `serve` (`serve.rs`), the wiring of the core
//! over the pool and the adapters start-up made (`wiring.rs`), the start-up that runs every
//! background task (`startup.rs`), spot-core's child process under `ledger up`
//! (`spot_child.rs`), the relay's and the replay's commands, and the router that joins the
//! command side (`command_api`) and the query side (`query_api`) over the state both share
//! (`edge`). The integration tests serve the same router in process ([`serve_with`]).

pub(crate) mod api_doc;
pub(crate) mod cells_cli;
pub(crate) mod cells_moves_cli;
pub mod cellular;
pub mod cli;
pub mod config;
pub(crate) mod ha_up;
pub(crate) mod http_traces;
pub(crate) mod log_cli;
pub mod private_pg;
pub(crate) mod relay_cli;
pub(crate) mod replay;
pub mod router;
pub mod serve;
pub mod settings;
pub(crate) mod spot_child;
pub mod startup;
pub mod wiring;

pub use router::serve_with;
pub use wiring::Wiring;
