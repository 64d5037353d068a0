//! Result snapshots: how a fn's `Ok` value is stored and replayed, and the type proofs the engine
//! takes instead of bounds of its own.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::IdemError;

/// What a stored snapshot holds: the result, or why it could not be stored.
#[derive(Serialize)]
enum SnapshotRef<'a, T> {
    Ok(&'a T),
    Unstorable(&'a str),
}

#[derive(Deserialize)]
enum SnapshotOwned<T> {
    Ok(T),
    Unstorable(String),
}

/// Serializes a result for storage; `Err` holds the envelope to store instead and the error to return.
fn encode<T: Serialize>(value: &T, limit: usize) -> Result<Vec<u8>, (Vec<u8>, IdemError)> {
    let mut bytes = Vec::with_capacity(64);
    let reason = match serde_json::to_writer(&mut bytes, &SnapshotRef::Ok(value)).map(|()| bytes) {
        Ok(bytes) if bytes.len() <= limit => return Ok(bytes),
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
