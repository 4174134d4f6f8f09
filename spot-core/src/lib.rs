//! spot-core
