//! The gRPC layer's configuration: [`GrpcLayerBuilder`], checked once by `build()` at start-up.
//! The settings it shares with the HTTP layer (caller, durations, limits, cap, transaction mode)
//! are the HTTP builder's, checked by the same rules.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderName;
use tonic::Code;

use super::config::{GrpcConfig, GrpcRecoverRequest};
use super::layer::GrpcLayer;
use super::wire::stored_by_default;
use crate::engine::Heartbeat;
use crate::layer::Principal;
use crate::layer::settings::Settings;
use crate::{IdemError, IntoSharedStore};

/// Configures a [`GrpcLayer`]; `build()` checks it. Made by [`GrpcLayer::builder`] (lease mode)
/// or [`GrpcLayer::builder_tx`] (transaction mode).
#[must_use]
pub struct GrpcLayerBuilder {
    shared: Settings,
    tx: bool,
    methods: Vec<String>,
    fingerprint_metadata: Vec<String>,
    store_if: fn(Code) -> bool,
    recover: Option<super::config::RecoverFn>,
    key_from: Option<super::config::KeyFn>,
}

impl GrpcLayerBuilder {
    fn new(mut shared: Settings, tx: bool) -> Self {
        shared.biz = Cow::Borrowed("GRPC");
        shared.canonical_json = false;
        GrpcLayerBuilder {
            shared,
            tx,
            methods: Vec::new(),
            fingerprint_metadata: Vec::new(),
            store_if: stored_by_default,
            recover: None,
            key_from: None,
        }
    }

    /// Covers the unary method at `path` (`/package.Service/Method`, as in the `.proto`: the
    /// package, the service, the method). Calls to methods not named pass through untouched, so
    /// streaming methods and reads need nothing. At least one method is required.
    pub fn method(mut self, path: impl Into<String>) -> Self {
        self.methods.push(path.into());
        self
    }

    /// Covers each of `paths` ([`method`](Self::method)).
    pub fn methods<P: Into<String>>(mut self, paths: impl IntoIterator<Item = P>) -> Self {
        self.methods.extend(paths.into_iter().map(Into::into));
        self
    }

    /// The business type of the layer's records (default `GRPC`).
    pub fn biz(mut self, biz: impl Into<Cow<'static, str>>) -> Self {
        self.shared.biz = biz.into();
        self
    }

    /// Who is calling: part of every record's identity, so a caller that sends another's key runs
    /// its own call. Required ([`Principal::unscoped`] to opt out, with a reason). The caller must
    /// be known before the layer: set it in a tower layer in front of this one (tonic's
    /// `Server::builder().layer(…)` order), or read it from metadata with [`Principal::header`].
    pub fn principal(mut self, principal: Principal) -> Self {
        self.shared.principal = Some(principal);
        self
    }

    /// Where the key comes from when a call has no `idempotency-key` metadata entry: `f` gets the
    /// call's metadata and its request message's bytes (as sent) and answers the key, such as a
    /// field of the message:
    /// `.key_from(|_, message| CreateOrder::decode(message).ok().map(|m| m.request_id))`. An
    /// empty key is no key; a key over [`max_key_len`](Self::max_key_len) is `INVALID_ARGUMENT`.
    /// The entry, when present, wins.
    pub fn key_from<F>(mut self, f: F) -> Self
    where
        F: Fn(&http::HeaderMap, &[u8]) -> Option<String> + Send + Sync + 'static,
    {
        self.key_from = Some(Arc::new(f));
        self
    }

    /// Calls without an `idempotency-key` run without idem (default: `INVALID_ARGUMENT`).
    pub fn key_optional(mut self) -> Self {
        self.shared.required = false;
        self
    }

    /// The longest key accepted, in bytes (default 255, at least 1).
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.shared.max_key_len = bytes;
        self
    }

    /// The largest request message, framed, in bytes (default 1 MiB, at least 1):
    /// `RESOURCE_EXHAUSTED` beyond.
    pub fn max_request_bytes(mut self, bytes: usize) -> Self {
        self.shared.max_request_bytes = bytes;
        self
    }

    /// The largest response kept for replay, framed, in bytes (default 48 KiB; the store's
    /// snapshot limit also applies). A larger response reaches its own client, and repeats get
    /// `ALREADY_EXISTS` (`RESPONSE_NOT_KEPT`): the handler does not run twice.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.shared.max_response_bytes = bytes;
        self
    }

    /// Makes the request metadata entry `name` part of the fingerprint (one that changes what the
    /// handler does: an API version). Names are checked by `build()`.
    pub fn fingerprint_metadata(mut self, name: impl Into<String>) -> Self {
        self.fingerprint_metadata.push(name.into());
        self
    }

    /// Which statuses' responses are stored (default [`stored_by_default`]). Statuses that say
    /// a retry may succeed (`UNAVAILABLE`, `INTERNAL`, `ABORTED`, …) are never stored.
    pub fn store_if(mut self, policy: fn(Code) -> bool) -> Self {
        self.store_if = policy;
        self
    }

    /// How long a record is kept (default 24 hours; longer than the lease, at most
    /// `MAX_DURATION`).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.shared.ttl = ttl;
        self
    }

    /// How long a stored response is kept (1 ms up to the ttl; default: as long as the record);
    /// a repeat after it gets `ALREADY_EXISTS` (`RESULT_EXPIRED`).
    pub fn result_ttl(mut self, result_ttl: Duration) -> Self {
        self.shared.result_ttl = Some(result_ttl);
        self
    }

    /// How long a running call holds its key (default 30 s, 1 ms ..= `MAX_DURATION`).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.shared.lease = lease;
        self
    }

    /// How often a running call renews its lease (default a third of it; 1 ms .. the lease).
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.shared.heartbeat = Heartbeat::Every(every);
        self
    }

    /// No heartbeat: a call longer than its lease may be taken over.
    pub fn no_heartbeat(mut self) -> Self {
        self.shared.heartbeat = Heartbeat::Off;
        self
    }

    /// A repeat while the first call runs waits up to `max` for its response (0 ..=
    /// `MAX_DURATION`) instead of getting `ABORTED` (`IN_PROGRESS`) at once.
    pub fn wait(mut self, max: Duration) -> Self {
        self.shared.wait = Some(max);
        self
    }

    /// The most each store step may take (default 10 s): past it the call gets `UNAVAILABLE`.
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.shared.store_timeout = timeout;
        self
    }

    /// At most `max` new records per caller per `window` (`max` at least 1, `window` 1 ms ..=
    /// `MAX_DURATION`): `RESOURCE_EXHAUSTED` (`TOO_MANY_KEYS`) beyond, with RetryInfo.
    pub fn cap_per_principal(mut self, max: u32, window: Duration) -> Self {
        self.shared.cap = Some((max, window));
        self
    }

    /// Asked, when a retry takes over a call whose handler died (its lease ran out), whether the
    /// call's effect happened: `Ok(Some(message))` with the encoded response message
    /// (`Reply { … }.encode_to_vec().into()`) is stored and returned with status `OK`, `Ok(None)`
    /// runs the handler, an error answers `UNAVAILABLE` (`RECOVER_FAILED`) and runs nothing.
    /// Lease mode only.
    pub fn recover<F, Fut>(mut self, recover: F) -> Self
    where
        F: Fn(GrpcRecoverRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<Bytes>, crate::BoxError>> + Send + 'static,
    {
        self.recover = Some(Arc::new(move |request| Box::pin(recover(request))));
        self
    }

    /// Checks the configuration and makes the layer.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for no covered method or a path not of the form
    /// `/package.Service/Method`, a metadata name that is not one, `recover` in transaction mode,
    /// and everything the HTTP layer's `build()` refuses (no principal, durations and limits out
    /// of range).
    pub fn build(self) -> Result<GrpcLayer, IdemError> {
        let invalid = |reason: String| Err(IdemError::InvalidOptions { reason });
        if self.methods.is_empty() {
            return invalid(
                "the gRPC layer covers no method: name the unary methods it covers with `.method(\"/package.Service/Method\")`"
                    .to_owned(),
            );
        }
        for path in &self.methods {
            let well_formed = path
                .strip_prefix('/')
                .and_then(|p| p.split_once('/'))
                .is_some_and(|(service, method)| {
                    !service.is_empty() && !method.is_empty() && !method.contains('/')
                });
            if !well_formed {
                return invalid(format!(
                    "`method({path:?})`: a gRPC method's path is `/package.Service/Method`"
                ));
            }
        }
        if self.tx && self.recover.is_some() {
            return invalid(
                "`recover` is for lease mode: in transaction mode a handler that dies rolls its transaction back, so there is nothing to recover; drop `.recover(…)` or build with `builder`"
                    .to_owned(),
            );
        }
        let mut shared = self.shared;
        for name in self.fingerprint_metadata {
            match HeaderName::try_from(name.as_str()) {
                Ok(header) if !name.ends_with("-bin") => {
                    shared.fingerprint_header(header);
                }
                _ => {
                    return invalid(format!(
                        "`fingerprint_metadata({name:?})`: not an ASCII metadata key (lowercase letters, digits, `-`, `_`, `.`; binary `-bin` keys are not fingerprinted)"
                    ));
                }
            }
        }
        let cfg = Arc::new(shared.build(false)?);
        let mut methods = self.methods;
        methods.sort();
        methods.dedup();
        Ok(GrpcLayer {
            cfg,
            grpc: Arc::new(GrpcConfig {
                key_from: self.key_from,
                methods,
                store_if: self.store_if,
                recover: self.recover,
            }),
        })
    }
}

impl GrpcLayer {
    /// A gRPC layer in lease mode on any store. Name the methods it covers
    /// ([`method`](GrpcLayerBuilder::method)) and whose calls they are
    /// ([`principal`](GrpcLayerBuilder::principal)), then `build()`.
    pub fn builder(store: impl IntoSharedStore) -> GrpcLayerBuilder {
        GrpcLayerBuilder::new(Settings::new(store), false)
    }

    /// A gRPC layer in transaction mode, on SQLite, MySQL / MariaDB or Postgres: each call with a
    /// new key runs in a transaction of the store that its handler joins with
    /// [`LayerTx::from_grpc`](crate::layer::LayerTx::from_grpc); its writes and its stored response
    /// commit together or not at all.
    pub fn builder_tx<S>(store: S) -> GrpcLayerBuilder
    where
        S: crate::TransactionalStore,
        S::Tx: crate::StoreTx + 'static,
    {
        GrpcLayerBuilder::new(Settings::new_tx(store), true)
    }
}
