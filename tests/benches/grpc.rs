//! What the gRPC layer costs a unary call: a tonic service (`shop.Orders/Create`, a small prost
//! message each way) bare, against the same service behind `idem::grpc::GrpcLayer` on a
//! `MemoryStore` with a metadata principal; first executions (a new key each) and replays (one
//! key).
//!
//! Twice: called in process (`tower::ServiceExt::oneshot` on the generated server with a framed
//! request, no sockets, so the figure is the layer's own work), and over loopback with a tonic
//! client (HTTP/2, one call at a time), what a service sees. Rounds alternate the order and the
//! ratio is taken per round, then the median.
//!
//! `cargo bench -p idem-suite --bench grpc --features grpc` (`IDEM_BENCH_ONLY=in-process` or
//! `loopback` for one of the two; `IDEM_BENCH_SCALE=0.1` for a quick look)

#[path = "../tests/support/grpc_shop.rs"]
mod grpc_shop;

use std::hint::black_box;
use std::time::{Duration, Instant};

use axum::body::Body;
use grpc_shop::orders_server::{Orders, OrdersServer};
use grpc_shop::{CREATE, CreateOrder, LookupOrder, Order};
use http_body_util::BodyExt;
use idem::MemoryStore;
use idem::grpc::GrpcLayer;
use idem::http::Principal;
use prost::Message;
use tonic::{Request, Response, Status};
use tower::{Layer, ServiceExt};

mod support;
use support::{Table, median, r3, rate};

#[derive(Clone)]
struct Shop;

#[tonic::async_trait]
impl Orders for Shop {
    async fn create(&self, req: Request<CreateOrder>) -> Result<Response<Order>, Status> {
        Ok(Response::new(Order {
            id: 7,
            item: req.into_inner().item,
            by: "alice".to_owned(),
        }))
    }

    async fn lookup(&self, _: Request<LookupOrder>) -> Result<Response<Order>, Status> {
        Err(Status::unimplemented("not benched"))
    }

    async fn watch(
        &self,
        _: Request<tonic::Streaming<LookupOrder>>,
    ) -> Result<Response<Order>, Status> {
        Err(Status::unimplemented("not benched"))
    }
}

fn layer() -> GrpcLayer {
    GrpcLayer::builder(MemoryStore::new())
        .method(CREATE)
        .principal(Principal::header(http::HeaderName::from_static("x-user")))
        .ttl(Duration::from_secs(3600))
        .build()
        .unwrap()
}

fn message() -> CreateOrder {
    CreateOrder {
        item: "book".to_owned(),
        qty: 2,
        request_id: String::new(),
    }
}

/// The framed request a tonic client sends for `Create`.
fn request(key: &str, framed: &[u8]) -> http::Request<Body> {
    http::Request::post(format!("http://localhost{CREATE}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("x-user", "alice")
        .header("idempotency-key", key)
        .body(Body::from(framed.to_vec()))
        .unwrap()
}

fn framed() -> Vec<u8> {
    let message = message().encode_to_vec();
    let mut framed = vec![0];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    framed
}

/// Calls per second through `service` in process, `n` calls with keys from `key`.
async fn in_process<S, B>(service: &S, n: u64, key: impl Fn(u64) -> String) -> f64
where
    S: tower::Service<http::Request<Body>, Response = http::Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let body = framed();
    let t = Instant::now();
    for i in 0..n {
        let response = service
            .clone()
            .oneshot(request(&key(i), &body))
            .await
            .unwrap();
        let collected = response.into_body().collect().await.unwrap();
        assert_eq!(
            collected
                .trailers()
                .and_then(|t| t.get("grpc-status"))
                .map(|v| v.as_bytes()),
            Some(&b"0"[..])
        );
        black_box(collected.to_bytes());
    }
    n as f64 / t.elapsed().as_secs_f64()
}

/// Calls per second from a tonic client over loopback, `n` calls with keys from `key`.
async fn over_loopback(
    client: &mut grpc_shop::orders_client::OrdersClient<tonic::transport::Channel>,
    n: u64,
    key: impl Fn(u64) -> String,
) -> f64 {
    let t = Instant::now();
    for i in 0..n {
        let mut req = grpc_shop::keyed(message(), &key(i));
        req.metadata_mut()
            .insert("x-user", "alice".parse().unwrap());
        black_box(client.create(req).await.unwrap());
    }
    n as f64 / t.elapsed().as_secs_f64()
}

/// Bare, first executions and replays, `rounds` rounds alternating their order; adds their rows
/// to `table`.
async fn compare<F, Fut>(table: &mut Table, title: &str, rounds: usize, n: u64, mut run: F)
where
    F: FnMut(usize, u8, u64) -> Fut,
    Fut: Future<Output = f64>,
{
    let (mut b, mut f, mut r, mut fr, mut rr) = (vec![], vec![], vec![], vec![], vec![]);
    for round in 0..rounds {
        let order: [u8; 3] = if round % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
        let mut rates = [0.0; 3];
        for which in order {
            rates[which as usize] = run(round, which, n).await;
        }
        b.push(rates[0]);
        f.push(rates[1]);
        r.push(rates[2]);
        fr.push(rates[1] / rates[0]);
        rr.push(rates[2] / rates[0]);
    }
    let us = |rate: f64| 1e6 / rate;
    let (bare, first, replay) = (median(b), median(f), median(r));
    let added = |rate: f64| format!("{:.2}", us(rate) - us(bare));
    table.row([
        format!("{title}: bare tonic service"),
        rate(bare),
        "–".to_owned(),
        "–".to_owned(),
    ]);
    table.row([
        format!("{title}: first execution (new key)"),
        rate(first),
        added(first),
        r3(median(fr)),
    ]);
    table.row([
        format!("{title}: replay (same key)"),
        rate(replay),
        added(replay),
        r3(median(rr)),
    ]);
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // IDEM_BENCH_SCALE=0.1 for a quick look.
    let scale = support::scale();
    let rounds = support::rounds(if scale < 1.0 { 1 } else { 9 });
    let only = support::only();
    let runs = |what: &str| only.is_empty() || only.iter().any(|o| o == what);
    let mut table = Table::new("grpc", &["scenario", "calls/s", "µs added", "layer / bare"]);
    rt.block_on(async {
        let n = ((20_000.0 * scale) as u64).max(100);
        if runs("in-process") {
            let bare = OrdersServer::new(Shop);
            compare(&mut table, "in process", rounds, n, |round, which, n| {
                let bare = bare.clone();
                async move {
                    match which {
                        0 => in_process(&bare, n, |_| "k".to_owned()).await,
                        1 => {
                            let fresh = layer().layer(OrdersServer::new(Shop));
                            in_process(&fresh, n, |i| format!("k-{round}-{i}")).await
                        }
                        _ => {
                            let replays = layer().layer(OrdersServer::new(Shop));
                            in_process(&replays, 1, |_| "same".to_owned()).await;
                            in_process(&replays, n, |_| "same".to_owned()).await
                        }
                    }
                }
            })
            .await;
        }
        if !runs("loopback") {
            return;
        }

        let n = ((5_000.0 * scale) as u64).max(100);
        let bare = grpc_shop::client(serve_bare().await).await;
        let fresh = grpc_shop::client(grpc_shop::serve(layer(), Shop).await).await;
        let replays = grpc_shop::client(grpc_shop::serve(layer(), Shop).await).await;
        compare(&mut table, "over loopback", rounds, n, |round, which, n| {
            let (mut bare, mut fresh, mut replays) = (bare.clone(), fresh.clone(), replays.clone());
            async move {
                match which {
                    0 => over_loopback(&mut bare, n, |_| "k".to_owned()).await,
                    1 => over_loopback(&mut fresh, n, |i| format!("k-{round}-{i}")).await,
                    _ => over_loopback(&mut replays, n, |_| "same".to_owned()).await,
                }
            }
        })
        .await;
    });
    table.emit();
}

/// The bare service on a loopback port; its address.
async fn serve_bare() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(OrdersServer::new(Shop))
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    addr
}
