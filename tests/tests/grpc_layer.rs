//! The gRPC layer over real gRPC: a tonic server on loopback behind `idem::grpc::GrpcLayer`, a
//! tonic client, and the handler's side effects audited in their own table (never idem's
//! counters). Lease mode and transaction mode on SQLite; a server killed mid-call is in
//! `tests/crash/`.

#[path = "support/grpc_shop.rs"]
mod grpc_shop;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use grpc_shop::{CREATE, CreateOrder, LookupOrder, Order, WATCH, client, keyed, serve};
use idem::grpc::{ERROR_DOMAIN, GrpcLayer, GrpcLayerBuilder, REPLAYED_METADATA};
use idem::grpc::{LayerTx, Principal};
use idem::sqlx::{self, SqlitePool};
use idem::{IdemError, SqliteStore, SqliteTx, Store};
use tokio::sync::Barrier;
use tonic::{Code, Request, Response, Status};
use tonic_types::StatusExt;

const USER: &str = "x-user";

/// The service: `Create` writes an order row (its key, its caller, its item) to its own table and
/// answers it; `Lookup` and `Watch` read.
#[derive(Clone)]
struct Shop {
    db: SqlitePool,
    /// Milliseconds each order takes (to hold the claim while duplicates arrive).
    slow_ms: Arc<AtomicU32>,
    /// Calls to answer UNAVAILABLE (before writing anything) before succeeding.
    fail_next: Arc<AtomicU32>,
    /// Handler runs, including those that wrote nothing.
    runs: Arc<AtomicU32>,
}

impl Shop {
    async fn new() -> Shop {
        let db = SqlitePool::connect("sqlite::memory:").await.unwrap();
        sqlx::query(
            "CREATE TABLE orders (id INTEGER PRIMARY KEY AUTOINCREMENT, k TEXT, owner TEXT, item TEXT)",
        )
        .execute(&db)
        .await
        .unwrap();
        Shop {
            db,
            slow_ms: Arc::default(),
            fail_next: Arc::default(),
            runs: Arc::default(),
        }
    }

    async fn rows(&self) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM orders")
            .fetch_one(&self.db)
            .await
            .unwrap()
    }
}

fn metadata<'a, M>(req: &'a Request<M>, name: &str) -> &'a str {
    req.metadata()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

#[tonic::async_trait]
impl grpc_shop::orders_server::Orders for Shop {
    async fn create(&self, req: Request<CreateOrder>) -> Result<Response<Order>, Status> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let slow = self.slow_ms.load(Ordering::SeqCst);
        if slow > 0 {
            tokio::time::sleep(Duration::from_millis(slow.into())).await;
        }
        if self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Status::unavailable("the warehouse is down"));
        }
        if req.get_ref().item == "nothing" {
            return Err(Status::not_found("no such item"));
        }
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO orders (k, owner, item) VALUES (?1, ?2, ?3) RETURNING id",
        )
        .bind(metadata(&req, "idempotency-key"))
        .bind(metadata(&req, USER))
        .bind(&req.get_ref().item)
        .fetch_one(&self.db)
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
        let mut response = Response::new(Order {
            id,
            item: req.get_ref().item.clone(),
            by: metadata(&req, USER).to_owned(),
        });
        response
            .metadata_mut()
            .insert("x-order-id", id.to_string().parse().unwrap());
        Ok(response)
    }

    async fn lookup(&self, req: Request<LookupOrder>) -> Result<Response<Order>, Status> {
        let item: Option<String> = sqlx::query_scalar("SELECT item FROM orders WHERE id = ?1")
            .bind(req.get_ref().id)
            .fetch_optional(&self.db)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let item = item.ok_or_else(|| Status::not_found("no such order"))?;
        Ok(Response::new(Order {
            id: req.get_ref().id,
            item,
            by: String::new(),
        }))
    }

    async fn watch(
        &self,
        req: Request<tonic::Streaming<LookupOrder>>,
    ) -> Result<Response<Order>, Status> {
        let mut stream = req.into_inner();
        let mut seen = 0;
        while stream.message().await?.is_some() {
            seen += 1;
        }
        Ok(Response::new(Order {
            id: seen,
            item: "watched".to_owned(),
            by: String::new(),
        }))
    }
}

async fn sqlite_store() -> (SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    store.migrate().await.unwrap();
    (store, dir)
}

fn layer(store: &SqliteStore) -> GrpcLayerBuilder {
    GrpcLayer::builder(store.clone())
        .method(CREATE)
        .principal(Principal::header(http::HeaderName::from_static(USER)))
}

fn as_user<M>(mut req: Request<M>, user: &str) -> Request<M> {
    req.metadata_mut().insert(USER, user.parse().unwrap());
    req
}

fn order(item: &str) -> CreateOrder {
    CreateOrder {
        item: item.to_owned(),
        qty: 1,
        request_id: String::new(),
    }
}

fn replayed<M>(response: &Response<M>) -> bool {
    response
        .metadata()
        .get(REPLAYED_METADATA)
        .is_some_and(|v| v == "true")
}

/// The `ErrorInfo` reason of a status the layer answered, checking its domain.
fn reason(status: &Status) -> String {
    let info = status
        .get_details_error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
    assert_eq!(info.domain, ERROR_DOMAIN);
    info.reason
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_duplicates_run_the_handler_once_and_63_replay_it() {
    let (store, _dir) = sqlite_store().await;
    let shop = Shop::new().await;
    shop.slow_ms.store(300, Ordering::SeqCst);
    let layer = layer(&store).wait(Duration::from_secs(20)).build().unwrap();
    let addr = serve(layer, shop.clone()).await;
    let client = client(addr).await;
    let barrier = Arc::new(Barrier::new(64));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (mut client, barrier) = (client.clone(), barrier.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            client
                .create(as_user(keyed(order("tv"), "order-64"), "alice"))
                .await
        });
    }
    let answers = tasks.join_all().await;
    let mut firsts = 0;
    let mut orders = Vec::new();
    for answer in answers {
        let response = answer.expect("every duplicate gets the order");
        firsts += usize::from(!replayed(&response));
        assert_eq!(
            response.metadata().get("x-order-id").unwrap(),
            "1",
            "metadata replayed"
        );
        orders.push(response.into_inner());
    }
    assert_eq!(firsts, 1, "one first answer, 63 replays");
    assert!(orders.iter().all(|o| *o == orders[0]), "{orders:?}");
    assert_eq!(orders[0].by, "alice");
    assert_eq!(shop.rows().await, 1, "one order written");
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1, "one handler run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_while_the_first_runs_is_aborted_with_retry_info() {
    let (store, _dir) = sqlite_store().await;
    let shop = Shop::new().await;
    shop.slow_ms.store(800, Ordering::SeqCst);
    let addr = serve(layer(&store).build().unwrap(), shop.clone()).await;
    let mut client = client(addr).await;
    let first = {
        let mut client = client.clone();
        tokio::spawn(async move {
            client
                .create(as_user(keyed(order("tv"), "busy"), "alice"))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = client
        .create(as_user(keyed(order("tv"), "busy"), "alice"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(reason(&status), "IN_PROGRESS");
    let delay = status
        .get_details_retry_info()
        .unwrap()
        .retry_delay
        .unwrap();
    assert!(
        delay >= Duration::from_secs(1) && delay <= Duration::from_secs(30),
        "{delay:?}"
    );
    let first = first.await.unwrap().unwrap();
    assert!(!replayed(&first));
    let again = client
        .create(as_user(keyed(order("tv"), "busy"), "alice"))
        .await
        .unwrap();
    assert!(replayed(&again));
    assert_eq!(again.into_inner(), first.into_inner());
    assert_eq!(shop.rows().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_with_another_message_is_refused() {
    let (store, _dir) = sqlite_store().await;
    let shop = Shop::new().await;
    let addr = serve(layer(&store).build().unwrap(), shop.clone()).await;
    let mut client = client(addr).await;
    client
        .create(as_user(keyed(order("tv"), "k1"), "alice"))
        .await
        .unwrap();
    let status = client
        .create(as_user(keyed(order("radio"), "k1"), "alice"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(reason(&status), "PAYLOAD_MISMATCH");
    assert_eq!(shop.rows().await, 1, "the second message did not run");
    // Another caller with the same key runs its own call: keys are per caller.
    let bob = client
        .create(as_user(keyed(order("radio"), "k1"), "bob"))
        .await
        .unwrap();
    assert!(!replayed(&bob));
    assert_eq!(bob.into_inner().by, "bob");
    assert_eq!(shop.rows().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_read_from_the_message_dedups_calls_without_the_entry() {
    use prost::Message;
    let (store, _dir) = sqlite_store().await;
    let shop = Shop::new().await;
    let layer = layer(&store)
        .key_from(|_, message| CreateOrder::decode(message).ok().map(|m| m.request_id))
        .max_key_len(16)
        .build()
        .unwrap();
    let addr = serve(layer, shop.clone()).await;
    let mut client = client(addr).await;
    let with_id = |id: &str| CreateOrder {
        request_id: id.to_owned(),
        ..order("tv")
    };
    let first = client
        .create(as_user(Request::new(with_id("r-1")), "alice"))
        .await
        .unwrap();
    let again = client
        .create(as_user(Request::new(with_id("r-1")), "alice"))
        .await
        .unwrap();
    assert!(!replayed(&first) && replayed(&again));
    assert_eq!(shop.rows().await, 1);
    // The entry wins over the message's id; an empty id is no key; a long one is refused.
    let entry = client
        .create(as_user(keyed(with_id("r-1"), "other"), "alice"))
        .await
        .unwrap();
    assert!(!replayed(&entry));
    assert_eq!(shop.rows().await, 2);
    let status = client
        .create(as_user(Request::new(with_id("")), "alice"))
        .await
        .unwrap_err();
    assert_eq!(reason(&status), "MISSING_KEY");
    let status = client
        .create(as_user(Request::new(with_id(&"r".repeat(17))), "alice"))
        .await
        .unwrap_err();
    assert_eq!(reason(&status), "INVALID_KEY");
    assert_eq!(shop.rows().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fingerprinted_metadata_is_part_of_the_call() {
    let (store, _dir) = sqlite_store().await;
    let shop = Shop::new().await;
    let layer = layer(&store)
        .fingerprint_metadata("x-api-version")
        .build()
        .unwrap();
    let addr = serve(layer, shop.clone()).await;
    let mut client = client(addr).await;
    let versioned = |v: &str| {
        let mut req = as_user(keyed(order("tv"), "k-version"), "alice");
        req.metadata_mut()
            .insert("x-api-version", v.parse().unwrap());
        req
    };
    client.create(versioned("1")).await.unwrap();
    assert!(replayed(&client.create(versioned("1")).await.unwrap()));
    let status = client.create(versioned("2")).await.unwrap_err();
    assert_eq!(reason(&status), "PAYLOAD_MISMATCH");
    assert_eq!(shop.rows().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_before_the_claim_run_nothing() {
    let (store, _dir) = sqlite_store().await;
    let shop = Shop::new().await;
    let layer = layer(&store).max_request_bytes(64).build().unwrap();
    let addr = serve(layer, shop.clone()).await;
    let mut client = client(addr).await;

    let status = client
        .create(as_user(Request::new(order("tv")), "alice"))
        .await
        .unwrap_err();
    assert_eq!(
        (status.code(), reason(&status)),
        (Code::InvalidArgument, "MISSING_KEY".into())
    );

    let mut twice = as_user(keyed(order("tv"), "a"), "alice");
    twice
        .metadata_mut()
        .append("idempotency-key", "b".parse().unwrap());
    let status = client.create(twice).await.unwrap_err();
    assert_eq!(
        (status.code(), reason(&status)),
        (Code::InvalidArgument, "INVALID_KEY".into())
    );
    assert!(status.message().contains("2"), "{status:?}");

    let long = "k".repeat(256);
    let status = client
        .create(as_user(keyed(order("tv"), &long), "alice"))
        .await
        .unwrap_err();
    assert_eq!(
        (status.code(), reason(&status)),
        (Code::InvalidArgument, "INVALID_KEY".into())
    );

    let status = client
        .create(keyed(order("tv"), "no-caller"))
        .await
        .unwrap_err();
    assert_eq!(
        (status.code(), reason(&status)),
        (Code::Unauthenticated, "NO_PRINCIPAL".into())
    );

    let status = client
        .create(as_user(keyed(order(&"x".repeat(100)), "big"), "alice"))
        .await
        .unwrap_err();
    assert_eq!(
        (status.code(), reason(&status)),
        (Code::ResourceExhausted, "REQUEST_TOO_LARGE".into())
    );
    assert_eq!(shop.runs.load(Ordering::SeqCst), 0, "no handler ran");
    assert_eq!(shop.rows().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_that_says_try_again_is_not_stored() {
    let (store, _dir) = sqlite_store().await;
    let shop = Shop::new().await;
    shop.fail_next.store(1, Ordering::SeqCst);
    let addr = serve(layer(&store).build().unwrap(), shop.clone()).await;
    let mut client = client(addr).await;
    let status = client
        .create(as_user(keyed(order("tv"), "flaky"), "alice"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.message(),
        "the warehouse is down",
        "the handler's own status"
    );
    let retry = client
        .create(as_user(keyed(order("tv"), "flaky"), "alice"))
        .await
        .unwrap();
    assert!(!replayed(&retry), "the retry ran the handler");
    assert_eq!(shop.runs.load(Ordering::SeqCst), 2);
    let again = client
        .create(as_user(keyed(order("tv"), "flaky"), "alice"))
        .await
        .unwrap();
    assert!(replayed(&again));
    assert_eq!(shop.rows().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_error_status_is_replayed() {
    let (store, _dir) = sqlite_store().await;
    let shop = Shop::new().await;
    let addr = serve(layer(&store).build().unwrap(), shop.clone()).await;
    let mut client = client(addr).await;
    let first = client
        .create(as_user(keyed(order("nothing"), "nf"), "alice"))
        .await
        .unwrap_err();
    assert_eq!(first.code(), Code::NotFound);
    assert!(first.metadata().get(REPLAYED_METADATA).is_none());
    let again = client
        .create(as_user(keyed(order("nothing"), "nf"), "alice"))
        .await
        .unwrap_err();
    assert_eq!(
        (again.code(), again.message()),
        (Code::NotFound, "no such item")
    );
    assert_eq!(again.metadata().get(REPLAYED_METADATA).unwrap(), "true");
    assert_eq!(
        shop.runs.load(Ordering::SeqCst),
        1,
        "NOT_FOUND is stored by default"
    );

    // A policy that stores OK only runs it again.
    let (store, _dir) = sqlite_store().await;
    let layer = layer(&store)
        .store_if(|code| code == Code::Ok)
        .build()
        .unwrap();
    let addr = serve(layer, shop.clone()).await;
    let mut client = grpc_shop::client(addr).await;
    for _ in 0..2 {
        let status = client
            .create(as_user(keyed(order("nothing"), "nf"), "alice"))
            .await
            .unwrap_err();
        assert!(status.metadata().get(REPLAYED_METADATA).is_none());
    }
    assert_eq!(shop.runs.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_limit_reaches_its_client_and_is_not_run_again() {
    let (store, _dir) = sqlite_store().await;
    let shop = Shop::new().await;
    let layer = layer(&store).max_response_bytes(16).build().unwrap();
    let addr = serve(layer, shop.clone()).await;
    let mut client = client(addr).await;
    let item = "a long item name";
    let first = client
        .create(as_user(keyed(order(item), "big-answer"), "alice"))
        .await
        .unwrap();
    assert_eq!(first.into_inner().item, item);
    let status = client
        .create(as_user(keyed(order(item), "big-answer"), "alice"))
        .await
        .unwrap_err();
    assert_eq!(
        (status.code(), reason(&status)),
        (Code::AlreadyExists, "RESPONSE_NOT_KEPT".into())
    );
    assert_eq!(shop.rows().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_not_named_pass_through_and_streams_are_not_unary() {
    let (store, _dir) = sqlite_store().await;
    let shop = Shop::new().await;
    let addr = serve(layer(&store).build().unwrap(), shop.clone()).await;
    let mut client = client(addr).await;
    let created = client
        .create(as_user(keyed(order("tv"), "k"), "alice"))
        .await
        .unwrap()
        .into_inner();
    // A read without a key or a caller: not covered, so the layer is not in its way.
    let found = client.lookup(LookupOrder { id: created.id }).await.unwrap();
    assert_eq!(found.into_inner().item, "tv");
    let two = futures_util::stream::iter(vec![LookupOrder { id: 1 }, LookupOrder { id: 2 }]);
    assert_eq!(client.watch(two).await.unwrap().into_inner().id, 2);

    // A client-streaming method put on the list is refused when its request is not one message.
    let (store, _dir) = sqlite_store().await;
    let layer = layer(&store).method(WATCH).build().unwrap();
    let addr = serve(layer, shop.clone()).await;
    let mut client = grpc_shop::client(addr).await;
    let two = futures_util::stream::iter(vec![LookupOrder { id: 1 }, LookupOrder { id: 2 }]);
    let mut req = as_user(Request::new(two), "alice");
    req.metadata_mut()
        .insert("idempotency-key", "w".parse().unwrap());
    let status = client.watch(req).await.unwrap_err();
    assert_eq!(
        (status.code(), reason(&status)),
        (Code::InvalidArgument, "NOT_UNARY".into())
    );
    assert!(status.message().contains("2 messages"), "{status:?}");
}

#[tokio::test]
async fn build_refuses_what_cannot_work() {
    let store = Arc::new(idem::MemoryStore::new());
    let principal = || Principal::unscoped("one caller");
    let refused = |builder: GrpcLayerBuilder, needle: &str| match builder.build() {
        Err(IdemError::InvalidOptions { reason }) => {
            assert!(reason.contains(needle), "{reason:?} lacks {needle:?}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("built; expected a refusal naming {needle:?}"),
    };
    refused(
        GrpcLayer::builder(store.clone()).principal(principal()),
        "covers no method",
    );
    for path in [
        "shop.Orders/Create",
        "/shop.Orders",
        "/shop.Orders/",
        "//Create",
        "/a/b/c",
    ] {
        refused(
            GrpcLayer::builder(store.clone())
                .principal(principal())
                .method(path),
            "/package.Service/Method",
        );
    }
    refused(
        GrpcLayer::builder(store.clone()).method(CREATE),
        "principal",
    );
    // A layer that covers a method for a caller, and one setting out of range.
    let covered = || {
        GrpcLayer::builder(store.clone())
            .principal(principal())
            .method(CREATE)
    };
    refused(covered().fingerprint_metadata("Not A Key"), "metadata key");
    refused(covered().fingerprint_metadata("trace-bin"), "-bin");
    refused(covered().lease(Duration::ZERO), "lease");
    refused(covered().max_key_len(0), "above zero");
    refused(
        covered().cap_per_principal(0, Duration::from_secs(1)),
        "cap of 0",
    );
    let recovering = async |_: idem::grpc::GrpcRecoverRequest| Ok(None);
    let (sqlite, _dir) = sqlite_store().await;
    refused(
        GrpcLayer::builder_tx(sqlite)
            .principal(principal())
            .method(CREATE)
            .recover(recovering),
        "lease mode",
    );
    assert!(
        GrpcLayer::builder(store)
            .principal(principal())
            .methods([CREATE, WATCH, CREATE])
            .build()
            .is_ok()
    );
}

/// Transaction mode: `Create` inserts its order through the layer's transaction, in the store's
/// own database, and answers UNAVAILABLE after the insert when told to (its write must roll back).
#[derive(Clone)]
struct TxShop {
    fail_after_insert: Arc<AtomicU32>,
    runs: Arc<AtomicU32>,
}

#[tonic::async_trait]
impl grpc_shop::orders_server::Orders for TxShop {
    async fn create(&self, req: Request<CreateOrder>) -> Result<Response<Order>, Status> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let mut tx = LayerTx::<SqliteTx>::from_grpc(&req).await?;
        let id: i64 =
            sqlx::query_scalar("INSERT INTO orders (k, item) VALUES (?1, ?2) RETURNING id")
                .bind(metadata(&req, "idempotency-key"))
                .bind(&req.get_ref().item)
                .fetch_one(tx.conn())
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
        drop(tx);
        if self
            .fail_after_insert
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Status::unavailable("the warehouse is down"));
        }
        Ok(Response::new(Order {
            id,
            item: req.get_ref().item.clone(),
            by: String::new(),
        }))
    }

    async fn lookup(&self, req: Request<LookupOrder>) -> Result<Response<Order>, Status> {
        // A handler that takes the transaction on a method no layer covers.
        LayerTx::<SqliteTx>::from_grpc(&req).await?;
        unreachable!("no transaction on an uncovered method")
    }

    async fn watch(
        &self,
        _: Request<tonic::Streaming<LookupOrder>>,
    ) -> Result<Response<Order>, Status> {
        Err(Status::unimplemented("not here"))
    }
}

async fn tx_site() -> (SqliteStore, tempfile::TempDir, TxShop) {
    let (store, dir) = sqlite_store().await;
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY AUTOINCREMENT, k TEXT, item TEXT)")
        .execute(store.pool())
        .await
        .unwrap();
    let shop = TxShop {
        fail_after_insert: Arc::default(),
        runs: Arc::default(),
    };
    (store, dir, shop)
}

async fn orders_in(store: &SqliteStore) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM orders")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transaction_mode_commits_one_order_for_64_duplicates() {
    let (store, _dir, shop) = tx_site().await;
    let layer = GrpcLayer::builder_tx(store.clone())
        .method(CREATE)
        .principal(Principal::unscoped("one caller in this test"))
        .build()
        .unwrap();
    let addr = serve(layer, shop.clone()).await;
    let client = client(addr).await;
    let barrier = Arc::new(Barrier::new(64));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (mut client, barrier) = (client.clone(), barrier.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            client.create(keyed(order("tv"), "tx-64")).await
        });
    }
    let mut firsts = 0;
    let mut ids = Vec::new();
    for answer in tasks.join_all().await {
        let response = answer.expect("every duplicate gets the order");
        firsts += usize::from(!replayed(&response));
        ids.push(response.into_inner().id);
    }
    assert_eq!(firsts, 1);
    assert!(ids.iter().all(|id| *id == ids[0]));
    assert_eq!(orders_in(&store).await, 1, "one order committed");
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_mode_rolls_back_a_status_it_does_not_store() {
    let (store, _dir, shop) = tx_site().await;
    shop.fail_after_insert.store(1, Ordering::SeqCst);
    let layer = GrpcLayer::builder_tx(store.clone())
        .method(CREATE)
        .principal(Principal::unscoped("one caller in this test"))
        .build()
        .unwrap();
    let addr = serve(layer, shop.clone()).await;
    let mut client = client(addr).await;
    let status = client
        .create(keyed(order("tv"), "tx-fail"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        orders_in(&store).await,
        0,
        "the insert rolled back with the status"
    );
    let record = idem::key::http_record_key(None, "tx-fail").unwrap();
    assert!(
        store.load("GRPC", &record).await.unwrap().is_none(),
        "no record either"
    );
    let retry = client.create(keyed(order("tv"), "tx-fail")).await.unwrap();
    assert!(!replayed(&retry), "the retry runs at once");
    assert_eq!(orders_in(&store).await, 1);
    let again = client.create(keyed(order("tv"), "tx-fail")).await.unwrap();
    assert!(replayed(&again));
    assert_eq!(orders_in(&store).await, 1);

    // The transaction asked for on a method the layer does not cover: INTERNAL, named.
    let status = client.lookup(LookupOrder { id: 1 }).await.unwrap_err();
    assert_eq!(
        (status.code(), reason(&status)),
        (Code::Internal, "LAYER_MISCONFIGURED".into())
    );
    assert!(status.message().contains("GrpcLayer"), "{status:?}");
}
