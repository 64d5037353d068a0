//! The backends: one module per store, each behind its cargo feature (memory is always built).
//! A backend folder holds its store, its transaction support and its state-transition support.

#[cfg(feature = "dynamodb")]
pub(crate) mod dynamodb;
#[cfg(feature = "encrypt")]
pub(crate) mod encrypted;
pub(crate) mod memory;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "redis")]
pub(crate) mod redis;
pub(crate) mod sharded;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;
