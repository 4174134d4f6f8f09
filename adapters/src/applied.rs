//! One movement an account system applied, as the conservation check's reads (`audit.rs`) and
//! the failover repair's lookup (`spot/repair.rs`) both report it: the core's type.

pub use application::books::AppliedMovement;
