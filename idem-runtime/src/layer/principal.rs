//! Who is calling: part of every HTTP record's identity and every token's subject.

use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use http::request::Parts;

use super::service::single_header;

type Extract = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Who is calling, taken from each request: part of the identity of every record the
/// [`IdempotencyLayer`](crate::http::IdempotencyLayer) stores, so a client that sends another client's
/// key runs as its own request and never sees the other's stored response; and the subject of
/// every submit token the [`TokenEndpoint`](crate::http::TokenEndpoint) issues and the
/// [`TokenGuardLayer`](crate::http::TokenGuardLayer) consumes.
///
/// A request for which the extractor finds no caller is refused with 401 before anything is
/// written. Take the principal from what your authentication established (a request extension
/// your auth middleware inserted, or a header your gateway sets after it verified the caller and
/// strips from client requests), never from anything a client may set freely.
#[derive(Clone)]
pub struct Principal(pub(crate) Source);

#[derive(Clone)]
pub(crate) enum Source {
    Extract(Arc<Extract>),
    Unscoped(&'static str),
}

impl Principal {
    /// The caller is the value of `header`, which a gateway in front of the service sets after it
    /// authenticated the request (and removes from what clients send). A request with several
    /// lines of it has no caller (401): a gateway that appends its line instead of replacing the
    /// client's must not let the client's line win.
    pub fn header(header: HeaderName) -> Self {
        Principal::from_fn(move |parts| {
            single_header(&parts.headers, &header)
                .ok()
                .flatten()
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        })
    }

    /// The caller is a request extension of type `T` that an authentication middleware in front
    /// of the layer inserted (`req.extensions_mut().insert(user)`), shown with `Display`.
    pub fn extension<T>() -> Self
    where
        T: fmt::Display + Clone + Send + Sync + 'static,
    {
        Principal::from_fn(|parts| parts.extensions.get::<T>().map(ToString::to_string))
    }

    /// The caller is whatever `f` finds in the request's head (`None`: no caller, refused with 401).
    pub fn from_fn(f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        Principal(Source::Extract(Arc::new(f)))
    }

    /// No caller scoping: every client shares one key space, so a client that sends a key another
    /// client used gets that client's stored response. Only for a service with one caller (say,
    /// one internal system behind mutual TLS) or keys nobody can guess; `why` says which, in the
    /// code, for the next reader. An empty `why` is refused when the layer is built.
    pub fn unscoped(why: &'static str) -> Self {
        Principal(Source::Unscoped(why))
    }

    /// The caller of a request: `Ok(Some(id))`, `Ok(None)` when unscoped, `Err(())` when the
    /// extractor found no caller.
    pub(crate) fn of(&self, parts: &Parts) -> Result<Option<String>, ()> {
        match &self.0 {
            Source::Unscoped(_) => Ok(None),
            Source::Extract(f) => f(parts).filter(|p| !p.is_empty()).map(Some).ok_or(()),
        }
    }

    /// The opt-out's reason, when unscoped.
    pub(crate) fn unscoped_reason(&self) -> Option<&'static str> {
        match self.0 {
            Source::Unscoped(why) => Some(why),
            Source::Extract(_) => None,
        }
    }
}

impl fmt::Debug for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Source::Extract(_) => f.write_str("Principal(extracted per request)"),
            Source::Unscoped(why) => write!(f, "Principal::unscoped({why:?})"),
        }
    }
}
