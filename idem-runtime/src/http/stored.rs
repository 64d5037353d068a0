//! A response as stored for replay: status, the headers the layer keeps, and the body.

use axum::body::Body;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use serde::{Deserialize, Serialize};

use super::problem::problem;
use crate::layer::stored::{REPLAYED_HEADER, StoredBytes, never_kept};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Stored {
    /// Status code.
    s: u16,
    /// Kept headers, in order (a name may repeat).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    h: Vec<(String, StoredBytes)>,
    /// The body; `None` when it was over the size limit and so not kept.
    b: Option<StoredBytes>,
}

impl Stored {
    /// The response's status, the headers named in `keep`, and the body.
    pub(crate) fn of(
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
        keep: &[HeaderName],
    ) -> Self {
        let h = keep
            .iter()
            .flat_map(|name| {
                headers
                    .get_all(name)
                    .iter()
                    .map(move |v| (name.as_str().to_owned(), StoredBytes::of(v.as_bytes())))
            })
            .collect();
        Stored {
            s: status.as_u16(),
            h,
            b: Some(StoredBytes::of(body)),
        }
    }

    /// An upper bound on the record's JSON size: every byte of text escapes to at most 6 (`\u00XX`)
    /// and base64 is 4 for 3, plus the field names and punctuation, so a record under it needs no
    /// serialization to know it fits.
    pub(crate) fn json_len_bound(&self) -> usize {
        let bytes = |b: &StoredBytes| match b {
            StoredBytes::Text(t) | StoredBytes::Base64(t) => t.len() * 6 + 16,
        };
        let headers: usize = self.h.iter().map(|(n, v)| n.len() * 6 + bytes(v) + 8).sum();
        32 + headers + self.b.as_ref().map_or(0, bytes)
    }

    /// The same record without its body (over the size limit): repeats are told it was not kept.
    pub(crate) fn without_body(self) -> Self {
        Stored { b: None, ..self }
    }

    /// The stored response again, marked `Idempotent-Replayed: true`. A record whose body was not
    /// kept (over the size limit) answers 409 with a problem saying so.
    pub(crate) fn replay(&self) -> Response<Body> {
        let mut response = match &self.b {
            None => problem(
                StatusCode::CONFLICT,
                "response-not-kept",
                "Request already processed",
                "a request with this idempotency key was processed, but its response was too large to keep for replay; do not send it again",
            ),
            Some(body) => {
                let status = StatusCode::from_u16(self.s).unwrap_or(StatusCode::OK);
                let mut response = Response::new(Body::from(body.bytes().unwrap_or_default()));
                *response.status_mut() = status;
                for (name, value) in &self.h {
                    let (Ok(name), Some(value)) =
                        (HeaderName::try_from(name.as_str()), value.bytes())
                    else {
                        continue;
                    };
                    // A record written before a header was refused (an older version that let
                    // `keep_header(SET_COOKIE)` through) still never replays it.
                    if never_kept(&name).is_some() {
                        continue;
                    }
                    if let Ok(value) = HeaderValue::from_bytes(&value) {
                        response.headers_mut().append(name, value);
                    }
                }
                response
            }
        };
        response.headers_mut().insert(
            HeaderName::from_static(REPLAYED_HEADER),
            HeaderValue::from_static("true"),
        );
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::stored::NEVER_KEPT;

    #[test]
    fn round_trips_status_headers_and_binary_bodies() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("link", HeaderValue::from_static("</a>"));
        headers.append("link", HeaderValue::from_static("</b>"));
        headers.insert("set-cookie", HeaderValue::from_static("session=secret"));
        let keep = [
            HeaderName::from_static("content-type"),
            HeaderName::from_static("link"),
        ];
        let stored = Stored::of(StatusCode::CREATED, &headers, &[0xff, 0, 1], &keep);
        let json = serde_json::to_string(&stored).unwrap();
        assert!(!json.contains("secret"), "{json}");
        let back: Stored = serde_json::from_str(&json).unwrap();
        let response = back.replay();
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(response.headers()["content-type"], "application/json");
        let links: Vec<_> = response.headers().get_all("link").iter().collect();
        assert_eq!(links, ["</a>", "</b>"]);
        assert!(response.headers().get("set-cookie").is_none());
        assert_eq!(response.headers()[REPLAYED_HEADER], "true");
    }

    #[test]
    fn headers_never_kept_are_not_replayed_from_an_old_record() {
        let mut headers = HeaderMap::new();
        headers.insert("set-cookie", HeaderValue::from_static("session=secret"));
        headers.insert("content-length", HeaderValue::from_static("999"));
        headers.insert("etag", HeaderValue::from_static("\"v1\""));
        // What an older version stored for `keep_header(SET_COOKIE)` and friends.
        let keep = [
            HeaderName::from_static("set-cookie"),
            HeaderName::from_static("content-length"),
            HeaderName::from_static("etag"),
        ];
        let response = Stored::of(StatusCode::OK, &headers, b"ok", &keep).replay();
        assert!(response.headers().get("set-cookie").is_none());
        assert!(response.headers().get("content-length").is_none());
        assert_eq!(response.headers()["etag"], "\"v1\"");
        for (name, why) in NEVER_KEPT {
            assert_eq!(
                HeaderName::from_static(name).as_str(),
                name,
                "lowercase: {name}"
            );
            assert!(!why.is_empty());
        }
    }

    #[test]
    fn the_json_length_bound_is_never_below_the_json() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("text/plain"));
        headers.insert("etag", HeaderValue::from_bytes(b"\"\\\xff\"").unwrap());
        let keep = [
            HeaderName::from_static("content-type"),
            HeaderName::from_static("etag"),
        ];
        let control: Vec<u8> = (0u8..32).collect();
        let quotes = "\"\\".repeat(50);
        let bodies: [&[u8]; 5] = [b"", b"ok", &control, quotes.as_bytes(), &[0xff; 77]];
        for body in bodies {
            for stored in [
                Stored::of(StatusCode::OK, &headers, body, &keep),
                Stored::of(StatusCode::OK, &HeaderMap::new(), body, &[]).without_body(),
            ] {
                let json = serde_json::to_vec(&stored).unwrap();
                assert!(stored.json_len_bound() >= json.len(), "{body:?}");
            }
        }
    }

    #[test]
    fn a_body_not_kept_replays_as_a_conflict() {
        let stored = Stored::of(StatusCode::OK, &HeaderMap::new(), b"big", &[]).without_body();
        let response = stored.replay();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
    }
}
