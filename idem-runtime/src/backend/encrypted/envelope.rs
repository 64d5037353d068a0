//! The sealed form of a result snapshot, and the keyring that seals and opens it.
//!
//! ```text
//! offset  len  field
//! 0       4    magic  b"IDEM"   (a plain snapshot is JSON and starts with `{`)
//! 4       1    format version   (1)
//! 5       4    key id, u32 big-endian
//! 9       24   XChaCha20 nonce, random per write (OS random source)
//! 33      n+16 XChaCha20-Poly1305 ciphertext of the n-byte snapshot, then its 16-byte tag
//! ```
//!
//! The associated data is the 33-byte header, the business type's length (u32 big-endian), the
//! business type and the key: a header that was altered, or a ciphertext copied to another
//! `(biz, key)` record, fails authentication.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

use crate::{DecryptFailure, IdemError};

const MAGIC: [u8; 4] = *b"IDEM";
const VERSION: u8 = 1;
const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;
const HEADER_LEN: usize = MAGIC.len() + 1 + 4 + NONCE_LEN;

/// How many bytes sealing adds to a snapshot: a 33-byte header (magic, version, key id, nonce) and
/// a 16-byte authentication tag.
pub const ENVELOPE_OVERHEAD: usize = HEADER_LEN + TAG_LEN;

/// The length a key must have: 32 bytes (256 bits).
const KEY_LEN: usize = 32;

/// The keys an [`crate::EncryptedStore`] seals and opens snapshots with: one current key, which
/// seals every new snapshot, and any number of older keys, which still open the snapshots sealed
/// under them. Each key has an id the service chooses; the id is stored in every snapshot's header.
///
/// To rotate: add a new current key and keep the old one (`Keyring::new(2, new)?.with_old(1, old)?`);
/// drop the old key only once every record sealed under it has expired (the records' TTL after the
/// rotation). A snapshot sealed under a key that is no longer held is refused with
/// [`IdemError::SnapshotDecrypt`] ([`DecryptFailure::UnknownKey`]), and its call does not run again.
///
/// Keys are 32 random bytes (from a secret manager, or `openssl rand 32`). They are zeroized when
/// the keyring is dropped, and `Debug` shows only their ids.
///
/// ```
/// # use idem_runtime as idem;
/// use idem::Keyring;
/// let keyring = Keyring::new(2, [7u8; 32])?.with_old(1, [9u8; 32])?;
/// assert_eq!(keyring.current_id(), 2);
/// assert_eq!(format!("{keyring:?}"), "Keyring { current: 2, ids: [2, 1] }");
/// assert!(Keyring::new(1, b"too short").is_err());
/// # Ok::<(), idem_runtime::IdemError>(())
/// ```
pub struct Keyring {
    current: u32,
    /// The current key first.
    keys: Vec<(u32, XChaCha20Poly1305)>,
}

impl Keyring {
    /// A keyring whose current key, `key` (exactly 32 bytes), has id `current_id`.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a key that is not 32 bytes long.
    pub fn new(current_id: u32, key: impl AsRef<[u8]>) -> Result<Self, IdemError> {
        Ok(Keyring {
            current: current_id,
            keys: vec![(current_id, cipher(current_id, key.as_ref())?)],
        })
    }

    /// Adds a retired key (exactly 32 bytes) with id `id`: snapshots sealed under it still open,
    /// and none is sealed under it any more.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a key that is not 32 bytes long, or an id the keyring
    /// holds already.
    pub fn with_old(mut self, id: u32, key: impl AsRef<[u8]>) -> Result<Self, IdemError> {
        if self.holds(id) {
            return Err(IdemError::InvalidOptions {
                reason: format!(
                    "the keyring holds key id {id} already; every key needs its own id"
                ),
            });
        }
        self.keys.push((id, cipher(id, key.as_ref())?));
        Ok(self)
    }

    /// The id of the key that seals new snapshots.
    pub fn current_id(&self) -> u32 {
        self.current
    }

    /// The ids of every key held, the current one first.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.keys.iter().map(|(id, _)| *id)
    }

    /// Whether the keyring holds a key with this id.
    pub fn holds(&self, id: u32) -> bool {
        self.ids().any(|held| held == id)
    }

    /// The id of the key a sealed snapshot (as the inner store keeps it) was sealed under: for an
    /// operator who wants to know whether records under an old key remain before retiring it.
    ///
    /// # Errors
    /// [`IdemError::SnapshotDecrypt`] when the bytes are no envelope of a known version.
    pub fn key_id_of(sealed: &[u8]) -> Result<u32, IdemError> {
        header(sealed).map(|(id, _)| id)
    }

    fn key(&self, id: u32) -> Option<&XChaCha20Poly1305> {
        self.keys
            .iter()
            .find(|(held, _)| *held == id)
            .map(|(_, k)| k)
    }

    /// Seals `snapshot` of the record `(biz, key)` under the current key, with a fresh nonce.
    pub(crate) fn seal(&self, biz: &str, key: &str, snapshot: &[u8]) -> Result<Vec<u8>, IdemError> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce)
            .map_err(|e| IdemError::store(format!("the OS random source failed: {e}")))?;
        let mut sealed = Vec::with_capacity(ENVELOPE_OVERHEAD + snapshot.len());
        sealed.extend_from_slice(&MAGIC);
        sealed.push(VERSION);
        sealed.extend_from_slice(&self.current.to_be_bytes());
        sealed.extend_from_slice(&nonce);
        let aad = associated_data(&sealed, biz, key);
        let cipher = &self.keys[0].1;
        let ciphertext = cipher
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: snapshot,
                    aad: &aad,
                },
            )
            .map_err(|_| IdemError::store("the snapshot could not be encrypted"))?;
        sealed.extend_from_slice(&ciphertext);
        Ok(sealed)
    }

    /// Opens a snapshot sealed for the record `(biz, key)`.
    pub(crate) fn open(&self, biz: &str, key: &str, sealed: &[u8]) -> Result<Vec<u8>, IdemError> {
        let (id, nonce) = header(sealed)?;
        let cipher = self.key(id).ok_or(IdemError::SnapshotDecrypt {
            reason: DecryptFailure::UnknownKey { key_id: id },
        })?;
        let aad = associated_data(&sealed[..HEADER_LEN], biz, key);
        cipher
            .decrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: &sealed[HEADER_LEN..],
                    aad: &aad,
                },
            )
            .map_err(|_| IdemError::SnapshotDecrypt {
                reason: DecryptFailure::Authentication,
            })
    }
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("current", &self.current)
            .field("ids", &self.ids().collect::<Vec<_>>())
            .finish()
    }
}

fn cipher(id: u32, key: &[u8]) -> Result<XChaCha20Poly1305, IdemError> {
    if key.len() != KEY_LEN {
        return Err(IdemError::InvalidOptions {
            reason: format!(
                "key id {id} is {} bytes long; an encryption key must be exactly {KEY_LEN} bytes",
                key.len()
            ),
        });
    }
    XChaCha20Poly1305::new_from_slice(key).map_err(|_| IdemError::InvalidOptions {
        reason: format!("key id {id} is not a valid XChaCha20-Poly1305 key"),
    })
}

/// The key id and nonce of a sealed snapshot.
fn header(sealed: &[u8]) -> Result<(u32, [u8; NONCE_LEN]), IdemError> {
    let fail = |reason| Err(IdemError::SnapshotDecrypt { reason });
    if sealed.len() < ENVELOPE_OVERHEAD || sealed[..MAGIC.len()] != MAGIC {
        return fail(DecryptFailure::NotAnEnvelope);
    }
    let version = sealed[MAGIC.len()];
    if version != VERSION {
        return fail(DecryptFailure::UnsupportedVersion { version });
    }
    let id = u32::from_be_bytes(sealed[5..9].try_into().expect("4 bytes"));
    let nonce = sealed[9..HEADER_LEN].try_into().expect("24 bytes");
    Ok((id, nonce))
}

/// Header, then the record's identity, unambiguously (the biz length first, the key last).
fn associated_data(header: &[u8], biz: &str, key: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(HEADER_LEN + 4 + biz.len() + key.len());
    aad.extend_from_slice(&header[..HEADER_LEN]);
    aad.extend_from_slice(&u32::try_from(biz.len()).unwrap_or(u32::MAX).to_be_bytes());
    aad.extend_from_slice(biz.as_bytes());
    aad.extend_from_slice(key.as_bytes());
    aad
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Keyring {
        Keyring::new(3, [1u8; 32]).unwrap()
    }

    #[test]
    fn a_sealed_snapshot_opens_only_for_its_own_record() {
        let ring = ring();
        let sealed = ring.seal("PAY", "o-1", b"{\"Ok\":1}").unwrap();
        assert_eq!(sealed.len(), ENVELOPE_OVERHEAD + 8);
        assert_eq!(&sealed[..5], b"IDEM\x01");
        assert_eq!(Keyring::key_id_of(&sealed).unwrap(), 3);
        assert_eq!(ring.open("PAY", "o-1", &sealed).unwrap(), b"{\"Ok\":1}");
        // The biz/key boundary is part of the associated data: ("PA", "Yo-1") is another record.
        for (biz, key) in [("PAY", "o-2"), ("PAYX", "o-1"), ("PA", "Yo-1")] {
            assert!(matches!(
                ring.open(biz, key, &sealed),
                Err(IdemError::SnapshotDecrypt {
                    reason: DecryptFailure::Authentication
                })
            ));
        }
    }

    #[test]
    fn every_seal_has_its_own_nonce() {
        let ring = ring();
        let a = ring.seal("PAY", "o", b"same").unwrap();
        let b = ring.seal("PAY", "o", b"same").unwrap();
        assert_ne!(a[9..HEADER_LEN], b[9..HEADER_LEN]);
        assert_ne!(a, b);
    }

    #[test]
    fn a_changed_byte_anywhere_fails_authentication() {
        let ring = ring();
        let sealed = ring.seal("PAY", "o", b"{\"Ok\":\"secret\"}").unwrap();
        // Every byte after the version and key id: nonce, ciphertext, tag.
        for i in 9..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x01;
            assert!(
                matches!(
                    ring.open("PAY", "o", &bad),
                    Err(IdemError::SnapshotDecrypt {
                        reason: DecryptFailure::Authentication
                    })
                ),
                "byte {i}"
            );
        }
    }

    #[test]
    fn what_is_no_envelope_is_said_so() {
        let ring = ring();
        let sealed = ring.seal("PAY", "o", b"x").unwrap();
        let mut v2 = sealed.clone();
        v2[4] = 2;
        let mut other_key = sealed.clone();
        other_key[5..9].copy_from_slice(&9u32.to_be_bytes());
        let cases: [(&[u8], DecryptFailure); 5] = [
            (b"{\"Ok\":1}", DecryptFailure::NotAnEnvelope),
            (b"", DecryptFailure::NotAnEnvelope),
            (
                &sealed[..ENVELOPE_OVERHEAD - 1],
                DecryptFailure::NotAnEnvelope,
            ),
            (&v2, DecryptFailure::UnsupportedVersion { version: 2 }),
            (&other_key, DecryptFailure::UnknownKey { key_id: 9 }),
        ];
        for (bytes, expected) in cases {
            match ring.open("PAY", "o", bytes) {
                Err(IdemError::SnapshotDecrypt { reason }) => assert_eq!(reason, expected),
                other => panic!("{bytes:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn keys_must_be_32_bytes_and_ids_unique() {
        for len in [0, 16, 31, 33, 64] {
            let err = Keyring::new(1, vec![0u8; len]).unwrap_err();
            assert!(
                matches!(&err, IdemError::InvalidOptions { reason } if reason.contains("exactly 32 bytes")),
                "{len}: {err}"
            );
        }
        let err = ring().with_old(3, [2u8; 32]).unwrap_err();
        assert!(matches!(err, IdemError::InvalidOptions { .. }), "{err}");
        assert!(ring().with_old(1, [2u8; 31]).is_err());
    }

    #[test]
    fn debug_shows_ids_and_no_key_bytes() {
        let ring = Keyring::new(2, [0xAB; 32])
            .unwrap()
            .with_old(1, [0xCD; 32])
            .unwrap();
        let shown = format!("{ring:?} {ring:#?}");
        assert!(shown.contains("current: 2"), "{shown}");
        for byte in ["171", "ab", "AB", "205", "cd", "CD"] {
            assert!(!shown.contains(byte), "{byte} in {shown}");
        }
    }
}
