//! An HTTP API behind API Gateway (payload format 2.0) keyed by the `Idempotency-Key` header,
//! as the axum layer (`idem::http`, feature `axum`) does for a server.
//!
//! [`HttpApi::handle`] reads the request's `Idempotency-Key`, runs the handler once per key and
//! answers every repeat with the stored response. A request is fingerprinted by its method, path,
//! query, content type and body: the same key with another request is refused. Answers:
//!
//! | The request | Answer |
//! | --- | --- |
//! | first with its key; the handler answered below 500 | the handler's response, stored |
//! | first with its key; the handler answered 500 or more | that response, not stored: a retry runs the handler again |
//! | first with its key; the handler returned `Err` | that error, from the invocation (API Gateway answers 500); nothing stored |
//! | a repeat of a key done | the stored response, the handler not run |
//! | a repeat while the first still runs | 409 `in-progress` with `Retry-After` |
//! | a repeat with another request | 422 `payload-mismatch` |
//! | no key (and a key is required), or a key that is not a valid `Idempotency-Key` | 400 `missing-key` / `invalid-key` |
//! | no caller (the `principal` fn answered `None`) | 401 `no-principal`; nothing ran |
//! | the store cannot be reached | 503 `store-unavailable` with `Retry-After`; nothing ran |
//!
//! Refusals are `application/problem+json` bodies (RFC 9457) of type `urn:idem:problem:<name>`.
//! The lease is the invocation's remaining time (see the [module docs](super)): a request whose
//! invocation timed out can be retried as soon as API Gateway has answered 504.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::apigw::{ApiGatewayV2httpRequest, ApiGatewayV2httpResponse};
use aws_lambda_events::encodings::Body;
use aws_lambda_events::http::{HeaderName, HeaderValue, header};
use lambda_runtime::LambdaEvent;
use serde::Serialize;

use crate::problem::{self, Problem};
use crate::{IdemError, IntoSharedStore, Store};

/// Answers an HTTP API's requests once per `Idempotency-Key`; see the [module docs](self).
/// Built with [`HttpApi::builder`].
#[derive(Clone)]
pub struct HttpApi {
    store: Arc<dyn Store>,
    biz: Cow<'static, str>,
    ttl: Option<Duration>,
    header: HeaderName,
    key_required: bool,
    caller: Caller,
}

/// Reads the caller from a request.
type PrincipalFn = Arc<dyn Fn(&ApiGatewayV2httpRequest) -> Option<String> + Send + Sync>;

/// Whose keys a request's key is among: two callers' keys never meet.
#[derive(Clone)]
enum Caller {
    /// Not said yet: `build` refuses it.
    Unset,
    /// The caller read from the request; `None` is answered 401.
    Scoped(PrincipalFn),
    /// One key space for every caller, and why that is safe.
    Unscoped(String),
}

impl fmt::Debug for HttpApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpApi")
            .field("biz", &self.biz)
            .field("store", &self.store.backend())
            .field("ttl", &self.ttl)
            .field("header", &self.header)
            .field("key_required", &self.key_required)
            .field("scoped", &matches!(self.caller, Caller::Scoped(_)))
            .finish()
    }
}

/// Builds an [`HttpApi`]; [`build`](HttpApiBuilder::build) checks every value.
#[must_use]
pub struct HttpApiBuilder {
    api: HttpApi,
    header: Option<String>,
}

impl fmt::Debug for HttpApiBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.api.fmt(f)
    }
}

impl HttpApi {
    /// An HTTP API's handler on `store`, its keys under the business type `biz` (one per route
    /// or per API: a key is scoped to its business type).
    pub fn builder(
        store: impl IntoSharedStore,
        biz: impl Into<Cow<'static, str>>,
    ) -> HttpApiBuilder {
        HttpApiBuilder {
            api: HttpApi {
                store: store.into_shared(),
                biz: biz.into(),
                ttl: None,
                header: HeaderName::from_static("idempotency-key"),
                key_required: true,
                caller: Caller::Unset,
            },
            header: None,
        }
    }
}

impl HttpApiBuilder {
    /// How long a key's record is kept (the default: [`DEFAULT_TTL`](crate::DEFAULT_TTL), 7
    /// days). Range: longer than [`MAX_INVOCATION`](super::MAX_INVOCATION) (15 minutes) ..=
    /// [`MAX_DURATION`](crate::MAX_DURATION), checked by `build`.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.api.ttl = Some(ttl);
        self
    }

    /// The header the key comes in (`Idempotency-Key` by default): a valid header name, checked
    /// by `build`.
    pub fn header(mut self, name: impl Into<String>) -> Self {
        self.header = Some(name.into());
        self
    }

    /// Keys are kept per caller, `principal(&request)` (for a JWT authorizer, its `sub` claim;
    /// never a field the client writes freely): two callers' requests with the same key never
    /// meet, so none gets another's response. A request whose caller is `None` is answered 401
    /// `no-principal`, nothing run. One of `principal` and [`unscoped`](Self::unscoped) is
    /// required.
    pub fn principal(
        mut self,
        principal: impl Fn(&ApiGatewayV2httpRequest) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.api.caller = Caller::Scoped(Arc::new(principal));
        self
    }

    /// One key space for every caller, for an API whose callers cannot read each other's
    /// responses (one internal caller behind an IAM authorizer, say); `reason` says why, in the
    /// code. `build` refuses a blank reason.
    pub fn unscoped(mut self, reason: impl Into<String>) -> Self {
        self.api.caller = Caller::Unscoped(reason.into());
        self
    }

    /// Runs a request without a key as it comes, without idempotency, instead of answering 400
    /// `missing-key`.
    pub fn key_optional(mut self) -> Self {
        self.api.key_required = false;
        self
    }

    /// The handler, its options checked.
    ///
    /// # Errors
    /// [`IdemError::InvalidBiz`] for a business type the store cannot take;
    /// [`IdemError::InvalidOptions`] for a ttl out of range, a header name that is not one, or
    /// neither [`principal`](Self::principal) nor [`unscoped`](Self::unscoped) (with a reason).
    pub fn build(self) -> Result<HttpApi, IdemError> {
        let mut api = self.api;
        let refused = match &api.caller {
            Caller::Unset => Some(
                "an HTTP API keeps keys per caller: give `.principal(|request| …)` (the \
                 authorizer's caller), or `.unscoped(reason)` when callers cannot read each \
                 other's responses",
            ),
            Caller::Unscoped(reason) if reason.trim().is_empty() => Some(
                "`unscoped` needs a reason: say in the code why callers cannot read each other's \
                 responses",
            ),
            Caller::Scoped(_) | Caller::Unscoped(_) => None,
        };
        if let Some(reason) = refused {
            return Err(IdemError::InvalidOptions {
                reason: reason.to_owned(),
            });
        }
        crate::key::validate_biz(&api.biz, api.store.limits().max_biz_len)?;
        if let Some(ttl) = api.ttl {
            super::check_ttl(ttl)?;
        }
        if let Some(name) = self.header {
            api.header =
                HeaderName::try_from(name.as_str()).map_err(|e| IdemError::InvalidOptions {
                    reason: format!("the key's header `{name}` is not a header name: {e}"),
                })?;
        }
        Ok(api)
    }
}

/// How a first run ended, when it did not end with a response to store.
enum Failed<E> {
    Refused(IdemError),
    Handler(E),
    /// A 5xx response: answered, not stored.
    ServerError(Box<ApiGatewayV2httpResponse>),
}

impl<E> From<IdemError> for Failed<E> {
    fn from(e: IdemError) -> Self {
        Failed::Refused(e)
    }
}

/// What identifies a request besides its key: a repeat with another one is refused.
#[derive(Serialize)]
struct Fingerprint<'a> {
    method: &'a str,
    path: Option<&'a str>,
    query: Option<&'a str>,
    content_type: Option<&'a [u8]>,
    body: Option<&'a str>,
    base64: bool,
}

impl HttpApi {
    /// Answers `event`: `handler(event)` runs once per key (see the [module docs](self)).
    ///
    /// # Errors
    /// The handler's own error, from the run that returned it; every refusal is an answer.
    pub async fn handle<H, F, E>(
        &self,
        event: LambdaEvent<ApiGatewayV2httpRequest>,
        handler: H,
    ) -> Result<ApiGatewayV2httpResponse, E>
    where
        H: FnOnce(LambdaEvent<ApiGatewayV2httpRequest>) -> F,
        F: Future<Output = Result<ApiGatewayV2httpResponse, E>>,
    {
        let request = &event.payload;
        let key = match request
            .headers
            .get_all(&self.header)
            .iter()
            .collect::<Vec<_>>()[..]
        {
            [] if !self.key_required => return handler(event).await,
            [] => {
                return Ok(answer(&Problem {
                    status: 400,
                    name: "missing-key",
                    title: "Idempotency key missing",
                    detail: format!(
                        "send an {} header with a key unique to this request",
                        self.header
                    )
                    .into(),
                    retry_after: None,
                }));
            }
            [one] => one.to_str().map_err(|e| e.to_string()),
            _ => Err("the request has the header more than once".to_owned()),
        };
        let principal = match &self.caller {
            Caller::Scoped(principal) => match principal(request) {
                Some(p) => Some(p),
                None => {
                    return Ok(answer(&Problem {
                        status: 401,
                        name: "no-principal",
                        title: "Caller unknown",
                        detail: "idempotent requests are kept per caller, and this request \
                                 carries no caller identity"
                            .into(),
                        retry_after: None,
                    }));
                }
            },
            Caller::Unset | Caller::Unscoped(_) => None,
        };
        let record_key = match key.and_then(|k| {
            crate::http_record_key(principal.as_deref(), k).map_err(|e| e.to_string())
        }) {
            Ok(record_key) => record_key,
            Err(why) => {
                return Ok(answer(&Problem {
                    status: 400,
                    name: "invalid-key",
                    title: "Invalid idempotency key",
                    detail: why.into(),
                    retry_after: None,
                }));
            }
        };
        let mut call =
            super::call(self.biz.clone(), &record_key, &event.context).fingerprint(&Fingerprint {
                method: request.request_context.http.method.as_str(),
                path: request.raw_path.as_deref(),
                query: request.raw_query_string.as_deref(),
                content_type: request
                    .headers
                    .get(header::CONTENT_TYPE)
                    .map(HeaderValue::as_bytes),
                body: request.body.as_deref(),
                base64: request.is_base64_encoded,
            });
        if let Some(ttl) = self.ttl {
            call = call.ttl(ttl);
        }
        let run = async move {
            match handler(event).await {
                Ok(response) if response.status_code >= 500 => {
                    Err(Failed::ServerError(Box::new(response)))
                }
                Ok(response) => Ok(response),
                Err(e) => Err(Failed::Handler(e)),
            }
        };
        match call.run(&*self.store, run).await {
            Ok(response) => Ok(response),
            Err(Failed::ServerError(response)) => Ok(*response),
            Err(Failed::Handler(e)) => Err(e),
            Err(Failed::Refused(e)) => Ok(answer(&problem::of(&e))),
        }
    }
}

/// A problem as API Gateway's response.
fn answer(p: &Problem<'_>) -> ApiGatewayV2httpResponse {
    let mut response = ApiGatewayV2httpResponse::default();
    response.status_code = i64::from(p.status);
    response.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(problem::CONTENT_TYPE),
    );
    if let Some(after) = p.retry_after {
        response.headers.insert(
            header::RETRY_AFTER,
            HeaderValue::from(problem::retry_after_secs(after)),
        );
    }
    response.body = Some(Body::Text(String::from_utf8(p.body()).unwrap_or_default()));
    response
}
