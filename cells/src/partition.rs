//! The partition function (ADR 0017 §2): the first 8 bytes of the SHA-256 of a user id written
//! as ASCII decimal digits, read big-endian, modulo [`PARTITIONS`]. Specified to the byte so that
//! any client, script or later version computes the same placement; the ADR's test vectors are
//! checked below.

use domain::UserId;
use sha2::{Digest, Sha256};

/// P, the number of partitions: fixed for the life of a deployment, so moving a partition from
/// one cell to another never rehashes a user.
pub const PARTITIONS: u16 = 256;

/// One of the [`PARTITIONS`] partitions, `0..=255`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Partition(pub(crate) u8);

impl Partition {
    /// The partition numbered `raw`, if it is below [`PARTITIONS`].
    pub fn new(raw: u64) -> Option<Self> {
        u8::try_from(raw).ok().map(Self)
    }

    pub fn get(self) -> u8 {
        self.0
    }

    /// Every partition, in order.
    pub fn all() -> impl Iterator<Item = Partition> {
        (0..=u8::MAX).map(Self)
    }
}

impl std::fmt::Display for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The partition of `bytes`: `u64::from_be_bytes(SHA-256(bytes)[0..8]) mod 256`. Users are placed
/// by their decimal id ([`partition_of`]); an external_id's claim by its UTF-8 bytes.
pub fn partition_of_bytes(bytes: &[u8]) -> Partition {
    let digest = Sha256::digest(bytes);
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    let reduced = u64::from_be_bytes(head) % u64::from(PARTITIONS);
    Partition(u8::try_from(reduced).expect("a value mod 256 fits in a byte"))
}

/// The partition of a user: [`partition_of_bytes`] of its id in ASCII decimal digits (no sign,
/// no leading zeros).
pub fn partition_of(user: UserId) -> Partition {
    partition_of_bytes(user.get().to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ADR 0017 §2's table, computed independently of this code.
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
            let user = UserId::new(user).unwrap();
            assert_eq!(partition_of(user).get(), partition, "user {}", user.get());
        }
        assert_eq!(partition_of_bytes(b"dep-1").get(), 50);
        assert_eq!(partition_of_bytes(b"demo-1").get(), 123);
    }

    #[test]
    fn the_hash_is_over_the_digest_head_read_big_endian() {
        // SHA-256("1") starts 6b86b273ff34fce1; its last byte is the value mod 256.
        assert_eq!(0x6b86_b273_ff34_fce1_u64 % 256, 0xe1);
        assert_eq!(partition_of_bytes(b"1").get(), 0xe1);
    }

    #[test]
    fn users_spread_over_every_partition() {
        let mut seen = [0u32; 256];
        for raw in 1..=25_600u64 {
            let p = partition_of(UserId::new(raw).unwrap());
            seen[usize::from(p.get())] += 1;
        }
        // 100 expected per partition; a uniform hash keeps every one well inside these bounds.
        assert!(seen.iter().all(|&n| (50..=160).contains(&n)), "{seen:?}");
    }

    #[test]
    fn partitions_are_zero_to_255() {
        assert_eq!(Partition::new(255).map(Partition::get), Some(255));
        assert_eq!(Partition::new(256), None);
        assert_eq!(Partition::all().count(), usize::from(PARTITIONS));
    }
}
