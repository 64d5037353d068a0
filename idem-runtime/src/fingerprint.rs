//! Request fingerprints: SHA-256 of the request serialized as canonical JSON.
//!
//! Canonical means the bytes depend only on the value: object keys are sorted at every depth
//! (whatever order the type serialized them in, and whether or not some crate in the graph enables
//! `serde_json/preserve_order`), integers are written as integers, and a float with no fractional
//! part is written as the integer it equals (`1.0` and `1` fingerprint alike).

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// SHA-256 (lowercase hex) of `value` serialized as canonical JSON.
///
/// # Errors
/// The serializer's message when `value` cannot be serialized (a map with non-string keys, a
/// failing `Serialize` impl).
pub fn fingerprint<T: Serialize + ?Sized>(value: &T) -> Result<String, String> {
    let value = serde_json::to_value(value).map_err(|e| e.to_string())?;
    let mut canonical = Vec::with_capacity(128);
    write_canonical(&value, &mut canonical);
    Ok(hex(&Sha256::digest(&canonical)))
}

/// Whether two stored fingerprints name the same request. A fingerprint may carry, before its
/// digest and a space, where the request came from (the HTTP layer writes `POST /orders <digest>`,
/// so an operator's tool can say which route a record is for); only the digests are compared, so a
/// record written without that part (by an earlier version) still matches its repeats.
pub(crate) fn same(a: &str, b: &str) -> bool {
    digest(a) == digest(b)
}

/// The digest of a stored fingerprint: what follows its last space, or all of it.
pub(crate) fn digest(fingerprint: &str) -> &str {
    fingerprint.rsplit(' ').next().unwrap_or(fingerprint)
}

/// What a stored fingerprint says of where its request came from: the text before its digest
/// (`POST /orders/{id}` for an HTTP layer record), or `None` (every other record).
pub(crate) fn origin(fingerprint: &str) -> Option<&str> {
    fingerprint
        .rsplit_once(' ')
        .map(|(origin, _)| origin)
        .filter(|o| !o.is_empty())
}

/// `bytes` as lowercase hex digits (a table lookup: `format!` per byte was most of a
/// fingerprint's cost).
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// Writes `value` as canonical JSON.
pub(crate) fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null | Value::Bool(_) | Value::String(_) => {
            serde_json::to_writer(&mut *out, value).expect("writing to a Vec cannot fail")
        }
        Value::Number(n) => write_number(n, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, key).expect("writing to a Vec cannot fail");
                out.push(b':');
                write_canonical(item, out);
            }
            out.push(b'}');
        }
    }
}

/// One form per number: integers as integers; floats that equal an integer (within ±2^53) as that
/// integer; other floats in the shortest form that reads back as the same `f64`.
fn write_number(n: &serde_json::Number, out: &mut Vec<u8>) {
    use std::io::Write;
    if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
    } else if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
    } else if let Some(f) = n.as_f64() {
        const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
        if f.fract() == 0.0 && f.abs() <= EXACT {
            let _ = write!(out, "{}", f as i64);
        } else {
            let _ = write!(out, "{f:?}");
        }
    } else {
        // Not reachable with serde_json's own number types; keep its text rather than guess.
        let _ = write!(out, "{n}");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    #[test]
    fn hex_is_two_lowercase_digits_per_byte() {
        assert_eq!(super::hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(super::hex(&[]), "");
    }

    use serde::Serialize;

    use super::*;

    fn canonical<T: Serialize>(value: &T) -> String {
        let mut out = Vec::new();
        write_canonical(&serde_json::to_value(value).unwrap(), &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn map_order_does_not_change_the_fingerprint() {
        let names: Vec<String> = (0..50).map(|i| format!("k{i}")).collect();
        let a: HashMap<&str, usize> = names
            .iter()
            .enumerate()
            .map(|(i, k)| (k.as_str(), i))
            .collect();
        let b: BTreeMap<&str, usize> = names
            .iter()
            .enumerate()
            .rev()
            .map(|(i, k)| (k.as_str(), i))
            .collect();
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&1), fingerprint(&2));
        assert_eq!(fingerprint(&"x").unwrap().len(), 64);
    }

    /// Structs serialize their fields in declaration order; canonical JSON sorts them, at every
    /// depth, so two types with the same fields in another order fingerprint alike.
    #[test]
    fn keys_are_sorted_at_every_depth() {
        #[derive(Serialize)]
        struct Inner {
            z: u8,
            a: u8,
        }
        #[derive(Serialize)]
        struct Outer {
            m: Vec<Inner>,
            b: HashMap<String, Inner>,
        }
        let value = Outer {
            m: vec![Inner { z: 1, a: 2 }],
            b: [
                ("y".to_owned(), Inner { z: 3, a: 4 }),
                ("c".to_owned(), Inner { z: 5, a: 6 }),
            ]
            .into(),
        };
        assert_eq!(
            canonical(&value),
            r#"{"b":{"c":{"a":6,"z":5},"y":{"a":4,"z":3}},"m":[{"a":2,"z":1}]}"#
        );
    }

    #[test]
    fn numbers_have_one_form() {
        assert_eq!(canonical(&1.0f64), "1");
        assert_eq!(canonical(&-3.0f32), "-3");
        assert_eq!(canonical(&1.5f64), "1.5");
        assert_eq!(canonical(&u64::MAX), "18446744073709551615");
        assert_eq!(canonical(&i64::MIN), "-9223372036854775808");
        assert_eq!(fingerprint(&2.0f64), fingerprint(&2u8));
        assert_eq!(canonical(&"é\"\n"), r#""é\"\n""#);
    }

    /// CI runs this module a second time with insertion-ordered maps
    /// (`IDEM_EXPECT_PRESERVE_ORDER=1 cargo test -p idem-runtime --features
    /// serde_json/preserve_order fingerprint`): the fingerprint must not notice.
    #[test]
    fn preserve_order_does_not_change_the_fingerprint() {
        let mut forward = serde_json::Map::new();
        let mut backward = serde_json::Map::new();
        for i in 0..3 {
            forward.insert(format!("k{i:02}"), i.into());
        }
        for i in (0..3).rev() {
            backward.insert(format!("k{i:02}"), i.into());
        }
        let insertion_ordered = forward.keys().next() != backward.keys().next();
        if std::env::var_os("IDEM_EXPECT_PRESERVE_ORDER").is_some() {
            assert!(
                insertion_ordered,
                "this build must have serde_json/preserve_order on"
            );
        }
        let expected = "c15905888d007ad9bf835cf363eb016704042a88f33c613d4ba2f73d7e019e23";
        assert_eq!(fingerprint(&forward).unwrap(), expected);
        assert_eq!(fingerprint(&backward).unwrap(), expected);
    }
}
