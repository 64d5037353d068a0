//! Reaching a store's server: how long a connection attempt may take, and errors that name the
//! server (`host:port`) and the cause (refused, timed out, a name that does not resolve).
//!
//! sqlx's pool takes a refused connection for a server still starting and retries it until its
//! acquire timeout (30 s by default), then says only that the pool timed out; redis-rs's
//! connection manager retries a refusal for about nine seconds. So each server store dials one
//! connection by itself first, within the connect timeout and without retries: an unreachable
//! server fails at once, with its address and the operating system's word for why.

use std::time::Duration;

#[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
use crate::IdemError;

/// How long a store's first connection may take by default: 5 seconds.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks a pool's acquire and connect timeouts: each 1 ms ..= [`crate::MAX_DURATION`].
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn check_pool_timeouts(acquire: Duration, connect: Duration) -> Result<(), IdemError> {
    crate::duration::check(
        "the acquire timeout",
        acquire,
        Duration::from_millis(1),
        "shorter than 1 ms: no checkout could wait for a connection",
    )?;
    check_connect_timeout(connect)
}

/// Checks a connect timeout: 1 ms ..= [`crate::MAX_DURATION`].
#[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
pub(crate) fn check_connect_timeout(timeout: Duration) -> Result<(), IdemError> {
    crate::duration::check(
        "the connect timeout",
        timeout,
        Duration::from_millis(1),
        "shorter than 1 ms: no connection could be made in time",
    )
}

/// `host:port` of a server (a Unix socket's path when there is one), for messages.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn server(host: &str, port: u16, socket: Option<&std::path::Path>) -> String {
    match socket {
        Some(path) => path.display().to_string(),
        None if host.contains(':') => format!("[{host}]:{port}"),
        None => format!("{host}:{port}"),
    }
}

/// Opens one connection to the server of `options` within `timeout` (no retries) and closes it:
/// refused, unresolvable, silent or refusing the login, the error says so with `what` (`Postgres`,
/// `MySQL`) and `server`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn reach<C: sqlx::Connection>(
    what: &str,
    dialect: crate::sql::dialect::Dialect,
    server: &str,
    options: &<C as sqlx::Connection>::Options,
    timeout: Duration,
) -> Result<(), IdemError> {
    let conn = dial::<C>(what, dialect, server, options, timeout).await?;
    hang_up(conn).await;
    Ok(())
}

/// Closes a connection [`dial`] opened: a courtesy, so a server that does not answer the goodbye
/// is no error.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn hang_up<C: sqlx::Connection>(conn: C) {
    let _ = tokio::time::timeout(Duration::from_millis(100), conn.close()).await;
}

/// Opens one connection to the server of `options` within `timeout` (no retries), its errors as
/// [`reach`]'s.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn dial<C: sqlx::Connection>(
    what: &str,
    dialect: crate::sql::dialect::Dialect,
    server: &str,
    options: &<C as sqlx::Connection>::Options,
    timeout: Duration,
) -> Result<C, IdemError> {
    match tokio::time::timeout(timeout, C::connect_with(options)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(unreachable(what, dialect, server, e)),
        Err(_) => Err(IdemError::unavailable(format!(
            "cannot reach {what} at {server}: no answer within the connect timeout of \
             {timeout:?} (a network that drops packets, or a server that hangs)"
        ))),
    }
}

/// A pool's connect (after [`reach`] succeeded), within `timeout`, its error naming the server.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn within_connect<P>(
    what: &str,
    server: &str,
    timeout: Duration,
    connect: impl Future<Output = Result<P, sqlx::Error>>,
) -> Result<P, IdemError> {
    match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(pool)) => Ok(pool),
        Ok(Err(e)) => Err(IdemError::unavailable(format!(
            "cannot reach {what} at {server}: {e}"
        ))),
        Err(_) => Err(IdemError::unavailable(format!(
            "cannot reach {what} at {server}: no answer within the connect timeout of {timeout:?}"
        ))),
    }
}

/// A failed connection attempt as an error naming the server, of the class the driver's error
/// has (a refused connection is unavailable; a refused login is not, and no retry cures it).
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn unreachable(
    what: &str,
    dialect: crate::sql::dialect::Dialect,
    server: &str,
    e: sqlx::Error,
) -> IdemError {
    let why = match &e {
        sqlx::Error::Io(io) => io_cause(io),
        // A server answered, in another protocol: the URL names another server's port (MySQL's
        // 3306, Redis's 6379), which no retry cures.
        sqlx::Error::Protocol(answer) => {
            return IdemError::InvalidOptions {
                reason: format!(
                    "the {what} URL names a server that is not {what}: a server answered at \
                     {server}, but not in the {what} protocol ({}); check the URL's host and port \
                     (Postgres listens on 5432 by default, MySQL and MariaDB on 3306)",
                    crate::sql::error::without_location(answer)
                ),
            };
        }
        other => other.to_string(),
    };
    let answered = matches!(e, sqlx::Error::Database(_));
    let text = format!("cannot reach {what} at {server}: {why}");
    match crate::sql::error::store_error(e, dialect) {
        IdemError::StoreUnavailable { .. } => IdemError::unavailable(text),
        IdemError::StoreBusy { reason, .. } => IdemError::busy(reason, text),
        // The server answered and refused (a login, a database): reached, not unreachable, and
        // said in the server's words without the line of its source sqlx's text ends with.
        IdemError::Store { source } if answered => IdemError::store(format!(
            "{what} at {server} answered and refused the connection: {source}"
        )),
        _ => IdemError::store(text),
    }
}

/// An I/O error in words: the operating system's, with the kind where it says more.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn io_cause(io: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match io.kind() {
        ErrorKind::ConnectionRefused => format!("connection refused ({io})"),
        ErrorKind::TimedOut => format!("timed out ({io})"),
        _ if io.to_string().contains("failed to lookup address") => {
            format!("the host name does not resolve ({io})")
        }
        _ => io.to_string(),
    }
}
