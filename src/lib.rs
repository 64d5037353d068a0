#![doc = include_str!("../README.md")]
//!
//! ## This crate
//!
//! The one dependency users add: it re-exports the runtime ([`Call`], [`Store`], the stores,
//! [`TokenStore`] and the token stores, [`IdemError`], metrics, state machines) and the macros
//! ([`idempotent`], [`consume_token`], [`StateMachine`](macro@StateMachine), [`state_transition`]).
//! The guides are in [`_guide`]; the reference is on the items and modules below. Every example
//! above and in the guides is compiled and run by `cargo test`.

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

/// Guides: how to use idem, one topic a page. Docs only: this module holds no items.
///
/// Every example in them is compiled and run by `cargo test --doc`.
///
/// - [`idempotent`](_guide::idempotent): the `#[idempotent]` attribute, its options, keys scoped
///   by caller, a key kept unique longer than its result.
/// - [`transactions`](_guide::transactions): claim, business writes and result in one database
///   transaction.
/// - [`recovery`](_guide::recovery): holder death and recovery: `recover`, recovery points
///   (`step`), the `Reconciler`, heartbeats.
/// - [`tokens`](_guide::tokens): one-time submit tokens, `#[consume_token]`.
/// - [`transitions`](_guide::transitions): state machines, `#[state_transition]`.
/// - [`stores`](_guide::stores): choosing, configuring and observing a store.
///
/// Elsewhere: the HTTP layer is `idem::http` (feature `axum`), the tonic gRPC layer `idem::grpc`
/// (feature `grpc`), broker consumers and producers are
/// [`inbox`] and `idem::outbox` (a SQL feature), operator actions are [`admin`], what a call does
/// with each record it finds is on [`Call`], and the metrics are [`metrics::names`]. In the
/// repository, `docs/OPERATING.md` covers the `idem` CLI and `docs/STORM.md` the retry-storm tool.
pub mod _guide {
    #[doc = include_str!("../docs/guide/idempotent.md")]
    pub mod idempotent {}
    #[doc = include_str!("../docs/guide/transactions.md")]
    pub mod transactions {}
    #[doc = include_str!("../docs/guide/recovery.md")]
    pub mod recovery {}
    #[doc = include_str!("../docs/guide/tokens.md")]
    pub mod tokens {}
    #[doc = include_str!("../docs/guide/transitions.md")]
    pub mod transitions {}
    #[doc = include_str!("../docs/guide/stores.md")]
    pub mod stores {}
}

/// What the macros' generated code reaches in the macro crate. Not a public API.
#[doc(hidden)]
pub mod __macros {
    pub use idem_macros::check_transition;
}
