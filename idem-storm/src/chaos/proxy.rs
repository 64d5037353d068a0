//! A TCP fault proxy: forwards loopback connections to a server and, on command, cuts
//! them, refuses new ones, delays every chunk, goes half-open (keeps connections up and drops what
//! passes), or goes silent.
//!
//! Silent: nothing is forwarded in either direction and no new connection is answered, yet nothing
//! is closed, so a client sees its connections stay up and its requests never answered (a dropped
//! network, a dead NAT entry, a hung load balancer). Bytes that arrive meanwhile are held, not
//! dropped, as TCP would hold them: when the network comes back ([`Proxy::heal`]) they are
//! delivered, late. Or the connections open during the silence stay dead for good while new ones
//! work ([`Proxy::heal_new_only`]), as after a NAT entry or a load balancer's flow table was lost.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

struct State {
    refuse: AtomicBool,
    half_open: AtomicBool,
    delay_ms: AtomicU64,
    conns: Mutex<Vec<AbortHandle>>,
    accepted: AtomicU64,
    silent: watch::Sender<bool>,
    /// Connections numbered below this stay silent for good.
    dead_below: AtomicU64,
}

/// A running proxy; dropped, it stops accepting and closes every connection it carried.
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
    accept: AbortHandle,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    ///
    /// # Errors
    /// No loopback port could be bound.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            refuse: AtomicBool::new(false),
            half_open: AtomicBool::new(false),
            delay_ms: AtomicU64::new(0),
            conns: Mutex::new(Vec::new()),
            accepted: AtomicU64::new(0),
            silent: watch::Sender::new(false),
            dead_below: AtomicU64::new(0),
        });
        let s = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                if s.refuse.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let line = Line {
                    id: s.accepted.fetch_add(1, Ordering::SeqCst),
                    state: s.clone(),
                };
                let conn = tokio::spawn(async move {
                    // A connection made while silent is accepted by the kernel and then hears
                    // nothing until the network is back.
                    line.heard().await;
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pipe(cr, sw, line.clone()), pipe(sr, cw, line));
                });
                lock(&s.conns).push(conn.abort_handle());
            }
        })
        .abort_handle();
        Ok(Proxy {
            addr,
            state,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `url` with its `host:port` (`upstream`) replaced by the proxy's.
    ///
    /// # Panics
    /// When `url` does not name `upstream`.
    pub fn url(&self, url: &str, upstream: SocketAddr) -> String {
        let upstream = upstream.to_string();
        assert!(url.contains(&upstream), "{url} does not name {upstream}");
        url.replacen(&upstream, &self.addr.to_string(), 1)
    }

    /// Closes every open connection (both sides see it end).
    pub fn cut(&self) {
        for c in lock(&self.state.conns).drain(..) {
            c.abort();
        }
    }

    /// Refuses (closes at once) every new connection while `on`.
    pub fn refuse(&self, on: bool) {
        self.state.refuse.store(on, Ordering::SeqCst);
    }

    /// While `on`, the open connections go half-open for good: they stay up but every byte that
    /// passes is dropped, as when the peer vanished without a word (TCP never loses bytes and
    /// carries on, so a connection that lost some is never used again). New connections made
    /// after it is turned off work.
    pub fn half_open(&self, on: bool) {
        self.state.half_open.store(on, Ordering::SeqCst);
    }

    /// Delays each chunk by `delay`.
    pub fn delay(&self, delay: Duration) {
        self.state
            .delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.state.accepted.load(Ordering::Relaxed)
    }

    /// Silences the network: nothing passes, nothing closes.
    pub fn silence(&self) {
        self.state.silent.send_replace(true);
    }

    /// Brings the network back: what was held is delivered.
    pub fn heal(&self) {
        self.state.silent.send_replace(false);
    }

    /// Brings the network back for new connections only: every connection accepted so far stays
    /// silent for good (open, never answering), as after a lost NAT entry.
    pub fn heal_new_only(&self) {
        let accepted = self.state.accepted.load(Ordering::SeqCst);
        self.state.dead_below.store(accepted, Ordering::SeqCst);
        self.state.silent.send_replace(false);
    }
}

/// One carried connection.
#[derive(Clone)]
struct Line {
    id: u64,
    state: Arc<State>,
}

impl Line {
    /// Waits while the network is silent, and for ever once this connection is dead.
    async fn heard(&self) {
        let mut silent = self.state.silent.subscribe();
        let _ = silent.wait_for(|silent| !*silent).await;
        if self.id < self.state.dead_below.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    line: Line,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut dead = false;
    loop {
        line.heard().await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        dead |= line.state.half_open.load(Ordering::SeqCst);
        if dead {
            continue;
        }
        // What was read as a silence began waits for its end.
        line.heard().await;
        let delay = line.state.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// The list of connections, also after a panic elsewhere held its lock.
fn lock(conns: &Mutex<Vec<AbortHandle>>) -> std::sync::MutexGuard<'_, Vec<AbortHandle>> {
    conns
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
