//! Keys in a record's hash slot, for a Redis Cluster: a script touches one slot, so an index a
//! script keeps beside a record must hash where the record does. For each of the 16,384 slots,
//! [`slot_tag`] is the shortest decimal number whose text hashes to it; a key whose `{…}` is that
//! number lies in that slot.

use std::sync::LazyLock;

/// The slots of a Redis Cluster.
const SLOTS: usize = 16_384;

/// Redis's hash slot of `key`: CRC16 (XMODEM) of its hash tag (what stands between the first `{`
/// and the first `}` after it, when that is not empty), else of the whole key, modulo 16,384.
pub(super) fn slot(key: &[u8]) -> u16 {
    let tag = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tag) % SLOTS as u16
}

/// For each slot, the smallest number whose decimal text hashes to it (found once, by counting up:
/// a little over 100,000 numbers cover every slot).
static TAGS: LazyLock<Box<[u32]>> = LazyLock::new(|| {
    let mut tags = vec![u32::MAX; SLOTS];
    let mut left = SLOTS;
    let mut text = itoa::Buffer::new();
    let mut n = 0u32;
    while left > 0 {
        let s = usize::from(slot(text.format(n).as_bytes()));
        if tags[s] == u32::MAX {
            tags[s] = n;
            left -= 1;
        }
        n += 1;
    }
    tags.into_boxed_slice()
});

/// A hash tag (the text to put between `{` and `}`) that lies in `slot`.
pub(super) fn slot_tag(slot: u16) -> u32 {
    TAGS[usize::from(slot) % SLOTS]
}

#[cfg(test)]
mod tests {
    use super::{slot, slot_tag};

    fn crc(key: &[u8]) -> u16 {
        crc16::State::<crc16::XMODEM>::calculate(key) % 16_384
    }

    #[test]
    fn slots_are_redis_slots() {
        // Redis's own answers (`CLUSTER KEYSLOT`, as its documentation gives them).
        assert_eq!(slot(b"somekey"), 11058);
        assert_eq!(slot(b"foo"), 12182);
        // The hash tag rules of the cluster specification.
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(
            slot(b"foo{}{bar}"),
            crc(b"foo{}{bar}"),
            "an empty tag: the whole key"
        );
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"), "the first tag only");
    }

    #[test]
    fn every_slot_has_a_tag_that_lies_in_it() {
        for s in 0..16_384u16 {
            let key = format!("idem:results{{{}}}", slot_tag(s));
            assert_eq!(slot(key.as_bytes()), s);
        }
    }
}
