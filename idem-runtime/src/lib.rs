//! Runtime of **idem**: the claim → execute → mark engine, the [`Store`] trait and its backends.
//!
//! Users depend on the `idemkit` package (its library is named `idem`,
//! [docs](https://docs.rs/idemkit)), which re-exports this one and the macros.
//! Backends: [`MemoryStore`] always; `SqliteStore` with the `sqlite` feature (default). With the
//! `encrypt` feature, `EncryptedStore` wraps any of them and keeps result snapshots encrypted.
//!
//! Where the reference is: [`Call`] (what a call does with each record it finds), [`IdemError`],
//! the modules `http` (feature `axum`), [`inbox`], `outbox` (a SQL feature) and [`admin`], the
//! metric names in [`metrics::names`], and each store's own page. The guides whose examples need
//! the macros (`#[idempotent]`, transactions, recovery, submit tokens, state transitions, stores)
//! are `idem::_guide` in the [`idemkit` docs](https://docs.rs/idemkit/latest/idem/_guide/index.html).
//! Examples here name the crate `idem`, as users see it.
//!
//! The crate root holds what a service names day to day: the calls ([`Call`], [`step`],
//! [`Recovering`]), the [`Store`] trait, each backend's store, transaction and token store, the
//! transaction-mode traits, [`IdemError`], the registry, [`Reconciler`] and [`Sweeper`], and the
//! defaults of a call. The rest has a module of its own: [`store`](mod@store) (claims, records,
//! limits: what a store implementer or an operator tool reads), [`batch`], [`steps`], [`key`],
//! [`error`], [`recovery`], [`tokens`](mod@tokens), [`connect`](mod@connect), a module per
//! backend for its builder and constants (`postgres`, `mysql`, `dynamodb`),
//! [`metrics`] (outcomes, counters, [`observe`](metrics::observe), metric names), `cache`
//! (feature `cache`: the replay cache and its sizes), `encrypted` (feature `encrypt`: the
//! encrypting store, its keyring and envelope size; the store, its transaction and the keyring
//! are at the root too), and [`state_machine`] (what `#[derive(StateMachine)]` and
//! `#[state_transition]` generate code against, for a transition written or inspected by hand).
//!
//! Layout: `engine/` (calls, snapshots, transaction mode, the running claim), `store/` (the
//! [`Store`] trait and the decision table), `sql/` (what every SQL backend shares: the claim
//! protocol, dialects, error classes), `backend/<name>/` (one folder per store: the store, its
//! transactions, its state-transition support), `transition/` (state machines and the one runtime
//! entry point of `#[state_transition]`), `layer/` (the idempotency layers' protocol-neutral core:
//! key, caller, keyed flow, transaction mode, drain), of which `http/` (axum) and `grpc/` (tonic)
//! are the adapters.
#![warn(missing_docs)]

pub mod admin;
mod backend;
mod backoff;
#[cfg(feature = "cache")]
pub mod cache;
mod clock;
pub mod connect;
pub(crate) mod duration;
mod engine;
pub mod error;
mod fingerprint;
#[cfg(feature = "grpc")]
pub mod grpc;
#[cfg(feature = "axum")]
pub mod http;
pub mod inbox;
pub mod key;
#[cfg(feature = "lambda")]
pub mod lambda;
#[cfg(feature = "layer-core")]
mod layer;
mod layer_key;
pub mod metrics;
mod net;
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
pub mod outbox;
mod preflight;
#[cfg(any(feature = "axum", feature = "lambda"))]
mod problem;
pub mod recovery;
mod registry;
mod sql;
pub mod store;
mod sweeper;
pub mod tokens;
mod transition;

#[doc(hidden)]
#[path = "private/mod.rs"]
pub mod __private;

#[cfg(feature = "dynamodb")]
pub use backend::dynamodb::{DynamoStore, DynamoTokens};
pub use backend::memory::MemoryStore;
#[cfg(feature = "mysql")]
pub use backend::mysql::{MySqlStore, MySqlTokens, MySqlTx};
#[cfg(feature = "postgres")]
pub use backend::postgres::{PgStore, PgTokens, PgTx};
#[cfg(feature = "redis")]
pub use backend::redis::{RedisClusterStore, RedisStore, RedisTokens};
pub use backend::sharded::{ShardedStore, ShardedTx};
#[cfg(feature = "sqlite")]
pub use backend::sqlite::{SqliteStore, SqliteTokens, SqliteTx};
#[cfg(any(test, feature = "test-util"))]
pub use clock::TestClock;
pub use connect::{AnyStore, connect, connect_tokens};
pub use duration::MAX_DURATION;
#[cfg(feature = "encrypt")]
#[doc(no_inline)]
pub use encrypted::{EncryptedStore, EncryptedTx, Keyring};
pub use engine::retry::{RestartsTransaction, retry_transaction};
pub use engine::steps::step;
pub use engine::tx::{IdemTx, MAX_TX_IDLE_TIMEOUT, TransactionalStore, TxIdleTimeout};
pub use engine::{Call, DEFAULT_LEASE, DEFAULT_TTL, Recovering};
pub use error::IdemError;
pub use key::IdemKey;
pub use preflight::preflight;
pub use recovery::Reconciler;
pub use registry::{register_store, store, unregister_store};
pub use store::Store;
pub use sweeper::Sweeper;
pub use tokens::{MemoryTokens, TokenStore, register_tokens, tokens};
pub use transition::{StateMachine, Transition, TransitionTx};

// Names with a module of their own that the runtime's code still reaches at the crate root (which
// of them, depends on the features).
#[cfg(feature = "postgres")]
pub(crate) use backend::postgres::PgStoreBuilder;
pub(crate) use engine::{Batch, DEFAULT_STORE_TIMEOUT};
#[allow(unused_imports)]
pub(crate) use error::{BoxError, Busy, DecryptFailure};
pub(crate) use fingerprint::fingerprint;
#[allow(unused_imports)]
pub(crate) use key::validate_biz;
pub(crate) use layer_key::http_record_key;
#[allow(unused_imports)]
pub(crate) use net::DEFAULT_CONNECT_TIMEOUT;
pub(crate) use registry::IntoSharedStore;
pub(crate) use store::tx::StoreTx;
pub(crate) use store::{Fence, MAX_BATCH, Status, StatusCount};

#[cfg(feature = "encrypt")]
pub mod encrypted {
    //! Encrypted result snapshots (feature `encrypt`): [`EncryptedStore`] wraps any store and
    //! seals what calls returned with the keys of a [`Keyring`]; [`ENVELOPE_OVERHEAD`] is what
    //! sealing adds to each snapshot. The store, its transaction and the keyring are also at the
    //! crate root.

    pub use crate::backend::encrypted::{ENVELOPE_OVERHEAD, EncryptedStore, EncryptedTx, Keyring};
}

pub mod batch {
    //! Claiming many keys at once: a [`Batch`] of [`Call`](crate::Call)s claims them in one round
    //! trip to the store and hands each back as [`Claimed`] (or [`ClaimedRecovering`], with a
    //! recover fn) to run and mark.

    pub use crate::engine::{Batch, Claimed, ClaimedRecovering};
}

pub mod steps {
    //! Steps inside an idempotent body: the bounds on its [`step`](crate::step)s, a key for a
    //! step to pass downstream that is the same in every attempt ([`step_key`]), and the claim
    //! the running call holds, with its fence ([`current_claim`]).

    pub use crate::engine::current::current_claim;
    pub use crate::engine::steps::{MAX_STEP_NAME_LEN, MAX_STEPS, step_key};
}

#[cfg(feature = "postgres")]
pub mod postgres {
    //! PostgreSQL (feature `postgres`): [`PgStoreBuilder`] for a store with options of its own,
    //! the isolation level it runs transactions at ([`PgIsolation`]) and its lock timeout. The
    //! store, its transaction and its token store are at the crate root.

    pub use crate::backend::postgres::{DEFAULT_PG_LOCK_TIMEOUT, PgIsolation, PgStoreBuilder};
}

#[cfg(feature = "mysql")]
pub mod mysql {
    //! MySQL (feature `mysql`): [`MySqlStoreBuilder`] for a store with options of its own. The
    //! store, its transaction and its token store are at the crate root.

    pub use crate::backend::mysql::MySqlStoreBuilder;
}

#[cfg(feature = "dynamodb")]
pub mod dynamodb {
    //! DynamoDB (feature `dynamodb`): the clock-skew margin leases are read with
    //! ([`DEFAULT_SKEW_MARGIN`]). The store and its token store are at the crate root.

    pub use crate::backend::dynamodb::DEFAULT_SKEW_MARGIN;
}

pub mod sharding {
    //! Growing and shrinking a [`ShardedStore`](crate::ShardedStore) while it serves: the
    //! [`Reshard`] tool (what `idem reshard` runs), the [`Layout`] steps it writes into the
    //! shards, and the times a process reads them by.

    pub use crate::backend::sharded::{
        Layout, Phase, REFRESH_EVERY, Reshard, ReshardProgress, STALE_AFTER,
    };
}

pub mod state_machine {
    //! State-machine support: what `#[derive(StateMachine)]` and `#[state_transition]` generate
    //! code against, and what a transition written or inspected by hand names.
    //!
    //! A machine's states go to and from their column through [`ToSqlValue`] / [`SqlValue`] and
    //! `FromStr` ([`UnknownState`] for a name that is no state). A transition's SQL is
    //! [`TransitionSql`], built from its [`TransitionShape`] with one [`DialectSql`] per
    //! [`Dialect`] (`TransitionSql::build` gives what a `#[state_transition]` runs).
    //! [`TransitionConn`] is the connection a transition runs its statements on ([`StateRow`] is a
    //! row it read back); implement it to run transitions through a connection of your own. The
    //! machine trait ([`StateMachine`](crate::StateMachine)), the answer
    //! ([`Transition`](crate::Transition)) and [`TransitionTx`](crate::TransitionTx) are at the
    //! crate root.

    pub use crate::transition::{
        Dialect, DialectSql, SqlText, SqlValue, StateRow, ToSqlValue, TransitionConn,
        TransitionShape, TransitionSql, UnknownState,
    };
}

// The check traits the generated code names, also at the crate root: rustc names an unmet trait
// by its shortest visible path, and `__private` is hidden.
#[doc(hidden)]
pub use __private::{
    AsStore, AsStoreRef, AsTokenStore, AsTokenStoreRef, CarriesIdemError, FromRecoverError,
    IsMachine, IsResult, JoinableTx, Recovers, Storable, SubjectText, TokenText,
};

#[cfg(feature = "dynamodb")]
#[doc(no_inline)]
pub use aws_sdk_dynamodb;
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
#[doc(no_inline)]
pub use sqlx;
