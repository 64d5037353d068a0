//! gRPC (feature `grpc`): a tower layer for tonic servers ([`GrpcLayer`]) with the HTTP layer's
//! idempotency semantics for unary calls.
//!
//! The client sends its key in the request metadata `idempotency-key` (or, with
//! [`GrpcLayerBuilder::key_from`], the layer reads it from the message). The first call with a key
//! runs the handler; its response (initial metadata, message, status and trailing metadata) is
//! stored, and every repeat gets it again with the metadata entry `idempotent-replayed: true`
//! ([`REPLAYED_METADATA`]). The layer works on the HTTP/2 exchange, below the codec, so it serves
//! any tonic service (prost or another codec) without knowing its types.
//!
//! ```no_run
//! # use idem_runtime as idem;
//! # async fn demo(store: idem::SqliteStore) -> Result<(), Box<dyn std::error::Error>> {
//! use idem::grpc::GrpcLayer;
//! use idem::grpc::Principal;
//!
//! let layer = GrpcLayer::builder(store)
//!     .method("/shop.Orders/Create")                                     // the unary methods covered
//!     .principal(Principal::header(http::HeaderName::from_static("x-user-id"))) // whose calls
//!     .build()?;
//! layer.check().await?; // at start-up: the store answers and is migrated
//! # let orders_server = tower::service_fn(|_: http::Request<tonic::body::Body>| async {
//! #     Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
//! # });
//! // tonic::transport::Server::builder().layer(layer).add_service(OrdersServer::new(orders)).serve(addr).await?;
//! let service = tower::Layer::layer(&layer, orders_server);
//! # let _ = service; Ok(()) }
//! ```
//!
//! With tonic: `Server::builder().layer(layer).add_service(OrdersServer::new(orders))`, or
//! `tower::ServiceBuilder::new().layer(layer).service(OrdersServer::new(orders))` for one
//! service. Calls to methods the layer does not name pass through untouched.
//!
//! **The tonic service itself** (`OrdersServer`, its `Orders` trait, the client) is generated at
//! build time, either from a `.proto` file by `tonic-prost-build` (which needs `protoc` on the
//! build machine) or, with no `.proto` file and no `protoc`, from a description in Rust by
//! `tonic-build`'s `tonic_build::manual::Builder`, the messages then being prost structs written by
//! hand. The repository's tests take the second path: `tests/build.rs` describes `shop.Orders`,
//! and `tests/tests/support/grpc_shop.rs` holds its messages and includes the generated code. The
//! gRPC guide (`docs/guide/grpc.md` in the repository; `idem::_guide::grpc` in the docs of the
//! `idemkit` package) shows both paths with their dependencies (`tonic`, `tonic-prost` and
//! `prost` 0.14).
//!
//! **The caller.** As in the HTTP layer, [`Principal`] is part of each
//! record's identity: a caller that sends another's key runs its own call and never sees the
//! other's response. Read it from metadata a gateway sets ([`Principal::header`]), or
//! from an extension your authentication layer inserts ([`Principal::extension`]); that layer must
//! run before this one (a tonic interceptor inside the service runs after it: make it a tower
//! layer with `tonic::service::InterceptorLayer`, added before this one).
//!
//! **The fingerprint** is the method and the request message's bytes as sent (and the metadata
//! named with [`GrpcLayerBuilder::fingerprint_metadata`]): the same key with another message is
//! refused. Protobuf encoders write the same message the same way, so a client that retries with
//! the message it built replays; a compressed request is compared as sent.
//!
//! # Answers
//!
//! Every refusal is a gRPC status whose details (`grpc-status-details-bin`, read with
//! `tonic_types::StatusExt`) carry a `google.rpc.ErrorInfo` with the domain `idem`
//! ([`ERROR_DOMAIN`]) and a reason, and a `google.rpc.RetryInfo` where trying again later helps.
//!
//! | Answer | Reason | When |
//! |---|---|---|
//! | the handler's response | | the first call with a key |
//! | the stored response + `idempotent-replayed: true` | | a repeat of a finished call (a stored non-`OK` status too, such as `NOT_FOUND`) |
//! | the handler's response, not stored | | a status [`stored_by_default`] (or [`store_if`](GrpcLayerBuilder::store_if)) leaves out, and always `UNAVAILABLE`, `INTERNAL`, `ABORTED`, `UNKNOWN`, `CANCELLED`, `DEADLINE_EXCEEDED`, `DATA_LOSS`: the key is released and a retry runs the handler again (in transaction mode its writes are rolled back) |
//! | `INVALID_ARGUMENT` | `MISSING_KEY`, `INVALID_KEY` | a covered call without a usable key, or with several `idempotency-key` entries |
//! | `INVALID_ARGUMENT` | `NOT_UNARY`, `REQUEST_UNREADABLE` | a covered call whose request is not one message (a streaming method on the list), or could not be read to its end |
//! | `UNAUTHENTICATED` | `NO_PRINCIPAL` | the principal extractor found no caller |
//! | `ABORTED` + RetryInfo | `IN_PROGRESS` | a repeat while the first still runs (lease mode; in transaction mode a repeat waits for the first's commit), or a call whose claim another took over before its handler ran; the delay is how long that method recently took, at least 1 s |
//! | `FAILED_PRECONDITION` | `PAYLOAD_MISMATCH` | the key was used with another method, message or fingerprinted metadata |
//! | `ALREADY_EXISTS` | `RESPONSE_NOT_KEPT` | a repeat of a call whose response was over the size limit (48 KiB by default): it ran once and is not run again |
//! | `ALREADY_EXISTS` | `RESULT_EXPIRED` | a repeat after [`result_ttl`](GrpcLayerBuilder::result_ttl): the handler does not run again |
//! | `RESOURCE_EXHAUSTED` | `REQUEST_TOO_LARGE` | a request over the limit (1 MiB by default) |
//! | `RESOURCE_EXHAUSTED` + RetryInfo | `TOO_MANY_KEYS` | the caller is over its cap of new records |
//! | `UNAVAILABLE` + RetryInfo | `STORE_UNAVAILABLE` | the store failed (in transaction mode also: the transaction could not begin or commit); nothing ran, or nothing of it was kept |
//! | `UNAVAILABLE` + RetryInfo | `RECOVER_FAILED` | a retry took over a call whose handler died, and the recover fn could not tell whether it had its effect; nothing ran |
//! | `UNAVAILABLE` | `SHUTTING_DOWN` | the runtime dropped the handler's task at shutdown before it answered |
//! | `INTERNAL` | `INTERNAL`, `LAYER_MISCONFIGURED` | a fault to fix in the service, logged with its cause (a store never migrated, a handler that kept the transaction past its answer, [`LayerTx::from_grpc`] without a transaction-mode layer) |
//!
//! `ABORTED` for a call in progress follows the gRPC status guide (a concurrency conflict, retried
//! at a higher level); `FAILED_PRECONDITION` for a reused key says the call depends on state (the
//! key's first use) that a retry does not change; `ALREADY_EXISTS` says the call's action was
//! done.
//!
//! **Streaming calls** are not covered: a request stream is not one message to fingerprint, and a
//! response stream is not one answer to replay. Leave them off the method list and they pass
//! through; a streaming method put on the list is refused with `INVALID_ARGUMENT` (`NOT_UNARY`)
//! when its request holds more or fewer than one message. Make such a call idempotent inside its
//! handler, with `Call` or `#[idempotent]` per message.
//!
//! **Deadlines.** The handler runs on a task of its own: a client whose deadline passes (or a
//! proxy that gives up) does not cancel it, so its response is stored and the retry replays it.
//! At shutdown, [`GrpcLayer::drain`] waits for the handlers still running.
//!
//! # Transaction mode
//!
//! On SQLite, MySQL / MariaDB and Postgres, [`GrpcLayer::builder_tx`] begins a transaction for each
//! call with a new key and claims the key in it; the handler joins it with
//! [`LayerTx::from_grpc`]`(&request)`; the stored response and the
//! handler's writes commit together. A status that is not stored, a panic or a process killed
//! mid-handler roll everything back, so a retry runs at once.
//!
//! # When a handler dies (lease mode)
//!
//! A handler killed after its effect leaves its record running; repeats get `ABORTED` until its
//! lease ends, then one runs the handler again, unless the layer has a recover fn:
//! [`GrpcLayerBuilder::recover`]`(|req: GrpcRecoverRequest| async { … })` is asked first with the
//! call ([`GrpcRecoverRequest`]: key, caller, method, metadata, message) and answers the encoded
//! response message from what the handler wrote (`Ok(Some(bytes))`), `Ok(None)` to run it, or an
//! error for `UNAVAILABLE` (`RECOVER_FAILED`).
//!
//! **Finding a call's record.** As the HTTP layer's, each record is kept under a hash of the
//! caller and the key, with the method's path before the fingerprint's digest: `idem inspect GRPC
//! order-77 --principal alice` (`--http` for a layer without a principal) finds the record of
//! the key `order-77` sent by `alice`; `idem stuck` and `idem stats` show the method.
//!
//! # Defaults
//!
//! As the HTTP layer's (24 hours' ttl, a 30 s lease with its heartbeat, 255-byte keys, 1 MiB
//! requests, 48 KiB kept responses, the store timeout, no cap, no wait), with the business type
//! `GRPC`; each has its setter on [`GrpcLayerBuilder`], checked by `build()`
//! (`IdemError::InvalidOptions` out of range), never per call.
//!
//! # What proves it
//!
//! `tests/tests/grpc_layer.rs` in the repository runs a tonic server and client over loopback:
//! 64 concurrent duplicates of one call run its handler once (audited in the handler's own
//! table); another message under the same key; every refusal's status; a server killed with
//! SIGKILL after its handler's effect, recovered on restart; transaction mode with the server
//! killed before its commit.

mod builder;
mod config;
mod layer;
mod tx;
mod wire;

/// Whose calls a key belongs to, the transaction a transaction-mode handler writes in
/// (`LayerTx::from_grpc`) and the handle that waits for the handlers at shutdown: the layer
/// core's types, which the HTTP layer names too, so a gRPC service imports what it uses from
/// `idem::grpc`.
pub use crate::layer::{Drain, LayerTx, Principal};
pub use builder::GrpcLayerBuilder;
pub use config::GrpcRecoverRequest;
pub use layer::{GrpcIdempotency, GrpcLayer};
pub use wire::{ERROR_DOMAIN, REPLAYED_METADATA, stored_by_default};
