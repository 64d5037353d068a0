//! A handler that died: recovered, not run again; a recover that cannot tell; draining handlers
//! whose clients left.

use super::*;

/// A handler that dies after writing its order (the process killed between the effect and the
/// mark; here the handler's task panics, which leaves the claim PROCESSING the same way). After
/// the lease, a retry with `recover` gets the order that was written, and the handler does not run
/// again; without `recover`, the documented behaviour of lease mode alone: it runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_died_after_its_effect_is_recovered_not_run_again() {
    // Long enough that the request after the death is still inside it on a loaded machine (a
    // 300 ms lease was once over before that request arrived, and it was taken over at once).
    const LEASE: Duration = Duration::from_secs(2);
    for with_recover in [true, false] {
        let shop = Shop::new().await;
        let db = shop.db.clone();
        let mut layer = builder(&store().await).lease(LEASE);
        if with_recover {
            layer = layer.recover(move |req: idem::http::RecoverRequest| {
                let db = db.clone();
                async move {
                    let body: Value = serde_json::from_slice(&req.body)?;
                    let owner = req.principal.unwrap_or_default();
                    Ok(order_of(&db, &owner, body["item"].as_str().unwrap_or("")).await)
                }
            });
        }
        let url = start(&shop, layer.build().unwrap()).await;
        let api = Api::new(&url);
        shop.die_next.store(1, Ordering::SeqCst);
        let died = api
            .client
            .post(format!("{url}/orders"))
            .header(USER, "alice")
            .header("idempotency-key", "crash-1")
            .json(&json!({ "item": "lamp" }))
            .send()
            .await;
        assert!(
            died.is_err(),
            "the connection died with the handler: {died:?}"
        );
        assert_eq!(shop.rows().await, 1, "its order was written");
        let early = api
            .post(Some("alice"), Some("crash-1"), json!({ "item": "lamp" }))
            .await;
        assert_eq!(
            early.status,
            StatusCode::CONFLICT,
            "within the lease: in progress"
        );
        tokio::time::sleep(LEASE + Duration::from_millis(200)).await;
        let retry = api
            .post(Some("alice"), Some("crash-1"), json!({ "item": "lamp" }))
            .await;
        assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
        if with_recover {
            assert_eq!(retry.body["order_id"], 1, "the order that was written");
            assert!(retry.replayed(), "the first request's answer");
            assert_eq!(shop.rows().await, 1, "no second order");
        } else {
            assert_eq!(retry.body["order_id"], 2, "without recover it runs again");
            assert_eq!(shop.rows().await, 2);
        }
        let again = api
            .post(Some("alice"), Some("crash-1"), json!({ "item": "lamp" }))
            .await;
        assert!(again.replayed());
        assert_eq!(again.body["order_id"], retry.body["order_id"]);
    }
}

/// A recover fn that cannot tell (its database is down) answers 503 `recover-failed` with
/// Retry-After and runs nothing; once it can tell, the next retry is recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recover_that_cannot_tell_answers_503_and_runs_nothing() {
    let shop = Shop::new().await;
    let db = shop.db.clone();
    let down = Arc::new(AtomicU32::new(1));
    let layer = {
        let down = down.clone();
        builder(&store().await)
            .lease(Duration::from_millis(300))
            .recover(move |req: idem::http::RecoverRequest| {
                let (db, down) = (db.clone(), down.clone());
                async move {
                    if down.load(Ordering::SeqCst) == 1 {
                        return Err("the orders database does not answer".into());
                    }
                    let body: Value = serde_json::from_slice(&req.body)?;
                    let owner = req.principal.unwrap_or_default();
                    Ok(order_of(&db, &owner, body["item"].as_str().unwrap_or("")).await)
                }
            })
            .build()
            .unwrap()
    };
    let url = start(&shop, layer).await;
    let api = Api::new(&url);
    shop.die_next.store(1, Ordering::SeqCst);
    let died = api
        .client
        .post(format!("{url}/orders"))
        .header(USER, "alice")
        .header("idempotency-key", "crash-2")
        .json(&json!({ "item": "desk" }))
        .send()
        .await;
    assert!(died.is_err());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let refused = api
        .post(Some("alice"), Some("crash-2"), json!({ "item": "desk" }))
        .await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        refused.problem().ends_with("recover-failed"),
        "{:?}",
        refused.body
    );
    assert!(refused.headers.contains_key("retry-after"));
    assert_eq!(shop.rows().await, 1, "nothing ran");
    down.store(0, Ordering::SeqCst);
    let retry = api
        .post(Some("alice"), Some("crash-2"), json!({ "item": "desk" }))
        .await;
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
    assert_eq!(retry.body["order_id"], 1);
    assert_eq!(shop.rows().await, 1);
}

/// At shutdown, `drain().wait(deadline)` waits for the handlers the layer runs on their own tasks,
/// also those whose client went away, so their responses are stored before the process ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waits_for_handlers_whose_clients_left() {
    let shop = Shop::new().await;
    shop.slow_ms.store(600, Ordering::SeqCst);
    let store = store().await;
    let layer = builder(&store).build().unwrap();
    let drain = layer.drain();
    let url = start(&shop, layer).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let gave_up = impatient
        .post(format!("{url}/orders"))
        .header(USER, "alice")
        .header("idempotency-key", "drain-1")
        .json(&json!({ "item": "chair" }))
        .send()
        .await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()));
    assert_eq!(drain.running(), 1, "the handler still runs");
    assert_eq!(drain.wait(Duration::from_millis(10)).await, Err(1));
    assert_eq!(drain.wait(Duration::from_secs(10)).await, Ok(()));
    assert_eq!(drain.running(), 0);
    assert_eq!(shop.rows().await, 1);
    assert_eq!(records(&store).await, 1, "its response was stored");
    let retry = Api::new(&url)
        .post(Some("alice"), Some("drain-1"), json!({ "item": "chair" }))
        .await;
    assert!(retry.replayed());
}
