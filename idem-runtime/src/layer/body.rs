//! A request's body as the layers read it: whole, up to a limit (the body a layer hands its
//! handler is its adapter's choice).

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};

use crate::BoxError;

/// Why a request's body was not read.
pub(crate) enum Unread {
    /// It is over the layer's limit.
    TooLarge,
    /// It was cut short (a `Content-Length` longer than the body), reset or badly framed.
    Unreadable(BoxError),
}

/// The request's body, read whole up to `limit` bytes. `deep` also counts as over the limit a
/// body another layer in front of this one limited (with `http_body_util::Limited`).
pub(crate) async fn read<B>(body: B, limit: usize, deep: bool) -> Result<Bytes, Unread>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if over_limit(&*e, deep) => Err(Unread::TooLarge),
        Err(e) => Err(Unread::Unreadable(e)),
    }
}

/// Whether reading a body failed because it is over a limit: ours, or (`deep`) one set by a layer
/// in front of us, found among the error's causes.
fn over_limit(e: &(dyn std::error::Error + 'static), deep: bool) -> bool {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = if deep { e.source() } else { None };
    }
    false
}
