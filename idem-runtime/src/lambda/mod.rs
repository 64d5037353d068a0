//! AWS Lambda handlers made idempotent (feature `lambda`, over [`lambda_runtime`]).
//!
//! A Lambda is invoked at least once: an asynchronous invocation is retried after an error or a
//! timeout, an SQS batch is delivered again when its visibility timeout passes, a client retries
//! an HTTP request whose answer it never got. Each piece here runs the business once per key and
//! gives every repeat the first answer, on any [`Store`] (in Lambda, usually a
//! [`DynamoStore`](crate::DynamoStore): nothing to run, no connection to keep):
//!
//! | The handler | Use |
//! | --- | --- |
//! | any event, keyed by a closure over the event | [`Idempotent`]: a `tower::Service` that [`lambda_runtime::run`] takes |
//! | your own code, one call inside a handler | [`call`]: a [`Call`] whose lease is the invocation's remaining time |
//! | an SQS batch, answering only the records that failed | [`sqs::SqsBatch`] |
//! | an HTTP API (API Gateway, payload 2.0) keyed by `Idempotency-Key` | [`apigw::HttpApi`] |
//!
//! **The lease is the invocation's remaining time.** A claim made at the start of an invocation
//! is held until the invocation's deadline (from [`Context::deadline`]; at least 1 s) and no
//! longer: an invocation that times out is killed by Lambda at that moment, and the retry Lambda
//! sends next takes the key over at once instead of waiting out a fixed lease. No heartbeat runs
//! (an invocation cannot outlive its deadline). An event without a deadline (invoked by hand,
//! outside Lambda) gets the default lease, [`DEFAULT_LEASE`](crate::DEFAULT_LEASE), with its
//! heartbeat. A holder that was killed before its mark is recovered as on every store: the retry
//! asks your recover fn first ([`Call::recover`]), then runs the body again.
//!
//! **Refusals are errors of the invocation**: a repeat while the first invocation still runs gets
//! [`IdemError::InProgress`] (Lambda retries an asynchronous invocation later), another payload
//! under a used key [`IdemError::PayloadMismatch`] (with [`IdempotentBuilder::validate`]). The
//! HTTP adapter answers them as HTTP responses (409, 422, …) instead, and the SQS adapter as the
//! record's failure.
//!
//! ```no_run
//! # use idem_runtime as idem;
//! use idem::lambda::{Idempotent, lambda_runtime::{self, LambdaEvent}};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Deserialize)]
//! struct Order { order_no: String, amount: u64 }
//! #[derive(Serialize, Deserialize)]
//! struct Receipt { payment_id: String }
//!
//! async fn charge(event: LambdaEvent<Order>) -> Result<Receipt, lambda_runtime::Error> {
//!     Ok(Receipt { payment_id: format!("pay-{}", event.payload.order_no) })
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_runtime::Error> {
//!     let store = idem::DynamoStore::connect("dynamodb://idem_records").await?;
//!     let handler = Idempotent::builder(store, "PAY", |order: &Order| order.order_no.clone())
//!         // A repeat with the same order number and another amount is refused.
//!         .validate(|order: &Order| order.amount)
//!         .build(charge)?;
//!     lambda_runtime::run(handler).await
//! }
//! ```
//!
//! The guide "AWS Lambda and DynamoDB" (`docs/guide/lambda.md` in the repository;
//! `idem::_guide::lambda` in the docs of the `idemkit` package) compares these options with
//! Powertools for AWS Lambda's, and `examples/lambda_orders.rs` is a whole function.

pub mod apigw;
pub mod sqs;

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, SystemTime};

#[doc(no_inline)]
pub use aws_lambda_events as events;
#[doc(no_inline)]
pub use lambda_runtime;
use lambda_runtime::{Context, Diagnostic, LambdaEvent};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Call, IdemError, IdemKey, IntoSharedStore, Store};

/// The shortest lease a claim bound to an invocation's remaining time gets: one second, for an
/// invocation that starts its call with less time left than that.
pub const MIN_INVOCATION_LEASE: Duration = Duration::from_secs(1);

/// The longest a Lambda invocation runs (its largest timeout): 15 minutes. A ttl given to the
/// adapters must be longer, so a record outlives any invocation's claim.
pub const MAX_INVOCATION: Duration = Duration::from_secs(15 * 60);

/// The lease for a call made in the invocation `context`: the time left until its deadline (at
/// least [`MIN_INVOCATION_LEASE`]), or `None` when the event carries no deadline.
pub fn remaining_lease(context: &Context) -> Option<Duration> {
    if context.deadline == 0 {
        return None;
    }
    let left = context
        .deadline()
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO);
    Some(left.clamp(MIN_INVOCATION_LEASE, MAX_INVOCATION))
}

/// A [`Call`] for `(biz, key)` made inside the invocation `context`: its lease is the
/// invocation's remaining time and no heartbeat runs (see the [module docs](self)). Everything
/// else is a `Call`'s: set a fingerprint, a recover fn, a ttl, then `run` it.
///
/// ```no_run
/// # use idem_runtime as idem;
/// # async fn demo(event: idem::lambda::lambda_runtime::LambdaEvent<serde_json::Value>, store: &idem::MemoryStore) -> Result<(), idem::IdemError> {
/// let order_no = event.payload["order_no"].as_str().unwrap_or_default().to_owned();
/// let receipt: String = idem::lambda::call("PAY", &order_no, &event.context)
///     .fingerprint(&event.payload["amount"])
///     .run(store, async { Ok::<_, idem::IdemError>(format!("paid {order_no}")) })
///     .await?;
/// # let _ = receipt; Ok(()) }
/// ```
pub fn call<K: IdemKey + ?Sized>(
    biz: impl Into<Cow<'static, str>>,
    key: &K,
    context: &Context,
) -> Call {
    let call = Call::new(biz, key);
    match remaining_lease(context) {
        Some(lease) => call.lease(lease).no_heartbeat(),
        None => call,
    }
}

/// Checks a ttl given to a Lambda adapter: longer than [`MAX_INVOCATION`] (so it is longer
/// than any lease bound to an invocation), at most [`MAX_DURATION`](crate::MAX_DURATION).
pub(crate) fn check_ttl(ttl: Duration) -> Result<(), IdemError> {
    crate::duration::check_max("the ttl", ttl)?;
    if ttl <= MAX_INVOCATION {
        return Err(IdemError::InvalidOptions {
            reason: format!(
                "the ttl {ttl:?} must be longer than 15 minutes, the longest a Lambda invocation \
                 (and so its claim) lasts"
            ),
        });
    }
    Ok(())
}

type Validate<E> = Arc<dyn Fn(&E) -> Result<String, String> + Send + Sync>;

/// A Lambda handler made idempotent: a `tower::Service<LambdaEvent<E>>` for
/// [`lambda_runtime::run`]. Each invocation's key comes from the event through a closure (as
/// Powertools' JMESPath expression does); the handler runs once per key, and every repeat gets
/// its stored answer without running it. Built with [`Idempotent::builder`].
pub struct Idempotent<E, K, H> {
    inner: Arc<Inner<E, K, H>>,
}

struct Inner<E, K, H> {
    store: Arc<dyn Store>,
    biz: Cow<'static, str>,
    key: K,
    validate: Option<Validate<E>>,
    ttl: Option<Duration>,
    handler: H,
}

impl<E, K, H> Clone for Idempotent<E, K, H> {
    fn clone(&self) -> Self {
        Idempotent {
            inner: self.inner.clone(),
        }
    }
}

impl<E, K, H> fmt::Debug for Idempotent<E, K, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotent")
            .field("biz", &self.inner.biz)
            .field("store", &self.inner.store.backend())
            .field("validates", &self.inner.validate.is_some())
            .field("ttl", &self.inner.ttl)
            .finish()
    }
}

/// Builds an [`Idempotent`] handler; [`build`](IdempotentBuilder::build) checks every value.
#[must_use]
pub struct IdempotentBuilder<E, K> {
    store: Arc<dyn Store>,
    biz: Cow<'static, str>,
    key: K,
    validate: Option<Validate<E>>,
    ttl: Option<Duration>,
    _event: PhantomData<fn(&E)>,
}

impl<E, K> fmt::Debug for IdempotentBuilder<E, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentBuilder")
            .field("biz", &self.biz)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Idempotent<(), (), ()> {
    /// A handler of events `E` on `store`, under the business type `biz`, keyed by `key(&event)`
    /// (a `String`, `&'static str` or an integer: any [`IdemKey`]). A key the store cannot take
    /// (empty, too long) fails the invocation with [`IdemError::InvalidKey`] before anything
    /// runs.
    pub fn builder<E, K, R>(
        store: impl IntoSharedStore,
        biz: impl Into<Cow<'static, str>>,
        key: K,
    ) -> IdempotentBuilder<E, K>
    where
        K: Fn(&E) -> R,
        R: IdemKey,
    {
        IdempotentBuilder {
            store: store.into_shared(),
            biz: biz.into(),
            key,
            validate: None,
            ttl: None,
            _event: PhantomData,
        }
    }
}

impl<E, K> IdempotentBuilder<E, K> {
    /// Payload validation: the part of the event `part(&event)` returns is fingerprinted, and a
    /// repeat of a used key with another part is refused with [`IdemError::PayloadMismatch`]
    /// instead of getting the first answer (Powertools' `payload_validation_jmespath`). Without
    /// it, a repeat gets the first answer whatever else its event says.
    pub fn validate<P, V>(mut self, part: V) -> Self
    where
        V: Fn(&E) -> P + Send + Sync + 'static,
        P: Serialize,
    {
        self.validate = Some(Arc::new(move |event: &E| {
            crate::fingerprint::fingerprint(&part(event))
        }));
        self
    }

    /// How long a key's record is kept (the default: [`DEFAULT_TTL`](crate::DEFAULT_TTL), 7
    /// days). Range: longer than [`MAX_INVOCATION`] (15 minutes) ..=
    /// [`MAX_DURATION`](crate::MAX_DURATION), checked by `build`.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The handler, its options checked.
    ///
    /// # Errors
    /// [`IdemError::InvalidBiz`] for a business type the store cannot take;
    /// [`IdemError::InvalidOptions`] for a ttl out of range.
    pub fn build<H>(self, handler: H) -> Result<Idempotent<E, K, H>, IdemError> {
        crate::key::validate_biz(&self.biz, self.store.limits().max_biz_len)?;
        if let Some(ttl) = self.ttl {
            check_ttl(ttl)?;
        }
        Ok(Idempotent {
            inner: Arc::new(Inner {
                store: self.store,
                biz: self.biz,
                key: self.key,
                validate: self.validate,
                ttl: self.ttl,
                handler,
            }),
        })
    }
}

impl<E, K, H> Idempotent<E, K, H> {
    /// The call an invocation of `event` makes.
    fn call_for<R>(&self, event: &LambdaEvent<E>) -> Call
    where
        K: Fn(&E) -> R,
        R: IdemKey,
    {
        let inner = &*self.inner;
        let key = (inner.key)(&event.payload);
        let mut call = call(inner.biz.clone(), &key, &event.context);
        if let Some(ttl) = inner.ttl {
            call = call.ttl(ttl);
        }
        if let Some(validate) = &inner.validate {
            call.more_mut().fingerprint = Some(validate(&event.payload));
        }
        call
    }
}

impl<E, K, R, H, F, T, Err> lambda_runtime::Service<LambdaEvent<E>> for Idempotent<E, K, H>
where
    E: Send + 'static,
    K: Fn(&E) -> R + Send + Sync + 'static,
    R: IdemKey,
    H: Fn(LambdaEvent<E>) -> F + Send + Sync + 'static,
    F: Future<Output = Result<T, Err>> + Send + 'static,
    T: Serialize + DeserializeOwned + Send + 'static,
    Err: From<IdemError> + Send + 'static,
{
    type Response = T;
    type Error = Err;
    type Future = Pin<Box<dyn Future<Output = Result<T, Err>> + Send>>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Err>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, event: LambdaEvent<E>) -> Self::Future {
        let call = self.call_for(&event);
        let inner = self.inner.clone();
        Box::pin(async move {
            // The handler is called only when the body runs: a replay calls nothing of it.
            let handler = &inner.handler;
            let body = async move { handler(event).await };
            call.run(&*inner.store, body).await
        })
    }
}

/// An [`IdemError`] as the Lambda runtime reports it: the error type names the refusal
/// (`idem.in-progress`, `idem.payload-mismatch`, `idem.store-unavailable`, …), the message is
/// the error's text.
impl From<IdemError> for Diagnostic {
    fn from(e: IdemError) -> Self {
        Diagnostic {
            error_type: format!("idem.{}", crate::problem::of(&e).name),
            error_message: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests;
