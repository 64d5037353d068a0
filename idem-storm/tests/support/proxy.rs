//! A TCP fault proxy for tests: forwards loopback connections to a server and, on command, cuts
//! them, refuses new ones, delays every chunk, or goes half-open (keeps connections up and drops
//! what passes).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

#[derive(Default)]
struct State {
    refuse: AtomicBool,
    half_open: AtomicBool,
    delay_ms: AtomicU64,
    conns: Mutex<Vec<AbortHandle>>,
    accepted: AtomicU64,
}

/// A running proxy; dropped, it stops accepting (open connections end with their tasks).
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
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
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
                s.accepted.fetch_add(1, Ordering::Relaxed);
                let s2 = s.clone();
                let conn = tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pipe(cr, sw, s2.clone()), pipe(sr, cw, s2));
                });
                s.conns.lock().unwrap().push(conn.abort_handle());
            }
        })
        .abort_handle();
        Proxy {
            addr,
            state,
            accept,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every open connection (both sides see it end).
    pub fn cut(&self) {
        for c in self.state.conns.lock().unwrap().drain(..) {
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
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    state: Arc<State>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut dead = false;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        dead |= state.half_open.load(Ordering::SeqCst);
        if dead {
            continue;
        }
        let delay = state.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
