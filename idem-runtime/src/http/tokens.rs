//! One-time submit tokens over HTTP: an endpoint issues a token bound to the caller; a guard
//! spends the token a submit carries before its handler runs, and puts it back if the handler
//! failed with a 5xx.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::routing::MethodRouter;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, header};
use tower::{Layer, Service};

use super::problem::{self, problem};
use crate::layer::Principal;
use crate::layer::service::{BoxFuture, single_header, take_ready};
use crate::metrics::count_token_op;
use crate::{IdemError, TokenStore};

/// The header a submit carries its token in.
pub const TOKEN_HEADER: HeaderName = HeaderName::from_static("x-idem-token");

fn no_principal() -> Response<Body> {
    problem(
        StatusCode::UNAUTHORIZED,
        "no-principal",
        "Caller unknown",
        "submit tokens are bound to their caller, and this request carries no caller identity",
    )
}

/// An endpoint that issues a one-time submit token to the caller: mount it with
/// `.route("/tokens", endpoint.route())`. A POST answers 201 with
/// `{"token": "…", "header": "x-idem-token", "expires_in": <seconds>}`; the token is bound to the
/// caller ([`Principal`]), so only the same caller can spend it.
#[derive(Clone)]
pub struct TokenEndpoint {
    tokens: Arc<dyn TokenStore>,
    principal: Principal,
    ttl: Duration,
}

impl TokenEndpoint {
    /// Issues tokens from `tokens`, bound to `principal` (an unscoped principal issues unbound
    /// tokens), valid for 10 minutes unless [`ttl`](Self::ttl) says otherwise.
    pub fn new(tokens: impl TokenStore, principal: Principal) -> Self {
        TokenEndpoint::shared(Arc::new(tokens), principal)
    }

    /// As [`new`](Self::new), for a token store already shared.
    pub fn shared(tokens: Arc<dyn TokenStore>, principal: Principal) -> Self {
        TokenEndpoint {
            tokens,
            principal,
            ttl: Duration::from_secs(600),
        }
    }

    /// How long an issued token stays valid: 1 ms ..= [`crate::MAX_DURATION`].
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a ttl outside that range, at start-up rather than as a
    /// failure of every issue.
    pub fn ttl(mut self, ttl: Duration) -> Result<Self, IdemError> {
        crate::tokens::check_ttl(ttl)?;
        self.ttl = ttl;
        Ok(self)
    }

    /// The POST route that issues tokens.
    pub fn route<S: Clone + Send + Sync + 'static>(self) -> MethodRouter<S> {
        axum::routing::post(move |req: Request<Body>| {
            let this = self.clone();
            async move { this.issue(req).await }
        })
    }

    async fn issue(&self, req: Request<Body>) -> Response<Body> {
        let (parts, _) = req.into_parts();
        let Ok(subject) = self.principal.of(&parts) else {
            return no_principal();
        };
        let issued = self.tokens.issue(self.ttl, subject.as_deref()).await;
        count_token_op("issue", &issued);
        match issued {
            Ok(token) => {
                let body = serde_json::json!({
                    "token": token,
                    "header": TOKEN_HEADER.as_str(),
                    "expires_in": self.ttl.as_secs(),
                });
                let mut response = Response::new(Body::from(body.to_string()));
                *response.status_mut() = StatusCode::CREATED;
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                response
                    .headers_mut()
                    .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                response
            }
            Err(e) => problem::from_idem(&e),
        }
    }
}

/// A tower [`Layer`] that lets a request through only if it carries an unspent submit token
/// (`X-Idem-Token`) issued to its caller, spending it atomically first: of a double click, one
/// submit runs and the other gets 409 `token-used`. A missing or unknown token, or several
/// `X-Idem-Token` lines, get 400. When the handler answers 5xx the token is put back, so the user
/// can submit again without a new page.
#[derive(Clone)]
pub struct TokenGuardLayer {
    tokens: Arc<dyn TokenStore>,
    principal: Principal,
}

impl TokenGuardLayer {
    /// Spends tokens of `tokens`, issued to the caller `principal` finds.
    pub fn new(tokens: impl TokenStore, principal: Principal) -> Self {
        TokenGuardLayer::shared(Arc::new(tokens), principal)
    }

    /// As [`new`](Self::new), for a token store already shared.
    pub fn shared(tokens: Arc<dyn TokenStore>, principal: Principal) -> Self {
        TokenGuardLayer { tokens, principal }
    }
}

impl<S> Layer<S> for TokenGuardLayer {
    type Service = TokenGuard<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TokenGuard {
            inner,
            guard: self.clone(),
        }
    }
}

/// The service [`TokenGuardLayer`] wraps around a handler.
#[derive(Clone)]
pub struct TokenGuard<S> {
    inner: S,
    guard: TokenGuardLayer,
}

impl<S, B> Service<Request<Body>> for TokenGuard<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let mut inner = take_ready(&mut self.inner);
        let guard = self.guard.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let Ok(subject) = guard.principal.of(&parts) else {
                return Ok(no_principal());
            };
            let Ok(line) = single_header(&parts.headers, &TOKEN_HEADER) else {
                // Several lines: spending the first would pick one token of several for the
                // client; nothing is spent.
                return Ok(problem(
                    StatusCode::BAD_REQUEST,
                    "token-invalid",
                    "Invalid submit token",
                    "the request has several X-Idem-Token header lines; send the one token once",
                ));
            };
            let Some(token) = line
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
            else {
                return Ok(problem(
                    StatusCode::BAD_REQUEST,
                    "missing-token",
                    "Submit token missing",
                    "send the submit token issued for this form in the X-Idem-Token header",
                ));
            };
            let spent = guard.tokens.consume(&token, subject.as_deref()).await;
            count_token_op("consume", &spent);
            if let Err(e) = spent {
                return Ok(problem::from_idem(&e));
            }
            let response = inner
                .call(Request::from_parts(parts, body))
                .await?
                .map(Body::new);
            if response.status().is_server_error() {
                let restored = guard.tokens.restore(&token, subject.as_deref()).await;
                count_token_op("restore", &restored);
                if let Err(e) = restored {
                    tracing::warn!(error = %e, "the handler failed and its submit token could not be put back; it stays spent");
                }
            }
            Ok(response)
        })
    }
}
