//! The idempotency layers' core, shared by every protocol's adapter (`crate::http` for axum and
//! any tower service on `http` types, `crate::grpc` for tonic): reading the key and the caller
//! ([`Principal`]), the flow of a keyed request (cap, claim, run, store, replay, refuse) in lease
//! mode and in transaction mode ([`LayerTx`]), the settings every request reads, the graceful
//! drain ([`Drain`]), and what an answer means. What an answer looks like on the wire (a problem
//! body, a gRPC status) is each adapter's [`Wire`](flow::Wire).
//!
//! Nothing here knows axum or tonic: bodies are `http-body` ones, and the body a layer hands its
//! handler is the adapter's choice.

pub(crate) mod body;
pub(crate) mod cap;
pub(crate) mod config;
mod drain;
pub(crate) mod flow;
pub(crate) mod hint;
pub(crate) mod key;
mod principal;
pub(crate) mod service;
pub(crate) mod settings;
pub(crate) mod stored;
pub(crate) mod tx;

pub use drain::Drain;
pub use principal::Principal;
pub use tx::LayerTx;
