//! The client's key (header or JSON body field), the record key it becomes, and the request's
//! fingerprint.

use http::HeaderValue;
use http::request::Parts;
use sha2::{Digest, Sha256};

use crate::fingerprint::hex;

use super::layer::Config;

/// Why a request's key could not be used (answered with 400).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyError {
    Malformed(&'static str),
    TooLong(usize),
    BadBodyField,
}

impl KeyError {
    pub(crate) fn detail(&self, max: usize) -> String {
        match self {
            KeyError::Malformed(why) => format!("the Idempotency-Key header is malformed: {why}"),
            KeyError::TooLong(len) => {
                format!("the idempotency key is {len} bytes; at most {max} are accepted")
            }
            KeyError::BadBodyField => {
                "the idempotency key field of the body must be a non-empty string or a number"
                    .to_owned()
            }
        }
    }
}

/// Parses an `Idempotency-Key` value: a structured-field string (RFC 8941, `"…"` with `\"` and
/// `\\` escapes), or, since many clients send it bare, a run of visible ASCII without quotes.
pub(crate) fn parse_header(value: &HeaderValue) -> Result<String, KeyError> {
    let raw = value
        .to_str()
        .map_err(|_| KeyError::Malformed("only visible ASCII is allowed"))?
        .trim_matches(|c| c == ' ' || c == '\t');
    let key = if let Some(rest) = raw.strip_prefix('"') {
        let mut key = String::with_capacity(rest.len());
        let mut chars = rest.chars();
        loop {
            match chars.next() {
                None => return Err(KeyError::Malformed("the string has no closing quote")),
                Some('"') => break,
                Some('\\') => match chars.next() {
                    Some(c @ ('"' | '\\')) => key.push(c),
                    _ => return Err(KeyError::Malformed("only \\\" and \\\\ may be escaped")),
                },
                Some(c) if (' '..='~').contains(&c) => key.push(c),
                Some(_) => return Err(KeyError::Malformed("only visible ASCII is allowed")),
            }
        }
        if !chars.as_str().is_empty() {
            return Err(KeyError::Malformed("text follows the closing quote"));
        }
        key
    } else {
        if raw
            .bytes()
            .any(|b| !(0x21..=0x7e).contains(&b) || b == b'"')
        {
            return Err(KeyError::Malformed(
                "send a quoted string (\"…\") or visible ASCII without spaces",
            ));
        }
        raw.to_owned()
    };
    if key.is_empty() {
        return Err(KeyError::Malformed("the key is empty"));
    }
    Ok(key)
}

/// The request's key: the header, else the configured JSON body field, else `None`.
pub(crate) fn client_key(
    cfg: &Config,
    parts: &Parts,
    body: &[u8],
) -> Result<Option<String>, KeyError> {
    let key = if let Some(value) = parts.headers.get(&cfg.header) {
        Some(parse_header(value)?)
    } else if let Some(pointer) = &cfg.body_field {
        match serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .as_ref()
            .and_then(|v| v.pointer(pointer))
        {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            Some(_) => return Err(KeyError::BadBodyField),
        }
    } else {
        None
    };
    match key {
        Some(key) if key.len() > cfg.max_key_len => Err(KeyError::TooLong(key.len())),
        key => Ok(key),
    }
}

/// The record key for a client key sent by `principal`: 64 hex digits of SHA-256 over both, so
/// keys of different callers never meet, every key fits every store, and the store never holds
/// a client's raw key.
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
    hex(&hash.finalize())
}

/// The principal's bucket for the per-caller cap.
pub(crate) fn principal_id(principal: Option<&str>) -> [u8; 16] {
    let digest = Sha256::digest(principal.unwrap_or("").as_bytes());
    let mut id = [0; 16];
    id.copy_from_slice(&digest[..16]);
    id
}

/// The fingerprint of method, path (with query) and body.
pub(crate) fn fingerprint(parts: &Parts, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(parts.method.as_str().as_bytes());
    hash.update([0]);
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    hash.update(path.as_bytes());
    hash.update([0]);
    hash.update(body);
    hex(&hash.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<String, KeyError> {
        parse_header(&HeaderValue::from_str(s).unwrap())
    }

    #[test]
    fn header_values() {
        assert_eq!(parse(r#""8e03978e-40d5""#).unwrap(), "8e03978e-40d5");
        assert_eq!(parse(r#""a \"b\" \\c""#).unwrap(), r#"a "b" \c"#);
        assert_eq!(parse("bare-key_1").unwrap(), "bare-key_1");
        for bad in [
            r#""open"#,
            r#""a\b""#,
            r#""a"x"#,
            r#""""#,
            "two words",
            "a\"b",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn record_keys_separate_callers() {
        let a = record_key(Some("alice"), "k1");
        assert_eq!(a.len(), 64);
        assert_eq!(a, record_key(Some("alice"), "k1"));
        assert_ne!(a, record_key(Some("bob"), "k1"));
        assert_ne!(a, record_key(None, "k1"));
        assert_ne!(record_key(Some("ab"), "c"), record_key(Some("a"), "bc"));
        assert!(!a.contains("k1"));
    }
}
