//! gRPC services behind `idem::grpc::GrpcLayer` killed mid-call: after the handler's effect (lease
//! mode, with and without `recover`), and mid-handler in transaction mode. A real tonic client
//! calls the child over loopback.

use prost::Message;
use tonic::{Code, Request, Response, Status};

use super::grpc_shop::{self, CreateOrder, LookupOrder, Order};
use super::service::{on_db, orders_table};
use super::*;

const BIZ: &str = "CRASHGRPC";

/// `Create`: writes the effect under the call's key as `who`, then (when `hang`) says READY and
/// waits to be killed; else answers the order `by: who`.
#[derive(Clone)]
struct EffectShop {
    effects: SqlitePool,
    who: &'static str,
    hang: bool,
}

fn key_of<M>(req: &Request<M>) -> String {
    req.metadata()
        .get("idempotency-key")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned()
}

#[tonic::async_trait]
impl grpc_shop::orders_server::Orders for EffectShop {
    async fn create(&self, req: Request<CreateOrder>) -> Result<Response<Order>, Status> {
        let key = key_of(&req);
        effect(&self.effects, BIZ, &key, self.who).await.unwrap();
        if self.hang {
            say("READY");
            std::future::pending::<()>().await;
        }
        Ok(Response::new(Order {
            id: 1,
            item: req.into_inner().item,
            by: self.who.to_owned(),
        }))
    }

    async fn lookup(&self, _: Request<LookupOrder>) -> Result<Response<Order>, Status> {
        Err(Status::unimplemented("not in this service"))
    }

    async fn watch(
        &self,
        _: Request<tonic::Streaming<LookupOrder>>,
    ) -> Result<Response<Order>, Status> {
        Err(Status::unimplemented("not in this service"))
    }
}

/// The layer on `store`, with `recover` reading the effects table when given: the order its
/// effect records, encoded as the handler would have answered it.
fn effect_layer(
    store: Arc<dyn Store>,
    lease: Duration,
    recover: Option<SqlitePool>,
) -> idem::grpc::GrpcLayer {
    let builder = idem::grpc::GrpcLayer::builder(store)
        .method(grpc_shop::CREATE)
        .principal(idem::http::Principal::unscoped(
            "a test service with one caller",
        ))
        .lease(lease);
    let builder = match recover {
        None => builder,
        Some(effects) => builder.recover(move |req: idem::grpc::GrpcRecoverRequest| {
            let effects = effects.clone();
            async move {
                let asked = CreateOrder::decode(req.message)?;
                let seen = effects_of(&effects, BIZ, &req.key).await;
                Ok(seen.first().map(|who| {
                    let order = Order {
                        id: 1,
                        item: asked.item,
                        by: who.clone(),
                    };
                    order.encode_to_vec().into()
                }))
            }
        }),
    };
    builder.build().unwrap()
}

/// The child: serves `EffectShop` (who `child`, hanging) behind the layer on the site's store.
pub(super) async fn serve_effect_child(spec: &Spec) {
    let store = open(&spec.backend).await;
    let effects = effects_pool(&spec.effects).await;
    let shop = EffectShop {
        effects,
        who: "child",
        hang: true,
    };
    let layer = effect_layer(store, Duration::from_millis(spec.lease_ms), None);
    say(&format!(
        "LISTEN {}",
        grpc_shop::serve(layer, shop).await.port()
    ));
    std::future::pending::<()>().await;
}

/// The child: serves `TxShop` (who `child`, hanging) behind the layer in transaction mode.
pub(super) async fn serve_tx_child(spec: &Spec) {
    let addr = tx_server(&spec.backend, "child", true).await;
    say(&format!("LISTEN {}", addr.port()));
    std::future::pending::<()>().await;
}

/// Starts the child service `spec` serves, calls `Create` with `key`, and kills it (SIGKILL) once
/// its handler says READY: the call dies with it.
async fn killed_mid_call(spec: Spec, key: &str) {
    let (child, port) = tokio::task::spawn_blocking(move || {
        let mut child = Running::spawn(&spec);
        let port = child.wait_for("LISTEN");
        let port = port.trim_start_matches("LISTEN ").parse::<u16>().unwrap();
        (child, port)
    })
    .await
    .unwrap();
    let mut client = grpc_shop::client(([127, 0, 0, 1], port).into()).await;
    let first = {
        let key = key.to_owned();
        tokio::spawn(async move { client.create(grpc_shop::keyed(create(), &key)).await })
    };
    let child = tokio::task::spawn_blocking(move || {
        let mut child = child;
        child.wait_for("READY");
        child
    })
    .await
    .unwrap();
    child.kill();
    assert!(first.await.unwrap().is_err(), "the service died mid-call");
}

fn create() -> CreateOrder {
    CreateOrder {
        item: "tv".to_owned(),
        qty: 1,
        request_id: String::new(),
    }
}

fn replayed<M>(response: &Response<M>) -> bool {
    response
        .metadata()
        .get(idem::grpc::REPLAYED_METADATA)
        .is_some_and(|v| v == "true")
}

/// A gRPC service killed (SIGKILL) after its handler's effect and before the layer stored the
/// response, 4 times (half of them with `recover`): after the lease, a retry at a restarted
/// service with `recover` gets the first call's response and no second effect; without `recover`,
/// lease mode alone: the handler runs again.
async fn grpc_service_killed_after_its_handlers_effect(site: Site) {
    let lease = Duration::from_secs(2);
    for trial in 0..4 {
        let with_recover = trial % 2 == 0;
        let key = format!("grpc-order-{trial}");
        let spec = site.spec(BIZ, &key, lease, Act::ServeGrpc);
        killed_mid_call(spec, &key).await;
        assert_eq!(effects_of(&site.effects, BIZ, &key).await, ["child"]);

        // The service comes back (in this process) on the same records.
        let recover = with_recover.then(|| site.effects.clone());
        let layer = effect_layer(open(&site.backend).await, lease, recover);
        let shop = EffectShop {
            effects: site.effects.clone(),
            who: "repeat",
            hang: false,
        };
        let mut client = grpc_shop::client(grpc_shop::serve(layer, shop).await).await;
        let early = client
            .create(grpc_shop::keyed(create(), &key))
            .await
            .unwrap_err();
        assert_eq!(
            early.code(),
            Code::Aborted,
            "{key}: in progress until the lease ends"
        );
        tokio::time::sleep(lease + Duration::from_millis(200)).await;
        let retry = client
            .create(grpc_shop::keyed(create(), &key))
            .await
            .unwrap();
        let effects = effects_of(&site.effects, BIZ, &key).await;
        if with_recover {
            assert!(replayed(&retry), "{key}");
            assert_eq!(
                retry.into_inner().by,
                "child",
                "{key}: the recovered response"
            );
            assert_eq!(effects, ["child"], "{key}: no second effect");
        } else {
            assert_eq!(retry.into_inner().by, "repeat", "{key}");
            assert_eq!(
                effects,
                ["child", "repeat"],
                "{key}: lease mode alone runs it again"
            );
        }
        let again = client
            .create(grpc_shop::keyed(create(), &key))
            .await
            .unwrap();
        assert!(replayed(&again), "{key}");
    }
}

/// `Create` in transaction mode: inserts the order `(key, who)` through the layer's transaction,
/// then (when `hang`) says READY and waits to be killed; else answers it.
struct TxShop<T> {
    table: String,
    who: &'static str,
    hang: bool,
    tx: std::marker::PhantomData<fn() -> T>,
}

#[tonic::async_trait]
impl<T> grpc_shop::orders_server::Orders for TxShop<T>
where
    T: idem::IdemTx + tx_orders::Orders + Sync,
{
    async fn create(&self, req: Request<CreateOrder>) -> Result<Response<Order>, Status> {
        let key = key_of(&req);
        let mut tx = idem::http::LayerTx::<T>::from_grpc(&req).await?;
        tx.get_mut()
            .insert_order(&self.table, &key, self.who)
            .await
            .unwrap();
        if self.hang {
            say("READY");
            std::future::pending::<()>().await;
        }
        drop(tx);
        Ok(Response::new(Order {
            id: 1,
            item: req.into_inner().item,
            by: self.who.to_owned(),
        }))
    }

    async fn lookup(&self, _: Request<LookupOrder>) -> Result<Response<Order>, Status> {
        Err(Status::unimplemented("not in this service"))
    }

    async fn watch(
        &self,
        _: Request<tonic::Streaming<LookupOrder>>,
    ) -> Result<Response<Order>, Status> {
        Err(Status::unimplemented("not in this service"))
    }
}

fn tx_layer<S>(store: S) -> idem::grpc::GrpcLayer
where
    S: idem::TransactionalStore,
    S::Tx: idem::store::StoreTx + 'static,
{
    idem::grpc::GrpcLayer::builder_tx(store)
        .method(grpc_shop::CREATE)
        .principal(idem::http::Principal::unscoped(
            "a test service with one caller",
        ))
        .build()
        .unwrap()
}

fn tx_shop<T>(backend: &Backend, who: &'static str, hang: bool) -> TxShop<T> {
    TxShop {
        table: orders_table(backend),
        who,
        hang,
        tx: std::marker::PhantomData,
    }
}

/// A server in transaction mode on the site's SQL store; its address.
async fn tx_server(backend: &Backend, who: &'static str, hang: bool) -> std::net::SocketAddr {
    match backend {
        Backend::Sqlite { path } => {
            let store = SqliteStore::open(path).await.unwrap();
            let shop = tx_shop::<idem::SqliteTx>(backend, who, hang);
            grpc_shop::serve(tx_layer(store), shop).await
        }
        #[cfg(feature = "postgres")]
        Backend::Postgres { url, table } => {
            let shop = tx_shop::<idem::PgTx>(backend, who, hang);
            grpc_shop::serve(tx_layer(pg_store(url, table).await), shop).await
        }
        #[cfg(feature = "mysql")]
        Backend::MySql { url, table } => {
            let shop = tx_shop::<idem::MySqlTx>(backend, who, hang);
            grpc_shop::serve(tx_layer(my_store(url, table).await), shop).await
        }
        _ => unreachable!("transaction mode runs on SQL stores"),
    }
}

/// A gRPC service in transaction mode killed (SIGKILL) after its insert and before the commit, 3
/// times: the database rolls the transaction back, so no order and no record are left; a retry at
/// a restarted service runs at once and creates exactly one order, and a repeat replays it.
async fn grpc_service_killed_mid_transaction(site: Site) {
    let table = orders_table(&site.backend);
    on_db(&site.backend, tx_orders::create_table(&table), None).await;
    let placeholder = match site.backend {
        Backend::Postgres { .. } => "$1",
        _ => "?",
    };
    let count = format!("SELECT COUNT(*) FROM {table} WHERE k = {placeholder}");
    for trial in 0..3 {
        let key = format!("grpc-tx-order-{trial}");
        let spec = site.spec("GRPC", &key, Duration::from_secs(30), Act::ServeGrpcTx);
        killed_mid_call(spec, &key).await;
        assert_eq!(
            on_db(&site.backend, count.clone(), Some(&key)).await,
            Some(0),
            "{key}: the killed insert did not commit"
        );

        let addr = tx_server(&site.backend, "repeat", false).await;
        let mut client = grpc_shop::client(addr).await;
        // The server may take a moment to see the connection die and roll back: the retry waits
        // for the lock meanwhile, never for a lease.
        let retry = client
            .create(grpc_shop::keyed(create(), &key))
            .await
            .unwrap();
        assert!(!replayed(&retry), "{key}");
        assert_eq!(retry.into_inner().by, "repeat", "{key}");
        assert_eq!(
            on_db(&site.backend, count.clone(), Some(&key)).await,
            Some(1),
            "{key}: the retry's order stayed"
        );
        let again = client
            .create(grpc_shop::keyed(create(), &key))
            .await
            .unwrap();
        assert!(replayed(&again), "{key}");
        assert_eq!(
            on_db(&site.backend, count.clone(), Some(&key)).await,
            Some(1)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_grpc_service_killed_after_its_handlers_effect() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    grpc_service_killed_after_its_handlers_effect(sqlite_site().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_grpc_service_killed_mid_transaction() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    grpc_service_killed_mid_transaction(sqlite_site().await).await;
}

on_server! {
    feature = "postgres": postgres_grpc_service_killed_after_its_handlers_effect = grpc_service_killed_after_its_handlers_effect on pg_site;
    feature = "redis": redis_grpc_service_killed_after_its_handlers_effect = grpc_service_killed_after_its_handlers_effect on redis_site;
    feature = "dynamodb": dynamo_grpc_service_killed_after_its_handlers_effect = grpc_service_killed_after_its_handlers_effect on dynamo_site;
    feature = "postgres": postgres_grpc_service_killed_mid_transaction = grpc_service_killed_mid_transaction on pg_site;
    feature = "mysql": mysql_grpc_service_killed_mid_transaction = grpc_service_killed_mid_transaction on my_site;
}
