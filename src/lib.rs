#![doc = include_str!("../README.md")]
//!
//! ## This crate
//!
//! The one dependency users add: it re-exports the runtime ([`Call`], [`Store`], the stores,
//! [`TokenStore`] and the token stores, [`IdemError`], metrics, state machines) and the macros
//! ([`idempotent`], [`consume_token`], [`StateMachine`], [`state_transition`]). Every example above
//! is compiled and run by `cargo test`.

pub use idem_macros::{StateMachine, state_transition};
pub use idem_macros::{consume_token, idempotent};
/// Operator actions on a store (inspect, release, stuck, sweep), as the `idem` CLI runs them.
pub use idem_runtime::admin;
pub use idem_runtime::*;

/// The sqlx this crate was built with (0.9), for your own queries in idem's transactions
/// (`idem::sqlx::query(…).execute(&mut **tx)`) and for `#[state_transition]` on an `idem::sqlx`
/// transaction. A `sqlx` of another version in your build is another crate: its types are not
/// these.
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
pub use idem_runtime::sqlx;

/// What the macros' generated code reaches in the macro crate. Not a public API.
#[doc(hidden)]
pub mod __macros {
    pub use idem_macros::check_transition;
}
