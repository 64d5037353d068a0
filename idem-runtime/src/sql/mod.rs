//! What every SQL backend shares: the claim protocol (`claim.rs`), the record layer
//! (`records.rs`) and the `Store` impl over it (`store.rs`), the transaction every store gives
//! (`tx.rs`) and its one-time submit tokens (`tokens.rs`), the dialects (`dialect.rs`:
//! placeholders, the clock, identifier quoting, locking reads, savepoints), the error classes
//! (`error.rs`: which database errors are transient, which mean a missing table), the statement
//! surface of a transaction and the values it binds (`conn.rs`, `value.rs`), table names
//! (`table.rs`) and the warm connections of the server stores (`warm.rs`). A backend adds its
//! statements' text and what its database does its own way: its impls of `store.rs`'s
//! `SqlStore` (how it lends a connection, its claim), `tx.rs`'s `TxDb` and `tokens.rs`'s
//! `TokenDb`.

#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
pub(crate) mod claim;
pub(crate) mod conn;
pub(crate) mod dialect;
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
pub(crate) mod error;
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
pub(crate) mod records;
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
pub(crate) mod store;
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres", test))]
pub(crate) mod table;
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
pub(crate) mod tokens;
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
pub(crate) mod tx;
pub(crate) mod value;
#[cfg(any(feature = "mysql", feature = "postgres"))]
pub(crate) mod warm;
