//! The client's key (header or JSON body field), the record key it becomes, and the request's
//! fingerprint.

use std::cell::Cell;
use std::fmt;

use http::HeaderValue;
use http::request::Parts;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::fingerprint::hex;

use super::config::Config;
use super::service::single_header;

/// Why a request's key could not be used (answered with 400 `invalid-key`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyError {
    Malformed(&'static str),
    TooLong(usize),
    BadBodyField,
    /// The request has this many `Idempotency-Key` lines.
    SeveralHeaders(usize),
    /// The JSON body has a member on the key field's path more than once.
    SeveralBodyFields,
}

impl KeyError {
    pub(crate) fn detail(&self, cfg: &Config) -> String {
        match self {
            KeyError::Malformed(why) => format!("the Idempotency-Key header is malformed: {why}"),
            KeyError::TooLong(len) => format!(
                "the idempotency key is {len} bytes; at most {} are accepted",
                cfg.max_key_len
            ),
            KeyError::BadBodyField => {
                "the idempotency key field of the body must be a non-empty string or a number"
                    .to_owned()
            }
            KeyError::SeveralHeaders(lines) => format!(
                "the request has {lines} Idempotency-Key header lines; several lines of a field are one comma-joined value (RFC 9110 section 5.3), which is not a key, even when the lines are equal: send the header once"
            ),
            KeyError::SeveralBodyFields => format!(
                "the JSON body has the idempotency key field {} (or an object on its path) more than once; JSON parsers disagree on which one counts, so send it once",
                cfg.body_field.as_deref().unwrap_or("")
            ),
        }
    }
}

/// Parses an `Idempotency-Key` value: a structured-field string (RFC 8941, `"…"` with `\"` and
/// `\\` escapes), or, since many clients send it bare, a run of visible ASCII without quotes.
pub(crate) fn parse_header(value: &HeaderValue) -> Result<String, KeyError> {
    let raw = value
        .to_str()
        .map_err(|_| KeyError::Malformed("only visible ASCII is allowed"))?;
    crate::layer_key::parse_key_text(raw).map_err(KeyError::Malformed)
}

/// The request's key: the header (sent once), else the configured JSON body field (present once),
/// else `None`.
pub(crate) fn client_key(
    cfg: &Config,
    parts: &Parts,
    body: &[u8],
) -> Result<Option<String>, KeyError> {
    let key = match single_header(&parts.headers, &cfg.header) {
        Err(lines) => return Err(KeyError::SeveralHeaders(lines)),
        Ok(Some(value)) => Some(parse_header(value)?),
        Ok(None) => match &cfg.body_field {
            Some(pointer) => match body_field(body, pointer)? {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) if !s.is_empty() => Some(s),
                Some(Value::Number(n)) => Some(n.to_string()),
                Some(_) => return Err(KeyError::BadBodyField),
            },
            None => None,
        },
    };
    match key {
        Some(key) if key.len() > cfg.max_key_len => Err(KeyError::TooLong(key.len())),
        key => Ok(key),
    }
}

/// The value at the JSON pointer `pointer` in `body`: `None` when the body is not JSON or has no
/// such field. A member on the pointer's path that appears twice in its object is refused:
/// `serde_json` keeps the last one, other parsers (the handler's, perhaps) the first, so the key
/// and the request the handler sees could disagree.
fn body_field(body: &[u8], pointer: &str) -> Result<Option<Value>, KeyError> {
    let path: Vec<String> = pointer
        .split('/')
        .skip(1)
        .map(|segment| segment.replace("~1", "/").replace("~0", "~"))
        .collect();
    let twice = Cell::new(false);
    let mut de = serde_json::Deserializer::from_slice(body);
    let found = Walk {
        path: &path,
        twice: &twice,
    }
    .deserialize(&mut de)
    .and_then(|found| de.end().map(|()| found));
    match found {
        Ok(found) => Ok(found),
        Err(_) if twice.get() => Err(KeyError::SeveralBodyFields),
        Err(_) => Ok(None),
    }
}

/// Reads a JSON value down `path`, skipping everything off it without building it, and sets
/// `twice` (and fails) when an object on the path has the path's member more than once.
struct Walk<'p> {
    path: &'p [String],
    twice: &'p Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = Option<Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        if self.path.is_empty() {
            return serde::Deserialize::deserialize(d).map(Some);
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = Option<Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (member, rest) = (self.path[0].as_str(), &self.path[1..]);
        let (mut seen, mut found) = (false, None);
        while let Some(name) = map.next_key::<String>()? {
            if name != member {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            if seen {
                self.twice.set(true);
                return Err(de::Error::custom(
                    "a member on the key's path appears twice",
                ));
            }
            seen = true;
            found = map.next_value_seed(Walk {
                path: rest,
                twice: self.twice,
            })?;
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        // An array index in a JSON pointer: digits, no leading zero (RFC 6901).
        let segment = self.path[0].as_str();
        let index = (segment == "0" || !segment.starts_with('0'))
            .then(|| segment.parse::<usize>().ok())
            .flatten();
        let mut found = None;
        let mut i = 0;
        loop {
            if Some(i) == index {
                let walk = Walk {
                    path: &self.path[1..],
                    twice: self.twice,
                };
                match seq.next_element_seed(walk)? {
                    Some(value) => found = value,
                    None => break,
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            i += 1;
        }
        Ok(found)
    }

    // A scalar has no members: the path does not exist.
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i128<E>(self, _: i128) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u128<E>(self, _: u128) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

pub(crate) use crate::layer_key::record_key;

/// The principal's bucket for the per-caller cap.
pub(crate) fn principal_id(principal: Option<&str>) -> [u8; 16] {
    let digest = Sha256::digest(principal.unwrap_or("").as_bytes());
    let mut id = [0; 16];
    id.copy_from_slice(&digest[..16]);
    id
}

/// Whether a `Content-Type` is JSON: `application/json`, or any `+json` type
/// (`application/problem+json`, `application/vnd.api+json`).
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
        || essence
            .rsplit_once('+')
            .is_some_and(|(ty, suffix)| ty.contains('/') && suffix.eq_ignore_ascii_case("json"))
}

/// A `Content-Type` as the fingerprint sees it: its media type, lowercase, without parameters
/// (a client library may add `charset=utf-8` on one try and not the next; a multipart boundary
/// changes on every try, and the body's bytes say the rest).
fn normalized_type(content_type: &[u8]) -> Vec<u8> {
    let essence = content_type.split(|b| *b == b';').next().unwrap_or(b"");
    essence.trim_ascii().to_ascii_lowercase()
}

/// The fingerprint of a request: method, path (with query), the media type of its `Content-Type`,
/// the headers the layer
/// was told to include, and the body. A JSON body (by its `Content-Type`) that parses counts in
/// its canonical form (object members sorted, no insignificant whitespace, numbers in one form),
/// as the attribute's payloads do, unless the layer compares bodies byte for byte; any other body
/// counts byte for byte. Each part carries its length, so no two requests share a fingerprint by
/// moving bytes from one part to the next.
pub(crate) fn fingerprint(cfg: &Config, parts: &Parts, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    let mut part = |bytes: &[u8]| {
        hash.update((bytes.len() as u64).to_be_bytes());
        hash.update(bytes);
    };
    part(parts.method.as_str().as_bytes());
    part(
        parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .as_bytes(),
    );
    let content_type = parts.headers.get(http::header::CONTENT_TYPE);
    part(&content_type.map_or_else(Vec::new, |v| normalized_type(v.as_bytes())));
    for name in &cfg.fingerprint_headers {
        part(name.as_str().as_bytes());
        let values: Vec<&[u8]> = parts
            .headers
            .get_all(name)
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        part(&values.len().to_be_bytes());
        for value in values {
            part(value);
        }
    }
    let json = cfg.canonical_json
        && content_type
            .and_then(|v| v.to_str().ok())
            .is_some_and(is_json);
    match json
        .then(|| serde_json::from_slice::<Value>(body).ok())
        .flatten()
    {
        Some(value) => {
            let mut canonical = Vec::with_capacity(body.len());
            crate::fingerprint::write_canonical(&value, &mut canonical);
            part(b"json");
            part(&canonical);
        }
        None => {
            part(b"bytes");
            part(body);
        }
    }
    hex(&hash.finalize())
}

/// The fingerprint as the record keeps it: the request's `route` (`POST /orders/{id}`) before its
/// `digest`, so an operator's tool shows which route a record is for (`Record::origin`); the store
/// compares digests only. The route is kept to visible ASCII (anything else becomes `?`) and cut
/// to fit every store's fingerprint column (128 ASCII characters on MySQL) with `...`.
pub(crate) fn with_origin(route: &str, digest: &str) -> String {
    const ROUTE_MAX: usize = 128 - 1 - 64;
    let route: String = route
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect();
    match route.get(..ROUTE_MAX - 3) {
        Some(head) if route.len() > ROUTE_MAX => format!("{head}... {digest}"),
        _ => format!("{route} {digest}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<String, KeyError> {
        parse_header(&HeaderValue::from_str(s).unwrap())
    }

    #[test]
    fn a_fingerprint_keeps_its_route_in_ascii_and_in_128_characters() {
        let digest = "d".repeat(64);
        let kept = with_origin("POST /orders/{id}", &digest);
        assert_eq!(kept, format!("POST /orders/{{id}} {digest}"));
        assert_eq!(crate::fingerprint::origin(&kept), Some("POST /orders/{id}"));
        assert!(crate::fingerprint::same(&kept, &digest));
        let long = with_origin(&format!("PUT /caf\u{e9}/{}", "x".repeat(200)), &digest);
        assert_eq!(long.len(), 128);
        assert!(long.starts_with("PUT /caf?/xx") && long.contains("... "));
        assert!(crate::fingerprint::same(&long, &digest));
        assert!(!crate::fingerprint::same(&long, &"e".repeat(64)));
    }

    #[test]
    fn header_values() {
        assert_eq!(parse(r#""8e03978e-40d5""#).unwrap(), "8e03978e-40d5");
        assert_eq!(parse(r#""a \"b\" \\c""#).unwrap(), r#"a "b" \c"#);
        assert_eq!(parse("bare-key_1").unwrap(), "bare-key_1");
        assert_eq!(
            parse(r#""a,b""#).unwrap(),
            "a,b",
            "a quoted comma is part of the key"
        );
        for bad in [
            r#""open"#,
            r#""a\b""#,
            r#""a"x"#,
            r#""""#,
            "two words",
            "a\"b",
            "a,b",
            r#""a", "b""#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn body_fields_are_read_down_their_pointer_and_must_be_there_once() {
        let field = |body: &str, pointer: &str| body_field(body.as_bytes(), pointer);
        assert_eq!(
            field(r#"{"id":"a","x":[1,{"y":2}]}"#, "/id"),
            Ok(Some(Value::from("a")))
        );
        assert_eq!(
            field(r#"{"a":{"b/c":[0,{"d~e":7}]}}"#, "/a/b~1c/1/d~0e"),
            Ok(Some(Value::from(7)))
        );
        assert_eq!(field(r#"{"id":"a"}"#, "/other"), Ok(None));
        assert_eq!(field(r#"[1,2]"#, "/01"), Ok(None));
        assert_eq!(field(r#"{"id":1}"#, "/id/x"), Ok(None));
        assert_eq!(field("not json", "/id"), Ok(None));
        assert_eq!(field(r#"{"id":"a"} trailing"#, "/id"), Ok(None));
        // The same member twice on the path (equal or not) is ambiguous; elsewhere it is not ours.
        assert_eq!(
            field(r#"{"id":"a","id":"b"}"#, "/id"),
            Err(KeyError::SeveralBodyFields)
        );
        assert_eq!(
            field(r#"{"id":"a","id":"a"}"#, "/id"),
            Err(KeyError::SeveralBodyFields)
        );
        assert_eq!(
            field(r#"{"m":{"id":"a"},"m":{"x":1}}"#, "/m/id"),
            Err(KeyError::SeveralBodyFields)
        );
        assert_eq!(
            field(r#"{"id":"a","x":1,"x":2}"#, "/id"),
            Ok(Some(Value::from("a")))
        );
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
