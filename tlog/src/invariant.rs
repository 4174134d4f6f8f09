//! What a broken invariant of the tree's in-memory state does: [`invariant!`](crate::invariant)
//! and [`violated`], the policy of the ledger's `domain::invariant` in this pure crate (which
//! depends on no crate of the ledger's): a broken invariant of in-memory state (a right edge that
//! does not match its size, a proof plan of the wrong length) aborts the process, before a wrong
//! root is signed or a wrong proof served; under the caller's own unit tests (`cfg(test)`) it
//! panics instead. A check of stored or received input (a tile, a stored right edge, a proof, a
//! signed note) never uses this: it refuses the input (`None`, `false`, an error) and the caller
//! stops serving from it.

/// A broken invariant: writes `reason` to stderr and aborts, or panics with it under test.
#[cold]
#[inline(never)]
pub fn violated(reason: std::fmt::Arguments<'_>, panic: bool) -> ! {
    if panic {
        panic!("invariant violated: {reason}");
    }
    eprintln!("tlog: invariant violated: {reason}; aborting");
    std::process::abort()
}

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
