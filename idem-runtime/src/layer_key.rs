//! The record key the HTTP layer ([`crate::http::IdempotencyLayer`], feature `axum`) stores a
//! request under, from what its client sent: kept out of the `axum` feature, so an operator's
//! tool (the `idem` CLI, [`crate::admin`]) finds the record of "order request X of customer Y"
//! without an HTTP stack.

use sha2::{Digest, Sha256};

use crate::IdemError;

/// The key of the HTTP layer's record for the `Idempotency-Key` value `idempotency_key` sent by
/// `principal` (what the layer's [`Principal`](crate::http::Principal) extracted; `None` for a
/// layer without one): 64 hex digits of SHA-256 over both, the layer's own computation. The
/// store never holds a client's raw key, so this is how an operator looks one up (`idem inspect
/// HTTP <key> --principal <caller>`, [`crate::admin::inspect_http`]). The value is read as the
/// header carries it: a structured-field string (`"k-1"`, with `\"` and `\\` escapes) or bare
/// visible ASCII (`k-1`); both give the same record. The route is not part of the key: one key
/// of one caller is one record, whatever the path.
///
/// ```
/// # use idem_runtime as idem;
/// let quoted = idem::key::http_record_key(Some("alice"), "\"order-7\"")?;
/// assert_eq!(quoted, idem::key::http_record_key(Some("alice"), "order-7")?);
/// assert_ne!(quoted, idem::key::http_record_key(Some("bob"), "order-7")?);
/// assert_eq!(quoted.len(), 64);
/// # Ok::<(), idem::IdemError>(())
/// ```
///
/// # Errors
/// [`IdemError::InvalidKey`] for a value the layer refuses (empty, not visible ASCII, an open
/// quote, a comma outside quotes), saying why.
pub fn http_record_key(
    principal: Option<&str>,
    idempotency_key: &str,
) -> Result<String, IdemError> {
    let key = parse_key_text(idempotency_key).map_err(|why| IdemError::InvalidKey {
        reason: format!("not an Idempotency-Key value the layer accepts: {why}"),
    })?;
    Ok(record_key(principal, &key))
}

/// The record key for the client key `key` (as parsed) sent by `principal`: 64 hex digits of
/// SHA-256 over both, so keys of different callers never meet, every key fits every store, and
/// the store never holds a client's raw key.
pub(crate) fn record_key(principal: Option<&str>, key: &str) -> String {
    let mut hash = Sha256::new();
    match principal {
        // Length-prefixed: ("ab", "c") and ("a", "bc") stay apart.
        Some(p) => {
            hash.update(b"p");
            hash.update((p.len() as u64).to_be_bytes());
            hash.update(p.as_bytes());
        }
        None => hash.update(b"-"),
    }
    hash.update(key.as_bytes());
    crate::fingerprint::hex(&hash.finalize())
}

/// Parses an `Idempotency-Key` value: a structured-field string (RFC 8941, `"…"` with `\"` and
/// `\\` escapes), or, since many clients send it bare, a run of visible ASCII without quotes.
/// The error says what is wrong.
pub(crate) fn parse_key_text(value: &str) -> Result<String, &'static str> {
    let raw = value.trim_matches(|c| c == ' ' || c == '\t');
    let key = if let Some(rest) = raw.strip_prefix('"') {
        let mut key = String::with_capacity(rest.len());
        let mut chars = rest.chars();
        loop {
            match chars.next() {
                None => return Err("the string has no closing quote"),
                Some('"') => break,
                Some('\\') => match chars.next() {
                    Some(c @ ('"' | '\\')) => key.push(c),
                    _ => return Err("only \\\" and \\\\ may be escaped"),
                },
                Some(c) if (' '..='~').contains(&c) => key.push(c),
                Some(_) => return Err("only visible ASCII is allowed"),
            }
        }
        if !chars.as_str().is_empty() {
            return Err("text follows the closing quote");
        }
        key
    } else {
        if raw
            .bytes()
            .any(|b| !(0x21..=0x7e).contains(&b) || b == b'"')
        {
            return Err("send a quoted string (\"…\") or visible ASCII without spaces");
        }
        if raw.contains(',') {
            // `a,b` is how a proxy joins two lines (RFC 9110 section 5.3): a list, not a key.
            return Err(
                "a comma separates the members of a list, so this reads as several keys; quote a key that contains a comma (\"a,b\")",
            );
        }
        raw.to_owned()
    };
    if key.is_empty() {
        return Err("the key is empty");
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_key_is_found_from_what_the_client_sent() {
        let bare = http_record_key(Some("alice"), "k-1").unwrap();
        assert_eq!(bare, http_record_key(Some("alice"), " \"k-1\" ").unwrap());
        assert_ne!(bare, http_record_key(None, "k-1").unwrap());
        assert_ne!(
            http_record_key(Some("ab"), "c").unwrap(),
            http_record_key(Some("a"), "bc").unwrap()
        );
        for bad in ["", "\"open", "a b", "a,b", "\"x\"y"] {
            assert!(
                matches!(
                    http_record_key(None, bad),
                    Err(IdemError::InvalidKey { .. })
                ),
                "{bad:?}"
            );
        }
    }
}
