//! A URL that names several servers, `postgres://h1:5432,h2:5432/db?target_session_attrs=read-write`
//! (libpq's form, the URL pg_auto_failover's `pg_autoctl show uri` gives): sqlx reads one host, so
//! the store reads the list itself and keeps its pool on the server that takes writes.
//!
//! - [`parse`] reads the list: one set of connect options per server, each with everything else
//!   the URL says (user, database, query options).
//! - [`Hosts::find`] dials every server at once and picks the first, in the URL's order, whose
//!   session is read-write (`transaction_read_only` off: not a standby, nor a primary that does
//!   not take writes yet, as pg_auto_failover holds a promoted standby until it knows the old
//!   primary is down).
//! - The pool checks every connection it opens the same way (`after_connect`): one on a server
//!   that does not take writes is closed, and the pool opens another.
//! - A statement that finds its server gone (`StoreUnavailable`) or read-only (SQLSTATE 25006,
//!   reported as unavailable: nothing was written), or that its call's store timeout cuts off,
//!   starts a search in the background ([`Hosts::search`]). When it finds another server taking
//!   writes, the pool's connect options move there, and the connections opened before the move
//!   are closed as they come out of the pool (`before_acquire`, no round trip).

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sqlx::PgConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::IdemError;
use crate::sql::dialect::Dialect;

/// libpq's parameter that says which server of the list a session wants.
const ATTRS: &str = "target_session_attrs";

/// The longest pause between two searches while no server takes writes.
const SEARCH_PAUSE: Duration = Duration::from_secs(1);

fn invalid(why: String) -> IdemError {
    IdemError::InvalidOptions {
        reason: format!("not a Postgres URL: {why}"),
    }
}

/// The connect options of each server `url` names, in its order; `None` for a URL with one host
/// and no `target_session_attrs`, which sqlx reads as it is.
///
/// # Errors
/// [`IdemError::InvalidOptions`] for an empty host, a port that is not one or an IPv6 address
/// without brackets in a list of hosts, `host`, `hostaddr` or `port` in the query beside one, a
/// `target_session_attrs` that asks for a server that takes no writes, or what sqlx refuses.
pub(super) fn parse(url: &str) -> Result<Option<Vec<PgConnectOptions>>, IdemError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(None);
    };
    if !["postgres", "postgresql"]
        .iter()
        .any(|s| s.eq_ignore_ascii_case(scheme))
    {
        return Ok(None);
    }
    let rest = rest.split('#').next().unwrap_or_default();
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((user, hosts)) => (Some(user), hosts),
        None => (None, authority),
    };
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    let mut attrs = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = url::form_urlencoded::parse(pair.as_bytes())
            .next()
            .unwrap_or_default();
        if name == ATTRS {
            attrs = Some(value.into_owned());
        } else {
            kept.push((name.into_owned(), pair));
        }
    }
    let several = hosts.contains(',');
    if !several && attrs.is_none() {
        return Ok(None);
    }
    if let Some(attrs) = &attrs {
        check_attrs(attrs)?;
    }
    if several
        && let Some((name, _)) = kept
            .iter()
            .find(|(n, _)| ["host", "hostaddr", "port"].contains(&n.as_str()))
    {
        return Err(invalid(format!(
            "`{name}` in the query beside a list of hosts: write each server as `host:port` in \
             the list (`postgres://h1:5432,h2:5432/db`)"
        )));
    }
    let query: Vec<&str> = kept.iter().map(|(_, pair)| *pair).collect();
    let query = if query.is_empty() {
        String::new()
    } else {
        format!("?{}", query.join("&"))
    };
    let user = user.map(|u| format!("{u}@")).unwrap_or_default();
    hosts
        .split(',')
        .map(|host| {
            if several {
                check_host(host)?;
            }
            PgConnectOptions::from_str(&format!("{scheme}://{user}{host}{path}{query}"))
                .map_err(|e| invalid(format!("{e} (the server `{host}`)")))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// What idem does with each `target_session_attrs`: the store writes, so it always uses the
/// server that takes writes; a value that asks for another is refused.
fn check_attrs(value: &str) -> Result<(), IdemError> {
    match value {
        "read-write" | "primary" | "any" => Ok(()),
        "read-only" | "standby" | "prefer-standby" => Err(invalid(format!(
            "`{ATTRS}={value}` asks for a server that takes no writes, and every call writes its \
             claim: write `{ATTRS}=read-write` (or leave it out)"
        ))),
        other => Err(invalid(format!(
            "`{ATTRS}={other}` is none of libpq's values (any, read-write, primary, read-only, \
             standby, prefer-standby); idem takes read-write, primary or any, and uses the server \
             that takes writes whichever it is"
        ))),
    }
}

/// One entry of the host list: `host`, `host:port`, `[v6]` or `[v6]:port`.
fn check_host(entry: &str) -> Result<(), IdemError> {
    let (host, port) = match entry.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((addr, "")) => (addr, None),
            Some((addr, rest)) => match rest.strip_prefix(':') {
                Some(port) => (addr, Some(port)),
                None => (addr, Some(rest)),
            },
            None => (v6, None),
        },
        None if entry.matches(':').count() > 1 => {
            return Err(invalid(format!(
                "`{entry}` in the list of hosts: write an IPv6 address in brackets (`[::1]:5432`)"
            )));
        }
        None => match entry.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (entry, None),
        },
    };
    if host.is_empty() {
        return Err(invalid(format!(
            "an empty host in the list of hosts (`{entry}`): write `host:port,host:port`"
        )));
    }
    match port.map(str::parse::<u16>) {
        None | Some(Ok(1..)) => Ok(()),
        Some(_) => Err(invalid(format!(
            "`{}` is not a port (1 to 65535), in the list of hosts (`{entry}`)",
            port.unwrap_or_default()
        ))),
    }
}

/// One server of the list.
struct Server {
    /// `host:port`, for messages.
    name: String,
    options: PgConnectOptions,
}

/// Whether the session on `conn` takes writes: `transaction_read_only` is on on a standby and on a
/// server held read-only (`default_transaction_read_only`), as libpq's `read-write` checks.
async fn writable(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let read_only: String = sqlx::query_scalar("SELECT current_setting('transaction_read_only')")
        .fetch_one(conn)
        .await?;
    Ok(read_only == "off")
}

impl Server {
    /// Dials the server within `timeout` and asks whether it takes writes.
    async fn probe(&self, timeout: Duration) -> Result<bool, IdemError> {
        let mut conn = crate::net::dial::<PgConnection>(
            "Postgres",
            Dialect::Postgres,
            &self.name,
            &self.options,
            timeout,
        )
        .await?;
        let answer = tokio::time::timeout(timeout, writable(&mut conn)).await;
        crate::net::hang_up(conn).await;
        match answer {
            Ok(answer) => answer.map_err(super::db_error),
            Err(_) => Err(IdemError::unavailable(format!(
                "Postgres at {} did not say whether it takes writes within {timeout:?}",
                self.name
            ))),
        }
    }
}

/// The servers of a multi-host URL, which one the pool connects to, and the search for another.
pub(super) struct Hosts {
    servers: Vec<Server>,
    /// How long each dial of a search may take (the store's connect timeout).
    timeout: Duration,
    /// The server the pool's connect options name.
    current: AtomicUsize,
    searching: AtomicBool,
    /// When the pool's connect options last moved to another server.
    moved_at: Mutex<Option<Instant>>,
    /// The pool, while a store on it lives ([`Following`] takes it out when the last one goes).
    pool: Mutex<Option<PgPool>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under these locks is one assignment: a poisoned lock is still consistent.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Hosts {
    pub(super) fn new(options: Vec<PgConnectOptions>, timeout: Duration) -> Arc<Hosts> {
        let servers = options
            .into_iter()
            .map(|options| Server {
                name: crate::net::server(
                    options.get_host(),
                    options.get_port(),
                    options.get_socket().map(|p| p.as_path()),
                ),
                options,
            })
            .collect();
        Arc::new(Hosts {
            servers,
            timeout,
            current: AtomicUsize::new(0),
            searching: AtomicBool::new(false),
            moved_at: Mutex::new(None),
            pool: Mutex::new(None),
        })
    }

    /// The server that takes writes now: the first in the URL's order among those that answer
    /// read-write, all dialled at once.
    ///
    /// # Errors
    /// The servers' errors when each failed with one no retry cures (a refused login, another
    /// protocol); else [`IdemError::StoreUnavailable`] naming each server and what it answered.
    pub(super) async fn find(&self) -> Result<usize, IdemError> {
        let probes = self.servers.iter().map(|s| s.probe(self.timeout));
        let answers = futures_util::future::join_all(probes).await;
        if let Some(found) = answers.iter().position(|a| matches!(a, Ok(true))) {
            return Ok(found);
        }
        let mut said = Vec::new();
        let mut permanent = None;
        let mut transient = false;
        for (server, answer) in self.servers.iter().zip(answers) {
            match answer {
                Ok(_) => {
                    transient = true;
                    said.push(format!("{} is read-only", server.name));
                }
                Err(e) => {
                    transient |= e.is_retryable();
                    said.push(e.to_string());
                    if !e.is_retryable() {
                        permanent.get_or_insert(e);
                    }
                }
            }
        }
        match permanent {
            Some(e) if !transient => Err(e),
            _ => Err(IdemError::unavailable(format!(
                "no Postgres server of the URL takes writes now (a failover under way, or every \
                 server down): {}",
                said.join("; ")
            ))),
        }
    }

    /// `host:port` of server `i`.
    pub(super) fn name(&self, i: usize) -> &str {
        &self.servers[i].name
    }

    /// The connect options of server `i`.
    pub(super) fn options(&self, i: usize) -> &PgConnectOptions {
        &self.servers[i].options
    }

    /// `options` checking each new connection for writes and closing, as they come out of the
    /// pool, the connections opened before a move; the pool starts on server `current`.
    pub(super) fn watched(
        self: &Arc<Self>,
        current: usize,
        options: PgPoolOptions,
    ) -> PgPoolOptions {
        self.current.store(current, Ordering::Release);
        let (hosts, fresh) = (self.clone(), self.clone());
        options
            .after_connect(move |conn, _| {
                let hosts = hosts.clone();
                Box::pin(async move {
                    if writable(conn).await? {
                        return Ok(());
                    }
                    hosts.search();
                    Err(sqlx::Error::Configuration(
                        "the server is read-only (a standby, or a primary not taking writes yet); \
                         looking for the one that takes writes"
                            .into(),
                    ))
                })
            })
            .before_acquire(move |_, meta| {
                let opened_after_move =
                    lock(&fresh.moved_at).is_none_or(|at| meta.age < at.elapsed());
                Box::pin(async move { Ok(opened_after_move) })
            })
    }

    /// Looks, in a task of its own, for the server that takes writes until one does, and moves
    /// the pool there; nothing when a search is under way or no store is left on the pool.
    pub(super) fn search(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.searching.swap(true, Ordering::AcqRel) {
            return;
        }
        let hosts = self.clone();
        runtime.spawn(async move {
            let mut pause = Duration::from_millis(50);
            loop {
                let Some(pool) = lock(&hosts.pool).clone() else {
                    break;
                };
                match hosts.find().await {
                    Ok(found) => {
                        hosts.move_to(found, &pool);
                        break;
                    }
                    Err(e) => tracing::debug!(error = %e, "no Postgres server takes writes yet"),
                }
                drop(pool);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(SEARCH_PAUSE);
            }
            hosts.searching.store(false, Ordering::Release);
        });
    }

    /// Points the pool's new connections at server `found`, if it is another.
    fn move_to(&self, found: usize, pool: &PgPool) {
        let was = self.current.load(Ordering::Acquire);
        if was == found {
            return;
        }
        pool.set_connect_options(self.servers[found].options.clone());
        *lock(&self.moved_at) = Some(Instant::now());
        self.current.store(found, Ordering::Release);
        tracing::warn!(
            from = %self.servers[was].name,
            to = %self.servers[found].name,
            "the Postgres server that takes writes moved; the store's pool follows it"
        );
    }
}

/// A store's hold on [`Hosts`]: shared by the store's clones; when the last goes, the pool is
/// taken out of `Hosts` (which the pool's own callbacks hold), so neither keeps the other.
pub(super) struct Following(Arc<Hosts>);

impl Following {
    pub(super) fn new(hosts: Arc<Hosts>, pool: PgPool) -> Arc<Following> {
        *lock(&hosts.pool) = Some(pool);
        Arc::new(Following(hosts))
    }

    /// A watch over one statement: unless [`Watch::settled`] says it answered, or failed with
    /// an error that says nothing of the server, dropping it starts a search.
    pub(super) fn watch(&self) -> Watch<'_> {
        Watch {
            hosts: &self.0,
            armed: true,
        }
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        lock(&self.0.pool).take();
    }
}

/// See [`Following::watch`].
pub(super) struct Watch<'a> {
    hosts: &'a Arc<Hosts>,
    armed: bool,
}

/// The SQLSTATE of the Postgres refusal a store error's source carries, if it is one.
fn server_code<'a>(source: &'a (dyn std::error::Error + 'static)) -> Option<&'a str> {
    source
        .downcast_ref::<crate::sql::error::ServerError>()?
        .code()
}

impl Watch<'_> {
    /// Whether dropping it now starts a search.
    pub(super) fn armed(&self) -> bool {
        self.armed
    }

    /// The statement's answer, with a read-only server's refusal (SQLSTATE 25006: the server
    /// stopped taking writes, nothing was written) as [`IdemError::StoreUnavailable`]; a search
    /// starts when the answer is unavailable.
    pub(super) fn settled<R>(&mut self, done: Result<R, IdemError>) -> Result<R, IdemError> {
        let done = done.map_err(|e| match e {
            IdemError::Store { source } if server_code(&*source) == Some("25006") => {
                IdemError::unavailable(source)
            }
            other => other,
        });
        self.armed = matches!(done, Err(IdemError::StoreUnavailable { .. }));
        done
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.hosts.search();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(url: &str) -> Vec<(String, u16)> {
        parse(url)
            .unwrap()
            .expect("a list of hosts")
            .iter()
            .map(|o| (o.get_host().to_owned(), o.get_port()))
            .collect()
    }

    fn refused(url: &str) -> String {
        match parse(url) {
            Err(IdemError::InvalidOptions { reason }) => reason,
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn reads_each_server_with_the_rest_of_the_url() {
        let url = "postgres://app:s3cret@db1:5433,db2:5434/orders?target_session_attrs=read-write\
                   &sslmode=disable&application_name=shop";
        let list = parse(url).unwrap().unwrap();
        assert_eq!(
            servers(url),
            [("db1".to_owned(), 5433), ("db2".to_owned(), 5434)]
        );
        for options in &list {
            assert_eq!(options.get_username(), "app");
            assert_eq!(options.get_database(), Some("orders"));
            assert_eq!(options.get_application_name(), Some("shop"));
            assert!(matches!(
                options.get_ssl_mode(),
                sqlx::postgres::PgSslMode::Disable
            ));
        }
        // pg_auto_failover's own form, without a user; a host without a port, IPv6 in brackets.
        assert_eq!(
            servers(
                "postgresql://127.0.0.1:6001,127.0.0.1:6002/test?target_session_attrs=read-write&sslmode=prefer"
            ),
            [
                ("127.0.0.1".to_owned(), 6001),
                ("127.0.0.1".to_owned(), 6002)
            ]
        );
        assert_eq!(
            servers("postgres://u@[::1]:6001,h2,[fe80::1]/db")
                .iter()
                .map(|(h, _)| h.as_str())
                .collect::<Vec<_>>(),
            // As sqlx reads an IPv6 host of a one-host URL.
            [
                PgConnectOptions::from_str("postgres://u@[::1]:6001/db")
                    .unwrap()
                    .get_host(),
                "h2",
                "[fe80::1]"
            ]
        );
        assert_eq!(servers("postgres://u@[::1]:6001,h2/db")[0].1, 6001);
    }

    #[test]
    fn one_host_is_sqlx_s_unless_it_asks_for_writes() {
        assert!(
            parse("postgres://u@h:5432/db?sslmode=disable")
                .unwrap()
                .is_none()
        );
        assert!(parse("postgres://u@h/db").unwrap().is_none());
        assert!(parse("mysql://u@h1,h2/db").unwrap().is_none());
        assert_eq!(
            servers("postgres://u@h:5439/db?target_session_attrs=read-write"),
            [("h".to_owned(), 5439)]
        );
        for attrs in ["any", "primary", "read-write"] {
            let url = format!("postgres://u@h1,h2/db?target_session_attrs={attrs}");
            assert_eq!(servers(&url).len(), 2, "{attrs}");
        }
        assert_eq!(servers("postgres://u@h1,h2/db").len(), 2);
    }

    #[test]
    fn refuses_what_it_cannot_connect_to() {
        let bad_port = refused("postgres://u:pw@h1:54x2,h2:5432/db");
        assert!(bad_port.contains("`54x2` is not a port"), "{bad_port}");
        assert!(!bad_port.contains("pw"), "{bad_port}");
        let zero = refused("postgres://u@h1:0,h2/db");
        assert!(zero.contains("`0` is not a port"), "{zero}");
        let big = refused("postgres://u@h1:70000,h2/db");
        assert!(big.contains("`70000` is not a port"), "{big}");
        let empty = refused("postgres://u@h1,,h2/db");
        assert!(empty.contains("an empty host"), "{empty}");
        // One host is sqlx's to read, a Unix socket in the query too.
        let socket = parse("postgres:///db?host=%2Frun%2Fpostgresql&target_session_attrs=any")
            .unwrap()
            .unwrap();
        assert_eq!(
            socket[0].get_socket().map(|p| p.to_str().unwrap()),
            Some("/run/postgresql")
        );
        let trailing = refused("postgres://u@h1:5432,/db");
        assert!(trailing.contains("an empty host"), "{trailing}");
        let v6 = refused("postgres://u@::1:5432,h2/db");
        assert!(v6.contains("IPv6 address in brackets"), "{v6}");
        let host = refused("postgres://u@h1,h2/db?host=h3");
        assert!(host.contains("`host` in the query"), "{host}");
        for attrs in ["read-only", "standby", "prefer-standby"] {
            let why = refused(&format!(
                "postgres://u@h1,h2/db?target_session_attrs={attrs}"
            ));
            assert!(why.contains("takes no writes"), "{attrs}: {why}");
            let why = refused(&format!("postgres://u@h1/db?target_session_attrs={attrs}"));
            assert!(why.contains("takes no writes"), "{attrs}: {why}");
        }
        let unknown = refused("postgres://u@h1,h2/db?target_session_attrs=readwrite");
        assert!(
            unknown.contains("none of libpq's values") && unknown.contains("read-write"),
            "{unknown}"
        );
    }

    #[test]
    fn a_read_only_refusal_is_unavailable_and_other_errors_keep_their_class() {
        let following = Following(Hosts::new(Vec::new(), Duration::from_secs(1)));
        let refusal = |code| {
            IdemError::store(crate::sql::error::ServerError::new(
                "Postgres",
                code,
                "cannot execute INSERT in a read-only transaction",
            ))
        };
        let mut watch = following.watch();
        let done = watch.settled::<()>(Err(refusal("25006")));
        assert!(
            matches!(&done, Err(IdemError::StoreUnavailable { source }) if source.to_string().contains("25006")),
            "{done:?}"
        );
        assert!(watch.armed, "a search starts");
        let mut watch = following.watch();
        let done = watch.settled::<()>(Err(refusal("23505")));
        assert!(matches!(done, Err(IdemError::Store { .. })), "{done:?}");
        assert!(!watch.armed);
        let mut watch = following.watch();
        assert_eq!(watch.settled(Ok(1)).unwrap(), 1);
        assert!(!watch.armed);
        // Dropped before its answer (a store timeout cut it off): armed.
        assert!(following.watch().armed);
    }
}
