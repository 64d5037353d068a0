//! The gRPC test service's messages and stubs: `shop.Orders` with the unary `Create` and `Lookup`
//! and the client-streaming `Watch` (the stubs come from `build.rs`). Include it with
//! `#[path = "support/grpc_shop.rs"] mod grpc_shop;`.

#![allow(dead_code)]

/// `shop.CreateOrder`: an order for `qty` of `item`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateOrder {
    #[prost(string, tag = "1")]
    pub item: String,
    #[prost(uint32, tag = "2")]
    pub qty: u32,
    /// The client's id for this order, for a layer that reads the key from the message.
    #[prost(string, tag = "3")]
    pub request_id: String,
}

/// `shop.LookupOrder`: the order with `id`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LookupOrder {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// `shop.Order`: an order, and who made it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Order {
    #[prost(int64, tag = "1")]
    pub id: i64,
    #[prost(string, tag = "2")]
    pub item: String,
    #[prost(string, tag = "3")]
    pub by: String,
}

include!(concat!(env!("OUT_DIR"), "/shop.Orders.rs"));

pub const CREATE: &str = "/shop.Orders/Create";
pub const WATCH: &str = "/shop.Orders/Watch";

/// A tonic server for `service` on a loopback port, behind `layer`; its address.
pub async fn serve<S: orders_server::Orders>(
    layer: idem::grpc::GrpcLayer,
    service: S,
) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(orders_server::OrdersServer::new(service))
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    addr
}

/// A client of the server at `addr`.
pub async fn client(
    addr: std::net::SocketAddr,
) -> orders_client::OrdersClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    orders_client::OrdersClient::new(channel)
}

/// A request carrying `key` as its `idempotency-key`.
pub fn keyed<M>(message: M, key: &str) -> tonic::Request<M> {
    let mut req = tonic::Request::new(message);
    req.metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    req
}
