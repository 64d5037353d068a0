//! Result snapshots: how a fn's `Ok` value is stored and replayed, and the type proofs the engine
//! takes instead of bounds of its own.

use std::sync::atomic::{AtomicUsize, Ordering};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::IdemError;

/// What a stored snapshot holds: the result, or why it could not be stored.
#[derive(Serialize)]
enum SnapshotRef<'a, T> {
    /// Written by hand in `encode` (`OK_OPEN`, the value, `OK_CLOSE`); its test holds the two equal.
    #[cfg_attr(not(test), allow(dead_code))]
    Ok(&'a T),
    Unstorable(&'a str),
}

#[derive(Deserialize)]
enum SnapshotOwned<T> {
    Ok(T),
    Unstorable(String),
}

/// How serde_json writes `SnapshotRef::Ok(value)` around the value: `{"Ok":` … `}`.
const OK_OPEN: &[u8] = b"{\"Ok\":";
const OK_CLOSE: u8 = b'}';

/// How long the last snapshot this process encoded was. The next starts with room for that much,
/// rounded up to the next multiple of 8 (an allocator's smallest size classes are 8 bytes apart, so
/// the rounding costs no memory of its own), so a fn whose results keep about one size gets a
/// buffer of about that size: the memory store keeps it as it is (it copies a buffer with more than
/// 16 bytes to spare, so that no record holds the encoder's spare capacity), and a longer result
/// grows it as any `Vec` grows.
static LAST_LEN: AtomicUsize = AtomicUsize::new(56);

/// Serializes a result for storage; `Err` holds the envelope to store instead and the error to return.
fn encode<T: Serialize>(value: &T, limit: usize) -> Result<Vec<u8>, (Vec<u8>, IdemError)> {
    // The envelope's bytes written around the value: what serializing `SnapshotRef::Ok(value)`
    // writes (a test holds the two equal), without the enum's serializer calls.
    let last = LAST_LEN.load(Ordering::Relaxed);
    let mut bytes = Vec::with_capacity((last + 8) & !7);
    bytes.extend_from_slice(OK_OPEN);
    let written = serde_json::to_writer(&mut bytes, value).map(|()| {
        bytes.push(OK_CLOSE);
        bytes
    });
    let reason = match written {
        Ok(bytes) if bytes.len() <= limit => {
            if bytes.len() != last {
                LAST_LEN.store(bytes.len(), Ordering::Relaxed);
            }
            return Ok(bytes);
        }
        Ok(bytes) => format!(
            "the result is {} bytes; the store's snapshot limit is {limit}",
            bytes.len()
        ),
        Err(e) => format!("the result failed to serialize: {e}"),
    };
    let envelope =
        serde_json::to_vec(&SnapshotRef::<()>::Unstorable(&reason)).expect("a string serializes");
    Err((envelope, IdemError::ResultNotStorable { reason }))
}

fn decode<T: DeserializeOwned>(snapshot: &[u8]) -> Result<T, IdemError> {
    // What `encode` wrote: the value between `{"Ok":` and `}`, parsed on its own. A value that
    // parses there is the whole envelope's `Ok`; anything else (whitespace, the other variant, a
    // broken snapshot) goes through the envelope's own parser, which says what it is.
    if let Some(inner) = snapshot
        .strip_prefix(OK_OPEN)
        .and_then(|rest| rest.strip_suffix(&[OK_CLOSE]))
        && let Ok(value) = serde_json::from_slice::<T>(inner)
    {
        return Ok(value);
    }
    match serde_json::from_slice::<SnapshotOwned<T>>(snapshot) {
        Ok(SnapshotOwned::Ok(v)) => Ok(v),
        Ok(SnapshotOwned::Unstorable(reason)) => Err(IdemError::ResultNotStorable { reason }),
        Err(e) => Err(IdemError::ReplayDecode {
            reason: e.to_string(),
        }),
    }
}

/// Serializes a result within a size limit; `Err` holds the envelope to store instead and the error.
type Encoder<T> = fn(&T, usize) -> Result<Vec<u8>, (Vec<u8>, IdemError)>;

/// Proof that a fn's `Ok` type can be stored and replayed: its encoder and decoder.
///
/// Made by a bounded constructor, so the engine entry points that take it need no bounds of their
/// own: a type that is not storable is reported once, where the proof is made.
pub struct OkType<T> {
    pub(crate) encode: Encoder<T>,
    pub(crate) decode: fn(&[u8]) -> Result<T, IdemError>,
}

impl<T> Clone for OkType<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for OkType<T> {}

impl<T: Serialize + DeserializeOwned> OkType<T> {
    /// The proof for `T`.
    pub fn new() -> Self {
        OkType {
            encode: encode::<T>,
            decode: decode::<T>,
        }
    }
}

impl<T: Serialize + DeserializeOwned> Default for OkType<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Proof that a fn's error type can carry an [`IdemError`].
pub struct ErrType<E> {
    from: fn(IdemError) -> E,
}

impl<E> Clone for ErrType<E> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<E> Copy for ErrType<E> {}

impl<E: From<IdemError>> ErrType<E> {
    /// The proof for `E`.
    pub fn new() -> Self {
        ErrType { from: E::from }
    }
}

impl<E: From<IdemError>> Default for ErrType<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> ErrType<E> {
    /// Converts an idem error into the fn's error type.
    pub fn from_idem(self, e: IdemError) -> E {
        (self.from)(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Receipt {
        id: u64,
        note: String,
        lines: Vec<(String, i64)>,
    }

    fn receipt() -> Receipt {
        Receipt {
            id: 7,
            note: "a \"quoted\" } brace".to_owned(),
            lines: vec![("x".to_owned(), -1)],
        }
    }

    #[test]
    fn encode_writes_the_envelope_serde_writes() {
        fn same<T: Serialize>(value: &T) {
            let ours = encode(value, usize::MAX).unwrap();
            let serde = serde_json::to_vec(&SnapshotRef::Ok(value)).unwrap();
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                String::from_utf8(serde).unwrap()
            );
        }
        same(&receipt());
        same(&7u64);
        same(&());
        same(&"}");
        same(&Option::<u8>::None);
        same(&vec![1, 2]);
    }

    #[test]
    fn decode_reads_every_form_of_the_envelope() {
        let bytes = encode(&receipt(), usize::MAX).unwrap();
        assert_eq!(decode::<Receipt>(&bytes).unwrap(), receipt());
        // Forms `encode` never writes, read by the envelope's parser.
        assert_eq!(decode::<u64>(b"{ \"Ok\" : 5 }").unwrap(), 5);
        assert_eq!(decode::<u64>(b"{\"Ok\":5 }").unwrap(), 5);
        assert!(matches!(
            decode::<u64>(br#"{"Unstorable":"too big"}"#),
            Err(IdemError::ResultNotStorable { reason }) if reason == "too big"
        ));
        // Between the braces but not one value of the type: refused, not half read.
        assert!(matches!(
            decode::<u64>(br#"{"Ok":5,"Unstorable":"x"}"#),
            Err(IdemError::ReplayDecode { .. })
        ));
        assert!(matches!(
            decode::<u64>(br#"{"Ok":"five"}"#),
            Err(IdemError::ReplayDecode { .. })
        ));
        assert!(matches!(
            decode::<u64>(b"{\"Ok\":}"),
            Err(IdemError::ReplayDecode { .. })
        ));
    }

    #[test]
    fn an_oversized_result_is_stored_as_why() {
        let (envelope, e) = encode(&"x".repeat(100), 50).unwrap_err();
        assert!(matches!(e, IdemError::ResultNotStorable { .. }));
        assert!(matches!(
            decode::<String>(&envelope),
            Err(IdemError::ResultNotStorable { reason }) if reason.contains("limit is 50")
        ));
    }
}
