//! Runtime of **idem**: the claim → execute → mark engine, the [`Store`] trait and its backends.
//!
//! Users depend on the `idem` crate, which re-exports this one and the `#[idempotent]` macro.
//! Backends: [`MemoryStore`] always; `SqliteStore` with the `sqlite` feature (default).
#![warn(missing_docs)]

mod backend;
mod engine;
mod error;
mod fingerprint;
pub mod key;
mod metrics;
mod registry;
#[cfg(feature = "sqlite")]
mod sql;
pub mod store;
mod sweeper;
pub mod transition;

#[doc(hidden)]
#[path = "private/mod.rs"]
pub mod __private;

pub use backend::memory::MemoryStore;
#[cfg(feature = "sqlite")]
pub use backend::sqlite::SqliteStore;
pub use engine::tx_conn::TxConnection;
pub use engine::{Call, DEFAULT_LEASE, DEFAULT_TTL};
pub use error::{BoxError, IdemError};
pub use fingerprint::fingerprint;
pub use key::IdemKey;
pub use metrics::{CallReport, Counts, Outcome, counts, counts_for, observe};
pub use registry::{IntoSharedStore, register_store, store, unregister_store};
pub use store::{ClaimOutcome, ClaimRequest, Limits, Record, Status, Store};
pub use sweeper::Sweeper;
pub use transition::{
    Dialect, DialectSql, SqlText, StateMachine, Transition, TransitionSql, UnknownState,
};

/// Without the `sqlite` feature a machine gets no sqlx impls (see `backend/sqlite/transition.rs`).
#[cfg(not(feature = "sqlite"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_sqlite_text {
    ($machine:ty) => {};
}

/// `#[state_transition]` runs on SQLite only today: without the feature it is a compile error that
/// names the feature.
#[cfg(feature = "sqlite")]
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_require_sqlite {
    () => {};
}

/// `#[state_transition]` runs on SQLite only today: without the feature it is a compile error that
/// names the feature.
#[cfg(not(feature = "sqlite"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_require_sqlite {
    () => {
        ::core::compile_error!(
            "`#[state_transition]` needs the `sqlite` feature of `idem` (the only backend it runs on today)"
        );
    };
}

#[cfg(feature = "sqlite")]
#[doc(no_inline)]
pub use sqlx;
