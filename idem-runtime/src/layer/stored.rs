//! What a record keeps of a response, in any protocol: bytes as text or base64, and the response
//! headers (or gRPC metadata) never kept.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use http::HeaderName;
use serde::{Deserialize, Serialize};

/// The header a replayed response carries.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

const SESSION: &str = "it carries the first response's session or credential, and a replay would hand it to whoever repeats the request";
const CREDENTIAL: &str =
    "it is a credential, never a response header: keeping it could only replay a secret";
const EXCHANGE: &str =
    "it authenticates one exchange (RFC 9110 section 11.6.3), not a replay of it";
const HOP: &str =
    "it is a hop-by-hop header: it describes one connection, and the server sets its own on each";
const FRAMING: &str =
    "it frames the message, and the server frames each response it sends from the body it sends";

/// Response headers that are never stored or replayed, whatever
/// [`keep_header`](crate::http::IdempotencyBuilder::keep_header) says, and why.
pub(crate) const NEVER_KEPT: [(&str, &str); 17] = [
    ("set-cookie", SESSION),
    ("set-cookie2", SESSION),
    ("authorization", CREDENTIAL),
    ("proxy-authorization", CREDENTIAL),
    ("cookie", CREDENTIAL),
    ("authentication-info", EXCHANGE),
    ("proxy-authentication-info", EXCHANGE),
    ("proxy-authenticate", HOP),
    ("connection", HOP),
    ("keep-alive", HOP),
    ("proxy-connection", HOP),
    ("te", HOP),
    ("upgrade", HOP),
    ("transfer-encoding", FRAMING),
    ("content-length", FRAMING),
    (
        "trailer",
        "it announces trailer fields, and a stored response has none",
    ),
    (
        REPLAYED_HEADER,
        "it is the layer's own: every replay carries it and a first response never does",
    ),
];

/// Why a response header can never be kept, or `None` when it can.
pub(crate) fn never_kept(name: &HeaderName) -> Option<&'static str> {
    NEVER_KEPT
        .iter()
        .find(|(never, _)| *never == name.as_str())
        .map(|(_, why)| *why)
}

/// Bytes as text when they are UTF-8 (most API bodies), else base64.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum StoredBytes {
    #[serde(rename = "t")]
    Text(String),
    #[serde(rename = "b")]
    Base64(String),
}

impl StoredBytes {
    pub(crate) fn of(bytes: &[u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(text) => StoredBytes::Text(text.to_owned()),
            Err(_) => StoredBytes::Base64(B64.encode(bytes)),
        }
    }

    pub(crate) fn bytes(&self) -> Option<Vec<u8>> {
        match self {
            StoredBytes::Text(text) => Some(text.clone().into_bytes()),
            StoredBytes::Base64(b64) => B64.decode(b64).ok(),
        }
    }
}
