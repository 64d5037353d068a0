//! Repeats: the stored response replayed, records found by caller and key and by route, a late
//! repeat, concurrent duplicates.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_repeat_gets_the_stored_response_and_runs_nothing() {
    let shop = Shop::new().await;
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let api = Api::new(&url);
    let order = json!({ "item": "book" });

    let first = api
        .post(Some("alice"), Some("\"k-1\""), order.clone())
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    let again = api
        .post(Some("alice"), Some("\"k-1\""), order.clone())
        .await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(again.headers["location"], first.headers["location"]);
    assert_eq!(again.headers["content-type"], "application/json");
    assert!(
        again.headers.get("set-cookie").is_none(),
        "cookies are never replayed"
    );
    // A bare key is the same key as its structured-field string.
    let bare = api.post(Some("alice"), Some("k-1"), order).await;
    assert!(bare.replayed());
    assert_eq!(shop.rows().await, 1);
}

/// An operator finds a request's record from what the client knows: its caller and the key it
/// sent (the store holds only a hash of both).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_layer_record_is_found_by_its_caller_and_key() {
    let shop = Shop::new().await;
    let store = store().await;
    let api = Api::new(&start(&shop, builder(&store).build().unwrap()).await);
    let sent = api
        .post(
            Some("alice"),
            Some("\"order-77\""),
            json!({ "item": "desk" }),
        )
        .await;
    assert_eq!(sent.status, StatusCode::CREATED);
    for key in ["\"order-77\"", "order-77"] {
        let found = idem::admin::inspect_http(&store, "HTTP", Some("alice"), key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{key}: alice's record"));
        assert_eq!(found.status, idem::store::Status::Succeeded);
        assert_eq!(
            found.key,
            idem::key::http_record_key(Some("alice"), key).unwrap()
        );
        assert_eq!(
            found.origin(),
            Some("POST /orders"),
            "the route it came from"
        );
    }
    let other = idem::admin::inspect_http(&store, "HTTP", Some("bob"), "order-77")
        .await
        .unwrap();
    assert!(other.is_none(), "another caller's key is another record");
    assert!(matches!(
        idem::admin::inspect_http(&store, "HTTP", Some("alice"), "two words").await,
        Err(IdemError::InvalidKey { .. })
    ));
}

/// A layer record says which route it came from: axum's route template, not the path with its
/// ids, and a repeat to that route still replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_layer_record_keeps_its_method_and_route_template() {
    let store = store().await;
    let app = Router::new()
        .route(
            "/orders/{id}/pay",
            post(|| async { (StatusCode::CREATED, "paid") }),
        )
        .layer(builder(&store).build().unwrap());
    let base = serve(app).await;
    let client = reqwest::Client::new();
    let pay = || {
        client
            .post(format!("{base}/orders/7/pay"))
            .header(USER, "alice")
            .header("idempotency-key", "\"pay-7\"")
            .send()
    };
    let first = pay().await.unwrap();
    assert_eq!(first.status().as_u16(), 201);
    let record = idem::admin::inspect_http(&store, "HTTP", Some("alice"), "pay-7")
        .await
        .unwrap()
        .expect("alice's record");
    assert_eq!(record.origin(), Some("POST /orders/{id}/pay"));
    let again = pay().await.unwrap();
    assert_eq!(again.status().as_u16(), 201);
    assert!(
        again.headers().contains_key("idempotent-replayed"),
        "{:?}",
        again.headers()
    );
}

/// A response kept a moment while its key stays used: the repeat within it replays, a late one
/// is `410 Gone` with its own problem type, and neither runs the handler; another body under the
/// key is still a mismatch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_repeat_after_the_response_was_dropped_is_gone_and_runs_nothing() {
    let shop = Shop::new().await;
    let clock = idem::TestClock::new();
    let store = store().await.with_test_clock(clock.clone());
    let layer = builder(&store)
        .ttl(Duration::from_secs(30 * 24 * 3600))
        .result_ttl(Duration::from_secs(24 * 3600))
        .build()
        .unwrap();
    let api = Api::new(&start(&shop, layer).await);
    let order = json!({ "item": "lamp" });
    let first = api.post(Some("alice"), Some("late-1"), order.clone()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    clock.advance(Duration::from_secs(23 * 3600));
    let again = api.post(Some("alice"), Some("late-1"), order.clone()).await;
    assert!(again.replayed() && again.body == first.body);
    clock.advance(Duration::from_secs(2 * 3600));
    let late = api.post(Some("alice"), Some("late-1"), order).await;
    assert_eq!(late.status, StatusCode::GONE, "{:?}", late.body);
    assert_eq!(late.problem(), "urn:idem:problem:result-expired");
    assert!(late.headers.get("retry-after").is_none());
    let other = api
        .post(Some("alice"), Some("late-1"), json!({ "item": "sofa" }))
        .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(shop.rows().await, 1, "the handler ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_duplicates_run_once() {
    let shop = Shop::new().await;
    shop.slow_ms.store(300, Ordering::SeqCst);
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let api = Api::new(&url);
    let mut created = Vec::new();
    let mut in_progress = 0;
    for reply in api.released_together(64, "storm").await {
        match reply.status {
            StatusCode::CREATED => created.push(reply.body["order_id"].as_i64().unwrap()),
            StatusCode::CONFLICT => {
                assert_eq!(reply.problem(), "urn:idem:problem:in-progress");
                let after: u64 = reply.headers["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!((1..=30).contains(&after), "{after}");
                in_progress += 1;
            }
            other => panic!("unexpected {other}: {:?}", reply.body),
        }
    }
    assert_eq!(shop.rows().await, 1, "64 duplicates, one order");
    assert!(!created.is_empty());
    assert!(created.iter().all(|id| *id == created[0]));
    assert_eq!(created.len() + in_progress, 64);
    // Once it finished, every repeat is a replay of that one order.
    let after = api
        .post(Some("alice"), Some("storm"), json!({ "item": "tv" }))
        .await;
    assert!(after.replayed());
    assert_eq!(after.body["order_id"].as_i64().unwrap(), created[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_problems_with_the_documented_statuses() {
    let shop = Shop::new().await;
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let api = Api::new(&url);
    let order = json!({ "item": "pen" });

    let missing = api.post(Some("alice"), None, order.clone()).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.problem(), "urn:idem:problem:missing-key");

    for bad in ["\"open", "two words", &"k".repeat(256)] {
        let reply = api.post(Some("alice"), Some(bad), order.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(reply.problem(), "urn:idem:problem:invalid-key");
    }

    let nobody = api.post(None, Some("k"), order.clone()).await;
    assert_eq!(nobody.status, StatusCode::UNAUTHORIZED);
    assert_eq!(nobody.problem(), "urn:idem:problem:no-principal");

    let first = api.post(Some("alice"), Some("k"), order).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let other = api
        .post(Some("alice"), Some("k"), json!({ "item": "ink" }))
        .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.problem(), "urn:idem:problem:payload-mismatch");
    assert_eq!(other.body["status"], 422);

    // Methods the layer does not cover pass through untouched, without a key.
    let list = api
        .client
        .get(format!("{url}/orders"))
        .send()
        .await
        .unwrap();
    assert_eq!(list.status().as_u16(), 200);
    assert_eq!(list.text().await.unwrap(), "list");

    let huge = api
        .client
        .post(format!("{url}/orders"))
        .header(USER, "alice")
        .header("idempotency-key", "huge")
        .body(vec![b' '; (1 << 20) + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(huge.status().as_u16(), 413);
    assert_eq!(shop.rows().await, 1, "only the first order ran");
}
