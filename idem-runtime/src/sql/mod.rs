//! What every SQL backend shares: the claim protocol (`claim.rs`).

pub(crate) mod claim;
