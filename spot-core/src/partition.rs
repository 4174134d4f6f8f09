//! The partition of a user (ADR 0017 §2), the same function as `cells::partition_of`: the first 8
//! bytes of the SHA-256 of the user id written as ASCII decimal digits, read big-endian, modulo
//! 256, i.e. the digest's byte at index 7. spot-core does not depend on `cells` (which brings
//! the domain crate); the ADR's test vectors below, and a test against `cells` itself, hold the
//! two to the same answer.

use sha2::{Digest, Sha256};

/// The partition (0..=255) of the user `user_id`.
pub fn partition_of(user_id: u64) -> u8 {
    let digest = Sha256::digest(user_id.to_string().as_bytes());
    // `u64::from_be_bytes(digest[0..8]) % 256` is the last of those 8 bytes.
    digest[7]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ADR 0017 §2's table.
    #[test]
    fn the_adrs_test_vectors_hold() {
        let vectors: [(u64, u8); 8] = [
            (1, 225),
            (2, 238),
            (3, 139),
            (4, 198),
            (5, 43),
            (42, 141),
            (1000, 241),
            (9_223_372_036_854_775_807, 191),
        ];
        for (user, partition) in vectors {
            assert_eq!(partition_of(user), partition, "user {user}");
        }
    }

    /// The cells crate's function, which places users in cells, gives the same partitions.
    #[test]
    fn it_is_the_cells_crates_function() {
        for raw in (1..=5_000u64).chain([u64::from(u32::MAX), i64::MAX as u64]) {
            let user = domain::UserId::new(raw).unwrap();
            assert_eq!(partition_of(raw), cells::partition_of(user).get(), "{raw}");
        }
    }
}
