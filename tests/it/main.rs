//! The acceptance catalogue (seed 000 section 10), one integration binary against a real
//! PostgreSQL and real spot-core processes. Test names carry the seed's ids.

mod helpers;

mod adapters_idempotency;
mod api;
mod concurrency;
mod fsm;
mod spot_durability;
