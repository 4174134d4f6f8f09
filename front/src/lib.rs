//! The front of a process that serves several cells (ADR 0017): one router per cell, each the
//! whole of today's application over that cell's state, and [`Front`] before them, which sends
//! each request to its user's cell and merges what spans cells. It decides no money rule of its
//! own: the external_id claim's rule is `application::external_ids`', the feed's page and
//! stream are `query_api::feed`'s, and every other answer is a cell's. It knows no database:
//! each cell's ports come in its [`slot::Served`], wired by `ledger`'s start-up
//! (`ledger/src/cellular/`), which also reaches, watches and marks the cells up or down.
//!
//! - `route.rs`: [`Front`], the router: by the token's user, by what an admin's request names,
//!   a bulk request split per cell, a req_id looked up in each cell in turn.
//! - `map.rs`: the cell map routed by, reloaded from the cells' stored maps when one is newer
//!   (a write refused at the partition fence is sent once more under it).
//! - `slot.rs`: each cell's place: whether it serves, what it serves with, its bulkhead.
//! - `claims.rs`: where a deposit's external_id is claimed (its claim cell).
//! - `views.rs`, `fanout.rs`: the admin views fanned out to every cell and merged (transfers,
//!   stuck, overview, alerts, the conservation check, metrics); `checks.rs`: the check's
//!   history, its reports and clearing a halt, by `?cell=N`.
//! - `feed.rs`: every cell's feed merged, with a cursor naming each cell's position.
//! - `ws.rs`: GraphQL over a websocket relayed to the caller's cell, or to every cell, merged.
//! - `moves.rs`: the partition moves' admin routes (start, list, cancel) over the move runner.
//! - `adding.rs`: adding a cell while the process serves (`POST /api/v1/admin/cells`), through
//!   the port in `adder.rs`.

pub mod adder;
pub mod adding;
pub mod checks;
pub mod claims;
pub mod fanout;
pub mod feed;
pub mod map;
pub mod moves;
pub mod route;
pub mod slot;
pub mod views;
pub mod ws;

pub use route::Front;
