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

/// The server's error number of a MySQL / MariaDB refusal, which `sql/error.rs` sorts errors by
/// (none without the backend: no other database's refusal has one).
#[cfg(feature = "mysql")]
pub(crate) use mysql::database_error_number as mysql_number;

/// The server's error number of a MySQL / MariaDB refusal: none without the MySQL backend.
#[cfg(all(not(feature = "mysql"), any(feature = "sqlite", feature = "postgres")))]
pub(crate) fn mysql_number(_: &dyn sqlx::error::DatabaseError) -> Option<u16> {
    None
}
