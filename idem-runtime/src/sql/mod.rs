//! What every SQL backend shares: the claim protocol (`claim.rs`), the dialects (`dialect.rs`:
//! placeholders, the clock, identifier quoting, locking reads, savepoints) and the error classes
//! (`error.rs`: which database errors are transient, which mean a missing table).

#[cfg(feature = "sqlite")]
pub(crate) mod claim;
pub(crate) mod dialect;
#[cfg(feature = "sqlite")]
pub(crate) mod error;
