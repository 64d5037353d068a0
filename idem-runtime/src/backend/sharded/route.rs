//! Which shard a `(biz, key)` lives on: a hash that no process, build or version changes.

use sha2::{Digest, Sha256};

/// The shard of `(biz, key)` among `shards` (at least 1).
pub(super) fn shard(biz: &str, key: &str, shards: usize) -> usize {
    let mut hash = Sha256::new();
    hash.update((biz.len() as u32).to_le_bytes());
    hash.update(biz.as_bytes());
    hash.update(key.as_bytes());
    let digest = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    jump(u64::from_be_bytes(first), shards)
}

/// Jump consistent hash (Lamping and Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm",
/// 2014): a bucket in `0..buckets` such that growing `buckets` by one moves about 1/buckets of the
/// keys, all to the new bucket.
fn jump(mut key: u64, buckets: usize) -> usize {
    let (mut b, mut j) = (-1i64, 0i64);
    while j < buckets as i64 {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pinned: a change of the routing would send every deployment's keys to other shards.
    #[test]
    fn routing_is_pinned() {
        let routes: Vec<usize> = ["ORD-1", "ORD-2", "ORD-3", "订单-4", ""]
            .iter()
            .map(|k| shard("PAY", k, 4))
            .collect();
        assert_eq!(
            routes, ROUTES,
            "the routing of (biz, key) to shards changed"
        );
        assert_ne!(
            shard("PAY", "X", 1024),
            shard("PAYX", "", 1024),
            "biz and key do not blur"
        );
        assert_eq!(shard("PAY", "anything", 1), 0);
    }

    const ROUTES: [usize; 5] = [1, 1, 1, 3, 2];

    #[test]
    fn growing_moves_few_keys_and_only_to_the_new_shard() {
        let keys: Vec<String> = (0..10_000).map(|i| format!("k{i}")).collect();
        let moved: Vec<(usize, usize)> = keys
            .iter()
            .map(|k| (shard("B", k, 8), shard("B", k, 9)))
            .filter(|(a, b)| a != b)
            .collect();
        assert!(
            moved.iter().all(|(_, to)| *to == 8),
            "keys move only to the new shard"
        );
        let share = moved.len() as f64 / keys.len() as f64;
        assert!(
            (0.08..0.14).contains(&share),
            "about 1/9 of the keys move: {share}"
        );
        let mut per_shard = [0usize; 8];
        for k in &keys {
            per_shard[shard("B", k, 8)] += 1;
        }
        assert!(
            per_shard.iter().all(|n| (1000..1500).contains(n)),
            "{per_shard:?}"
        );
    }
}
