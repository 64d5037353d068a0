//! Redis errors sorted into idem's classes (docs/RELIABILITY.md, "Error classes").

use crate::{Busy, IdemError};

/// A Redis error as an [`IdemError`] of the right class.
///
/// - Unavailable (503): no answer (I/O, a dropped or refused connection, a reply timeout), or a
///   server that cannot take idem's writes now, whatever the record: it is loading its dataset
///   (LOADING, after a restart), it is a replica (READONLY: a failover demoted it, or the URL
///   names a replica), a replica cut off from its primary that serves no stale data (MASTERDOWN),
///   a cluster with a slot nobody serves (CLUSTERDOWN), too few replicas for
///   `min-replicas-to-write` (NOREPLICAS), `maxmemory` reached under `noeviction` (OOM), or a
///   snapshot it cannot write (MISCONF). Nothing was written; a retry later (another node, after
///   the failover or the load) can succeed.
/// - Busy, `Locked` (503): the server is held by other work that ends by itself: a script running
///   past `busy-reply-threshold` (BUSY), a slot being moved (TRYAGAIN).
/// - Store (500): the rest (a script error, a wrong type, a missing permission): a retry gives the
///   same answer.
///
/// (redis-rs parses LOADING, READONLY, MASTERDOWN, CLUSTERDOWN and TRYAGAIN into
/// `ServerErrorKind`s; BUSY, NOREPLICAS, OOM and MISCONF arrive as extension codes.)
pub(crate) fn redis_error(e: redis::RedisError) -> IdemError {
    use redis::{ErrorKind, ServerErrorKind};
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout() {
        return IdemError::unavailable(e);
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ClusterDown,
        )
        | ErrorKind::ClusterConnectionNotFound => IdemError::unavailable(e),
        ErrorKind::Server(ServerErrorKind::TryAgain) => IdemError::busy(Busy::Locked, e),
        ErrorKind::Extension => match e.code() {
            Some("BUSY") => IdemError::busy(Busy::Locked, e),
            Some("NOREPLICAS" | "OOM" | "MISCONF") => IdemError::unavailable(e),
            _ => IdemError::store(e),
        },
        _ => IdemError::store(e),
    }
}
