//! What the layers' tower services share: the future they return, the ready inner service they
//! serve a request with, and the single-line headers they read.

/// What the layers' services return.
pub(crate) type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// The one line of a header that must be sent once: `Ok(None)` when it is absent, `Err(lines)`
/// when the request has several lines of it. Several lines of a field are one comma-joined value
/// (RFC 9110 §5.3), which for a single-valued field (a key, a caller, a token) is no value at
/// all; taking the first line instead would let two different requests share it.
pub(crate) fn single_header<'a>(
    headers: &'a http::HeaderMap,
    name: &http::HeaderName,
) -> Result<Option<&'a http::HeaderValue>, usize> {
    let mut lines = headers.get_all(name).iter();
    let first = lines.next();
    match lines.count() {
        0 => Ok(first),
        more => Err(more + 1),
    }
}

/// The inner service that was polled ready, to serve this request; a fresh clone takes its place
/// and waits for the next.
pub(crate) fn take_ready<S: Clone>(slot: &mut S) -> S {
    let fresh = slot.clone();
    std::mem::replace(slot, fresh)
}
