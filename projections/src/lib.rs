//! projections
