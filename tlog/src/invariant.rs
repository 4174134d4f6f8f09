//! What a broken invariant of the tree's in-memory state does: [`invariant!`](crate::invariant)
//! and [`violated`], the policy of the `invariant` crate, shared with `domain` and spot-core: a broken invariant of in-memory state (a right edge that
//! does not match its size, a proof plan of the wrong length) aborts the process, before a wrong
//! root is signed or a wrong proof served; under the caller's own unit tests (`cfg(test)`) it
//! panics instead. A check of stored or received input (a tile, a stored right edge, a proof, a
//! signed note) never uses this: it refuses the input (`None`, `false`, an error) and the caller
//! stops serving from it.

pub use ::invariant::violated;

/// Asserts an invariant of in-memory state with its reason:
/// `invariant!(cond, "why it must hold {}", x)`; see the module for what a violation does.
#[macro_export]
macro_rules! invariant {
    ($cond:expr, $($reason:tt)+) => {
        if !$cond {
            $crate::invariant::violated(format_args!($($reason)+), cfg!(test))
        }
    };
}
