// The README and the guides (docs/guide/*.md) are written to be read where the repository is
// hosted: their links are reference links whose definitions, at the end of each file, are
// relative paths (another page, a source file). Rustdoc uses the first definition of a label, so
// the definitions below, put before each page, send the same links to the guides' modules and the
// API items here, and to the repository for files that are not part of these docs.
// `tests/tests/doc_links.rs` checks that every relative link resolves and that every label a page
// defines with a relative path has its definition here (and no other).
//! [g-guides]: crate::_guide
//! [g-grpc]: crate::_guide::grpc
//! [g-http]: crate::_guide::http
//! [g-idempotent]: crate::_guide::idempotent
//! [g-lambda]: crate::_guide::lambda
//! [g-messaging]: crate::_guide::messaging
//! [g-operations]: crate::_guide::operations
//! [g-recovery]: crate::_guide::recovery
//! [g-stores]: crate::_guide::stores
//! [g-tokens]: crate::_guide::tokens
//! [g-transitions]: crate::_guide::transitions
//! [g-tx]: crate::_guide::transactions
//! [api-admin]: crate::admin
//! [api-attr]: crate::idempotent
//! [api-cached]: crate::cache::CachedStore
//! [api-call]: crate::Call
//! [api-encrypted]: crate::EncryptedStore
//! [api-error]: crate::IdemError
//! [api-grpc]: crate::grpc
//! [api-http]: crate::http
//! [api-inbox]: crate::inbox
//! [api-inbox-kafka]: crate::inbox::kafka
//! [api-metrics-names]: crate::metrics::names
//! [api-mysql]: crate::MySqlStore
//! [api-outbox]: crate::outbox
//! [api-pg]: crate::PgStore
//! [api-redis]: crate::RedisStore
//! [api-sqlite]: crate::SqliteStore
//! [bad-input]: https://github.com/idemkit/idem/blob/main/docs/BAD_INPUT.md
//! [benchmarks]: https://github.com/idemkit/idem/blob/main/docs/BENCHMARKS.md
//! [changelog]: https://github.com/idemkit/idem/blob/main/CHANGELOG.md
//! [design]: https://github.com/idemkit/idem/blob/main/docs/DESIGN.md
//! [developing]: https://github.com/idemkit/idem/blob/main/docs/DEVELOPING.md
//! [operating]: https://github.com/idemkit/idem/blob/main/docs/OPERATING.md
//! [reliability]: https://github.com/idemkit/idem/blob/main/docs/RELIABILITY.md
//! [security]: https://github.com/idemkit/idem/blob/main/docs/SECURITY.md
//! [storm]: https://github.com/idemkit/idem/blob/main/docs/STORM.md
#![doc = include_str!("../README.md")]
//!
//! ## This crate
//!
//! The one dependency users add: it re-exports the runtime ([`Call`], [`Store`], the stores,
//! [`TokenStore`] and the token stores, [`IdemError`], metrics, state machines) and the macros
//! ([`idempotent`], [`consume_token`], [`StateMachine`](macro@StateMachine), [`state_transition`]).
//! The guides are in [`_guide`]; the reference is on the items and modules below. Every example
//! above and in the guides that is not marked as not tested is compiled and run by `cargo test`.

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

/// The AWS SDK for DynamoDB this crate was built with, to build the client of
/// [`DynamoStore::from_client`] (credentials, endpoint, timeouts, interceptors).
#[cfg(feature = "dynamodb")]
pub use idem_runtime::aws_sdk_dynamodb;

/// The rustdoc definitions of the guides' link labels, put before each guide (see the top of
/// this file).
macro_rules! guide_links {
    () => {
        r#"
[g-grpc]: crate::_guide::grpc
[g-http]: crate::_guide::http
[g-idempotent]: crate::_guide::idempotent
[g-lambda]: crate::_guide::lambda
[g-messaging]: crate::_guide::messaging
[g-operations]: crate::_guide::operations
[g-recovery]: crate::_guide::recovery
[g-stores]: crate::_guide::stores
[g-tokens]: crate::_guide::tokens
[g-transitions]: crate::_guide::transitions
[g-tx]: crate::_guide::transactions
[api-admin]: crate::admin
[api-any-store]: crate::AnyStore
[api-attr]: crate::idempotent
[api-call]: crate::Call
[api-call-recover]: crate::Call::recover
[api-call-result-ttl]: crate::Call::result_ttl
[api-call-run-in-tx]: crate::Call::run_in_tx
[api-call-what]: crate::Call#what-a-call-does
[api-connect]: fn@crate::connect
[api-connect-timeout]: crate::connect::DEFAULT_CONNECT_TIMEOUT
[api-connect-tokens]: crate::connect_tokens
[api-counts]: crate::metrics::counts
[api-counts-for]: crate::metrics::counts_for
[api-error-invalid-options]: crate::IdemError::InvalidOptions
[api-error-lease-lost]: crate::IdemError::LeaseLost
[api-error-result-expired]: crate::IdemError::ResultExpired
[api-error-token-invalid]: crate::IdemError::TokenInvalid
[api-error-token-used]: crate::IdemError::TokenUsed
[api-error-unknown-store]: crate::IdemError::UnknownStore
[api-grpc]: crate::grpc
[api-http]: crate::http
[api-inbox]: crate::inbox
[api-inbox-kafka]: crate::inbox::kafka
[api-lambda]: crate::lambda
[api-lambda-apigw]: crate::lambda::apigw
[api-lambda-sqs]: crate::lambda::sqs
[api-limits]: crate::store::Limits
[api-limits-snapshot]: crate::store::Limits::max_snapshot_len
[api-max-duration]: crate::MAX_DURATION
[api-max-steps]: crate::steps::MAX_STEPS
[api-memory-store]: crate::MemoryStore
[api-memory-tokens]: crate::MemoryTokens
[api-metrics-names]: crate::metrics::names
[api-observe]: crate::metrics::observe
[api-outbox]: crate::outbox
[api-preflight]: crate::preflight
[api-reconciler]: crate::Reconciler
[api-register-store]: crate::register_store
[api-register-tokens]: crate::register_tokens
[api-restarts-tx]: crate::RestartsTransaction
[api-retry-tx]: crate::retry_transaction
[api-sharded]: crate::ShardedStore
[api-sqlite-tx]: crate::SqliteTx
[api-state-machine]: trait@crate::StateMachine
[api-state-machine-mod]: crate::state_machine
[api-step]: crate::step
[api-step-key]: crate::steps::step_key
[api-store]: crate::Store
[api-sweeper]: crate::Sweeper
[api-sweeper-tokens]: crate::Sweeper::with_tokens
[api-test-clock]: crate::TestClock
[api-token-store]: crate::TokenStore
[api-transition]: crate::Transition
[api-transition-sql]: crate::state_machine::TransitionSql
[api-tx-store]: crate::TransactionalStore
[lambda-example]: https://github.com/idemkit/idem/blob/main/examples/lambda_orders.rs
[mq-consumer]: https://github.com/idemkit/idem/blob/main/examples/mq_consumer.rs
[operating]: https://github.com/idemkit/idem/blob/main/docs/OPERATING.md
[readme]: crate
[reliability]: https://github.com/idemkit/idem/blob/main/docs/RELIABILITY.md
[design-resharding]: https://github.com/idemkit/idem/blob/main/docs/DESIGN.md#resharding
[security]: https://github.com/idemkit/idem/blob/main/docs/SECURITY.md
[tests-build]: https://github.com/idemkit/idem/blob/main/tests/build.rs
[tests-contract]: https://github.com/idemkit/idem/tree/main/tests/tests/contract/
[tests-crash]: https://github.com/idemkit/idem/tree/main/tests/tests/crash/
[tests-grpc-layer]: https://github.com/idemkit/idem/blob/main/tests/tests/grpc_layer.rs
[tests-grpc-shop]: https://github.com/idemkit/idem/blob/main/tests/tests/support/grpc_shop.rs
[tests-http-layer]: https://github.com/idemkit/idem/tree/main/tests/tests/http_layer/
[tests-inbox-kafka]: https://github.com/idemkit/idem/blob/main/tests/tests/inbox_kafka.rs
[tests-inbox-nats]: https://github.com/idemkit/idem/blob/main/tests/tests/inbox_nats.rs
[tests-inbox-rabbitmq]: https://github.com/idemkit/idem/blob/main/tests/tests/inbox_rabbitmq.rs
[tests-lambda]: https://github.com/idemkit/idem/blob/main/tests/tests/lambda.rs
[tests-messaging-e2e]: https://github.com/idemkit/idem/blob/main/tests/tests/messaging_e2e.rs
"#
    };
}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/README.md")]
///
/// Docs only: this module and its modules hold no items.
pub mod _guide {
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/guide/idempotent.md")]
    pub mod idempotent {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/guide/transactions.md")]
    pub mod transactions {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/guide/recovery.md")]
    pub mod recovery {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/guide/tokens.md")]
    pub mod tokens {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/guide/transitions.md")]
    pub mod transitions {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/guide/stores.md")]
    pub mod stores {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/guide/http.md")]
    pub mod http {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/guide/grpc.md")]
    pub mod grpc {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/guide/messaging.md")]
    pub mod messaging {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/guide/lambda.md")]
    pub mod lambda {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/guide/operations.md")]
    pub mod operations {}
}

/// What the macros' generated code reaches in the macro crate. Not a public API.
#[doc(hidden)]
pub mod __macros {
    pub use idem_macros::check_transition;
}
