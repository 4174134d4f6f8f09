//! spot-core client adapter (filled in once spot-core lands).
pub struct SpotAdapter;
