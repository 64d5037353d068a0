//! Warm connections: the connections a server store's own statements (claims, marks, renewals, …)
//! take and give back without going through the pool's idle queue each time.
//!
//! sqlx pings every connection it takes back into its pool (a round trip to the server, in a task
//! of its own), whatever the connection just did. A lease-mode call takes a connection twice for
//! a new key (claim, mark) and once for a replay, so a busy store paid as many pings as
//! statements: on MariaDB 40–70 % more replays per second without them, measured on the design
//! floor (docs/BENCHMARKS.md). A connection that answered its statement is known to work, so the
//! store keeps it here for its next statement instead.
//!
//! What keeps this from taking the pool from anyone else:
//! - at most half the pool's connections wait here at once (the rest go back to the pool);
//! - a connection that waited here [`WARM_FOR`] (100 ms) goes back to the pool at the next look of
//!   a task that looks every 100 ms while any waits, so the pool's other users (your own queries
//!   on `store.pool()`, transactions, the outbox relay) are kept from one for at most 200 ms;
//! - only a connection whose statement finished comes back here: one whose statement failed goes
//!   back to the pool, which tests it as before; a lost connection (a server restart) also sends
//!   every warm one back, so none that died with it is used again;
//! - a connection whose future was dropped mid-statement (a call's store timeout, a cancelled
//!   call) is closed, not given back: it may still be waiting for an answer that never comes (a
//!   network gone silent), and the pool's test of it, a ping, would wait as long while holding one
//!   of the pool's places, so enough of them would leave the store without connections even after
//!   the network came back. The pool opens a new one in its place.

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};

use super::store::Lent;
use crate::IdemError;

/// How long a connection waits here for the store's next statement before it goes back to the
/// pool.
pub(crate) const WARM_FOR: Duration = Duration::from_millis(100);

/// The warm connections of one store (and its clones), over its pool.
pub(crate) struct Warm<DB: Database> {
    pool: Pool<DB>,
    idle: Arc<Mutex<Idle<DB>>>,
    /// How many may wait here at once: half the pool's connections.
    cap: usize,
}

/// The connections waiting, oldest first, with when each came back.
struct Idle<DB: Database> {
    conns: Vec<(PoolConnection<DB>, Instant)>,
    /// Whether a task is sending the stale ones back.
    aging: bool,
}

impl<DB: Database> Drop for Idle<DB> {
    fn drop(&mut self) {
        // A connection going back to the pool is a task sqlx spawns, which needs a runtime; a
        // store dropped without one (after `block_on` returned) lets its warm connections go
        // from the pool instead (the pool may open others), closing them here.
        if tokio::runtime::Handle::try_current().is_err() {
            for (conn, _) in self.conns.drain(..) {
                drop(conn.detach());
            }
        }
    }
}

impl<DB: Database> Clone for Warm<DB> {
    fn clone(&self) -> Self {
        Warm {
            pool: self.pool.clone(),
            idle: self.idle.clone(),
            cap: self.cap,
        }
    }
}

fn lock<DB: Database>(idle: &Mutex<Idle<DB>>) -> MutexGuard<'_, Idle<DB>> {
    // Every change under the lock is a push or a pop: a poisoned lock is still consistent.
    idle.lock().unwrap_or_else(|p| p.into_inner())
}

impl<DB: Database> Warm<DB> {
    /// Warm connections over `pool`.
    pub(crate) fn new(pool: Pool<DB>) -> Self {
        let cap = usize::try_from(pool.options().get_max_connections() / 2).unwrap_or(0);
        Warm {
            pool,
            idle: Arc::new(Mutex::new(Idle {
                conns: Vec::new(),
                aging: false,
            })),
            cap,
        }
    }

    /// Lends a warm connection, or one from the pool; `error` classifies the pool's error when it
    /// has none to give.
    pub(crate) async fn lend(
        &self,
        error: fn(sqlx::Error) -> IdemError,
    ) -> Result<WarmLent<'_, DB>, IdemError> {
        let taken = lock(&self.idle).conns.pop();
        let conn = match taken {
            Some((conn, _)) => conn,
            None => self.pool.acquire().await.map_err(error)?,
        };
        Ok(WarmLent {
            warm: self,
            conn: InFlight(Some(conn)),
        })
    }

    /// Keeps `conn` for the next statement, if there is room and a runtime to age it on; else it
    /// goes back to the pool.
    fn give_back(&self, conn: PoolConnection<DB>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut idle = lock(&self.idle);
        if idle.conns.len() >= self.cap {
            drop(idle);
            drop(conn);
            return;
        }
        idle.conns.push((conn, Instant::now()));
        // An ager that has not looked for three of its periods went with the runtime it ran on.
        let lost = idle
            .conns
            .first()
            .is_some_and(|(_, since)| since.elapsed() > 3 * WARM_FOR);
        if !idle.aging || lost {
            idle.aging = true;
            runtime.spawn(age(Arc::downgrade(&self.idle)));
        }
    }

    /// Sends every warm connection back to the pool.
    pub(crate) fn cool(&self) {
        let conns = std::mem::take(&mut lock(&self.idle).conns);
        drop(conns);
    }
}

/// A connection lent to a statement: closed if the statement's future is dropped before it ends
/// (see the module docs), instead of going back to the pool's test.
struct InFlight<DB: Database>(Option<PoolConnection<DB>>);

impl<DB: Database> InFlight<DB> {
    fn conn(&mut self) -> &mut DB::Connection {
        match &mut self.0 {
            Some(conn) => conn,
            None => unreachable!("lent until the statement ends"),
        }
    }
}

/// A connection [`Warm::lend`] lent: kept warm when its statement answered, sent back to the pool
/// when it failed (every warm one too when the server may be gone), closed when dropped unsettled.
pub(crate) struct WarmLent<'a, DB: Database> {
    warm: &'a Warm<DB>,
    conn: InFlight<DB>,
}

impl<DB: Database> Lent<DB::Connection> for WarmLent<'_, DB> {
    fn conn(&mut self) -> &mut DB::Connection {
        self.conn.conn()
    }

    fn settle<R>(mut self, done: Result<R, IdemError>) -> Result<R, IdemError> {
        let Some(conn) = self.conn.0.take() else {
            unreachable!("taken only here or on drop")
        };
        match &done {
            Ok(_) => self.warm.give_back(conn),
            Err(IdemError::StoreUnavailable { .. }) => {
                // The server may have restarted: the pool tests this one and every warm one.
                drop(conn);
                self.warm.cool();
            }
            Err(_) => drop(conn),
        }
        done
    }
}

impl<DB: Database> Drop for InFlight<DB> {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            tracing::debug!("a statement was cut off before its answer; closing its connection");
            drop(conn.detach());
        }
    }
}

/// Every [`WARM_FOR`] while any connection waits: sends back to the pool those that waited that
/// long. Ends when none waits (or the store is gone).
async fn age<DB: Database>(idle: Weak<Mutex<Idle<DB>>>) {
    loop {
        tokio::time::sleep(WARM_FOR).await;
        let Some(idle) = idle.upgrade() else {
            return;
        };
        let mut guard = lock(&idle);
        let now = Instant::now();
        let fresh = guard
            .conns
            .iter()
            .position(|(_, since)| now.duration_since(*since) < WARM_FOR)
            .unwrap_or(guard.conns.len());
        let stale: Vec<_> = guard.conns.drain(..fresh).collect();
        let done = guard.conns.is_empty();
        if done {
            guard.aging = false;
        }
        drop(guard);
        drop(stale);
        if done {
            return;
        }
    }
}
