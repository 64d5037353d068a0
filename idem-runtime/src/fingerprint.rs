//! Request fingerprints: a stable hash of the serialized request.

use serde::Serialize;
use sha2::{Digest, Sha256};

/// SHA-256 (hex) of `value` serialized as canonical JSON (object keys sorted), so a `HashMap`
/// field gives the same fingerprint whatever its iteration order.
///
/// # Errors
/// The serializer's message when `value` cannot be serialized.
pub fn fingerprint<T: Serialize + ?Sized>(value: &T) -> Result<String, String> {
    let canonical = serde_json::to_value(value).map_err(|e| e.to_string())?;
    let bytes = serde_json::to_vec(&canonical).map_err(|e| e.to_string())?;
    let digest = Sha256::digest(&bytes);
    let mut hex = String::with_capacity(64);
    for b in digest.iter() {
        use std::fmt::Write;
        let _ = write!(hex, "{b:02x}");
    }
    Ok(hex)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    #[test]
    fn map_order_does_not_change_the_fingerprint() {
        let names: Vec<String> = (0..50).map(|i| format!("k{i}")).collect();
        let a: HashMap<&str, usize> = names
            .iter()
            .enumerate()
            .map(|(i, k)| (k.as_str(), i))
            .collect();
        let b: HashMap<&str, usize> = names
            .iter()
            .enumerate()
            .rev()
            .map(|(i, k)| (k.as_str(), i))
            .collect();
        assert_eq!(super::fingerprint(&a), super::fingerprint(&b));
        assert_ne!(super::fingerprint(&1), super::fingerprint(&2));
        assert_eq!(super::fingerprint(&"x").unwrap().len(), 64);
    }
}
