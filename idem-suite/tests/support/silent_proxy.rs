//! A TCP proxy that can make the network go silent: while silent it forwards nothing in either
//! direction and answers no new connection, yet closes nothing, so the store's client sees its
//! connections stay up and its requests never answered (a dropped network, a dead NAT entry, a
//! hung load balancer). Bytes that arrive meanwhile are held, not dropped, as TCP would hold
//! them: when the network comes back ([`SilentProxy::heal`]) they are delivered, late. Or the
//! connections open during the silence stay dead for good while new ones work
//! ([`SilentProxy::heal_new_only`]), as after a NAT entry or a load balancer's flow table was lost.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// A running proxy; dropped, it stops and closes every connection it carried.
pub struct SilentProxy {
    addr: SocketAddr,
    silent: watch::Sender<bool>,
    lines: Arc<Lines>,
    tasks: Arc<Mutex<Vec<AbortHandle>>>,
}

impl Drop for SilentProxy {
    fn drop(&mut self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

impl SilentProxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> SilentProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let silent = watch::Sender::new(false);
        let tasks: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let lines: Arc<Lines> = Arc::default();
        let (quiet, held, all) = (silent.clone(), tasks.clone(), lines.clone());
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let quiet = quiet.clone();
                let line = Line {
                    id: all.opened.fetch_add(1, Ordering::SeqCst),
                    lines: all.clone(),
                };
                let conn = tokio::spawn(async move {
                    // A connection made while silent is accepted by the kernel and then hears
                    // nothing until the network is back.
                    line.heard(&quiet).await;
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(
                        pipe(cr, sw, quiet.clone(), line.clone()),
                        pipe(sr, cw, quiet, line)
                    );
                });
                held.lock().unwrap().push(conn.abort_handle());
            }
        });
        tasks.lock().unwrap().push(accept.abort_handle());
        SilentProxy {
            addr,
            silent,
            lines,
            tasks,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `url` with its `host:port` replaced by the proxy's.
    pub fn url(&self, url: &str, upstream: SocketAddr) -> String {
        let upstream = upstream.to_string();
        assert!(url.contains(&upstream), "{url} does not name {upstream}");
        url.replacen(&upstream, &self.addr.to_string(), 1)
    }

    /// Silences the network: nothing passes, nothing closes.
    pub fn silence(&self) {
        self.silent.send_replace(true);
    }

    /// Brings the network back: what was held is delivered.
    pub fn heal(&self) {
        self.silent.send_replace(false);
    }

    /// Brings the network back for new connections only: every connection opened so far stays
    /// silent for good (open, never answering), as after a lost NAT entry.
    pub fn heal_new_only(&self) {
        let opened = self.lines.opened.load(Ordering::SeqCst);
        self.lines.dead_below.store(opened, Ordering::SeqCst);
        self.silent.send_replace(false);
    }
}

/// The connections the proxy carries: how many were opened, and below which number they are
/// dead for good.
#[derive(Default)]
struct Lines {
    opened: AtomicU64,
    dead_below: AtomicU64,
}

/// One carried connection.
#[derive(Clone)]
struct Line {
    id: u64,
    lines: Arc<Lines>,
}

impl Line {
    /// Waits while the network is silent, and for ever once this connection is dead.
    async fn heard(&self, silent: &watch::Sender<bool>) {
        let mut rx = silent.subscribe();
        let _ = rx.wait_for(|silent| !*silent).await;
        if self.id < self.lines.dead_below.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    silent: watch::Sender<bool>,
    line: Line,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        line.heard(&silent).await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // What was read as the silence began waits for its end.
        line.heard(&silent).await;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
