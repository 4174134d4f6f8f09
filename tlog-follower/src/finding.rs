//! What `verify` found: the first difference, named by where it is (a position, a deposit or a
//! checkpoint) and why. Apart from `verify.rs` so that its parts (`deposits.rs`) name their
//! findings without importing it.

/// The first difference found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// `position P`, `deposit X`, `position P (deposit X)` or `checkpoint of size S (where it
    /// came from)`.
    pub at: String,
    pub why: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.at, self.why)
    }
}

pub(crate) fn finding(at: impl Into<String>, why: impl Into<String>) -> Finding {
    Finding {
        at: at.into(),
        why: why.into(),
    }
}
