//! What each request is answered: refusals, in-progress repeats, waiting, what is stored and
//! what is not, the fingerprint, Retry-After, start-up checks, caller scoping and caps, submit
//! tokens issued to a caller and spent once.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_while_the_first_runs_is_told_to_retry_later() {
    let shop = Shop::new().await;
    shop.slow_ms.store(1500, Ordering::SeqCst);
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let (first, repeat) = Api::new(&url)
        .overlapping("slow", "car", Duration::from_millis(300))
        .await;
    assert_eq!(repeat.status, StatusCode::CONFLICT);
    assert_eq!(repeat.problem(), "urn:idem:problem:in-progress");
    assert!(repeat.headers.contains_key("retry-after"));
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(shop.rows().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_a_repeat_gets_the_first_response_when_it_is_ready() {
    let shop = Shop::new().await;
    shop.slow_ms.store(800, Ordering::SeqCst);
    let layer = builder(&store().await)
        .wait(Duration::from_secs(5))
        .heartbeat(Duration::from_secs(5))
        .build()
        .unwrap();
    let url = start(&shop, layer).await;
    let (first, repeat) = Api::new(&url)
        .overlapping("w", "bike", Duration::from_millis(200))
        .await;
    assert_eq!(repeat.status, StatusCode::CREATED, "{:?}", repeat.body);
    assert!(repeat.replayed());
    assert_eq!(repeat.body, first.body);
    assert_eq!(shop.rows().await, 1);
    let err = builder(&store().await)
        .heartbeat(Duration::from_secs(60))
        .build()
        .err()
        .unwrap();
    assert!(err.to_string().contains("heartbeat"), "{err}");
}

/// A gateway that gives up on a slow request that then succeeds, and retries. The handler
/// is not cancelled with the first connection, so the retry replays its response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_client_timeout_gets_the_response_of_the_run_it_gave_up_on() {
    let shop = Shop::new().await;
    shop.slow_ms.store(600, Ordering::SeqCst);
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(150))
        .build()
        .unwrap();
    let gave_up = impatient
        .post(format!("{url}/orders"))
        .header(USER, "alice")
        .header("idempotency-key", "gw-1")
        .json(&json!({ "item": "sofa" }))
        .send()
        .await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()));
    shop.slow_ms.store(0, Ordering::SeqCst);
    let api = Api::new(&url);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let retry = loop {
        let reply = api
            .post(Some("alice"), Some("gw-1"), json!({ "item": "sofa" }))
            .await;
        if reply.status != StatusCode::CONFLICT || tokio::time::Instant::now() > deadline {
            break reply;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
    assert!(retry.replayed(), "the first run finished and was stored");
    assert_eq!(shop.rows().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_not_stored_and_large_responses_are_not_replayed() {
    let shop = Shop::new().await;
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let api = Api::new(&url);

    shop.fail_next.store(1, Ordering::SeqCst);
    let failed = api
        .post(Some("alice"), Some("retry-me"), json!({ "item": "a" }))
        .await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    let retried = api
        .post(Some("alice"), Some("retry-me"), json!({ "item": "a" }))
        .await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed(), "a 5xx is not stored: the retry runs");
    assert_eq!(shop.rows().await, 1);

    let big = api
        .post(Some("alice"), Some("big"), json!({ "item": "big" }))
        .await;
    assert_eq!(big.status, StatusCode::CREATED);
    assert_eq!(
        big.body["item"].as_str().unwrap().len(),
        4096,
        "its own client gets all of it"
    );
    let repeat = api
        .post(Some("alice"), Some("big"), json!({ "item": "big" }))
        .await;
    assert_eq!(repeat.status, StatusCode::CONFLICT);
    assert_eq!(repeat.problem(), "urn:idem:problem:response-not-kept");
    assert!(!repeat.headers.contains_key("retry-after"));
    assert_eq!(shop.rows().await, 2, "the large order ran once");
}

/// A refusal the client can fix (415 for a wrong `Content-Type`, 400 for JSON that does not
/// parse) is not stored: the same key sent again, fixed, runs the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_the_client_can_fix_is_not_stored() {
    let shop = Shop::new().await;
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let api = Api::new(&url);
    let order = r#"{"item":"pen"}"#;
    let wrong_type = api.post_raw("fix-me", "text/plain", order, &[]).await;
    assert_eq!(wrong_type.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let malformed = api
        .post_raw("fix-me", "application/json", r#"{"item":"#, &[])
        .await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    assert!(!malformed.replayed(), "the 415 was not kept");
    let fixed = api.post_raw("fix-me", "application/json", order, &[]).await;
    assert_eq!(fixed.status, StatusCode::CREATED, "{:?}", fixed.body);
    assert!(!fixed.replayed(), "the 400 was not kept: the handler ran");
    let again = api.post_raw("fix-me", "application/json", order, &[]).await;
    assert!(again.replayed());
    assert_eq!(again.body["order_id"], fixed.body["order_id"]);
    assert_eq!(shop.rows().await, 1);
}

/// The same JSON with members in another order and other spacing is the same request (canonical
/// JSON in the fingerprint); byte for byte on request. The `Content-Type` and any header named
/// with `fingerprint_header` count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fingerprint_reads_json_canonically_and_counts_the_content_type() {
    let shop = Shop::new().await;
    let layer = builder(&store().await)
        .fingerprint_header(HeaderName::from_static("api-version"))
        .build()
        .unwrap();
    let api = Api::new(&start(&shop, layer).await);
    let v1 = [("api-version", "1")];
    let first = api
        .post_raw(
            "json",
            "application/json",
            r#"{"item":"pen","note":"a b"}"#,
            &v1,
        )
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let reordered = api
        .post_raw(
            "json",
            "application/json; charset=utf-8",
            "{ \"note\" : \"a b\",\n  \"item\" : \"pen\" }",
            &v1,
        )
        .await;
    assert!(reordered.replayed(), "{:?}", reordered.body);
    assert_eq!(reordered.body["order_id"], first.body["order_id"]);
    let other_version = api
        .post_raw(
            "json",
            "application/json",
            r#"{"item":"pen","note":"a b"}"#,
            &[("api-version", "2")],
        )
        .await;
    assert_eq!(other_version.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other_version.problem(), "urn:idem:problem:payload-mismatch");
    let other_value = api
        .post_raw(
            "json",
            "application/json",
            r#"{"item":"pen","note":"ab"}"#,
            &v1,
        )
        .await;
    assert_eq!(other_value.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(shop.rows().await, 1);

    let exact = Shop::new().await;
    let layer = builder(&store().await).byte_exact_bodies().build().unwrap();
    let api = Api::new(&start(&exact, layer).await);
    let first = api
        .post_raw(
            "json",
            "application/json",
            r#"{"item":"pen","note":"a b"}"#,
            &[],
        )
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let reordered = api
        .post_raw(
            "json",
            "application/json",
            r#"{"note":"a b","item":"pen"}"#,
            &[],
        )
        .await;
    assert_eq!(reordered.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(exact.rows().await, 1);
}

/// A response with `Cache-Control: no-store` is not stored: its key is released and the next
/// request with it runs the handler again. A storage policy may keep more (or less).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_store_response_releases_its_key_and_the_policy_decides_the_rest() {
    let runs = Arc::new(AtomicU32::new(0));
    let app = |runs: Arc<AtomicU32>| {
        Router::new().route(
            "/orders",
            post(move |body: String| {
                let runs = runs.clone();
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst);
                    match body.as_str() {
                        "quote" => (
                            StatusCode::OK,
                            [("cache-control", "private, No-Store")],
                            format!("quote {n}"),
                        )
                            .into_response(),
                        _ => (StatusCode::NOT_FOUND, format!("missing {n}")).into_response(),
                    }
                }
            }),
        )
    };
    let store = store().await;
    let url = serve(app(runs.clone()).layer(builder(&store).build().unwrap())).await;
    let api = Api::new(&url);
    for _ in 0..2 {
        let quote = api.post_raw("q", "text/plain", "quote", &[]).await;
        assert_eq!(quote.status, StatusCode::OK);
        assert!(!quote.replayed());
        let missing = api.post_raw("m", "text/plain", "missing", &[]).await;
        assert_eq!(missing.status, StatusCode::NOT_FOUND);
        assert!(!missing.replayed(), "404 is not kept by default");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4, "every request ran");

    let kept_404 = Arc::new(AtomicU32::new(0));
    let layer = builder(&store)
        .biz("HTTP404")
        .store_if(|s| s == StatusCode::NOT_FOUND || idem::http::stored_by_default(s))
        .build()
        .unwrap();
    let api = Api::new(&serve(app(kept_404.clone()).layer(layer)).await);
    let first = api.post_raw("m", "text/plain", "missing", &[]).await;
    let again = api.post_raw("m", "text/plain", "missing", &[]).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(kept_404.load(Ordering::SeqCst), 1);
}

/// 50 duplicates of a 50 ms handler released together: each one told to come back is told about
/// a second (the route's recent duration), not the lease's 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_after_follows_the_handlers_duration_not_the_lease() {
    let shop = Shop::new().await;
    shop.slow_ms.store(50, Ordering::SeqCst);
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let api = Api::new(&url);
    for i in 0..3 {
        let warm = api
            .post(
                Some("alice"),
                Some(&format!("warm-{i}")),
                json!({ "item": "w" }),
            )
            .await;
        assert_eq!(warm.status, StatusCode::CREATED);
    }
    let mut told = Vec::new();
    for reply in api.released_together(50, "hot").await {
        if reply.status == StatusCode::CONFLICT {
            told.push(
                reply.headers["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse::<u64>()
                    .unwrap(),
            );
        } else {
            assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
        }
    }
    assert!(told.iter().all(|s| (1..=2).contains(s)), "{told:?}");
    assert_eq!(
        shop.rows().await,
        4,
        "3 warm-up orders and one for 50 duplicates"
    );
}

/// `check()` at start-up finds a store that was never migrated; a migrated one passes.
#[tokio::test]
async fn check_at_start_up_finds_a_store_that_was_never_migrated() {
    let bare = SqliteStore::in_memory().await.unwrap();
    let layer = builder(&bare).build().unwrap();
    let err = layer.check().await.unwrap_err();
    assert!(matches!(err, IdemError::StoreSchema { .. }), "{err:?}");
    assert!(err.to_string().contains("migrate"), "{err}");
    bare.migrate().await.unwrap();
    builder(&bare).build().unwrap().check().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_may_come_from_a_body_field_when_a_proxy_strips_the_header() {
    let shop = Shop::new().await;
    let layer = builder(&store().await)
        .body_key("/request_id")
        .build()
        .unwrap();
    let url = start(&shop, layer).await;
    let api = Api::new(&url);
    let order = json!({ "item": "lamp", "request_id": "r-77" });
    let first = api.post(Some("alice"), None, order.clone()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = api.post(Some("alice"), None, order).await;
    assert!(again.replayed());
    let bad = api
        .post(Some("alice"), None, json!({ "request_id": [1] }))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(shop.rows().await, 1);
}

/// Client B sending client A's key and body runs as its own request and sees nothing of
/// A's response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_caller_with_the_same_key_never_sees_the_first_callers_response() {
    let shop = Shop::new().await;
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let api = Api::new(&url);
    let order = json!({ "item": "secret-plans" });
    let alice = api.post(Some("alice"), Some("shared"), order.clone()).await;
    let bob = api.post(Some("bob"), Some("shared"), order.clone()).await;
    assert_eq!(bob.status, StatusCode::CREATED);
    assert!(!bob.replayed(), "bob's request ran as his own");
    assert_ne!(bob.body["order_id"], alice.body["order_id"]);
    assert_eq!(bob.body["owner"], "bob");
    assert!(!bob.body.to_string().contains("alice"));
    let alice_again = api.post(Some("alice"), Some("shared"), order).await;
    assert!(alice_again.replayed());
    assert_eq!(alice_again.body, alice.body);
    assert_eq!(shop.rows().await, 2);
}

#[tokio::test]
async fn a_layer_without_a_principal_is_refused_at_start_up() {
    let store = store().await;
    let err = IdempotencyLayer::builder(store.clone())
        .build()
        .err()
        .unwrap();
    assert!(
        matches!(&err, IdemError::InvalidOptions { reason } if reason.contains("Principal::unscoped")),
        "{err}"
    );
    let err = IdempotencyLayer::builder(store.clone())
        .principal(Principal::unscoped(" "))
        .build()
        .err()
        .unwrap();
    assert!(err.to_string().contains("needs a reason"), "{err}");
    let ok = IdempotencyLayer::builder(store.clone())
        .principal(Principal::unscoped("one internal caller behind mutual TLS"))
        .build();
    assert!(ok.is_ok());
    let err = builder(&store)
        .cap_per_principal(0, Duration::from_secs(1))
        .build()
        .err()
        .unwrap();
    assert!(err.to_string().contains("cap of 0"), "{err}");
}

/// A cap on new records per caller per window, 429 with Retry-After before anything is
/// written; replays and other callers are not affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_over_its_cap_gets_429_before_anything_is_written() {
    let shop = Shop::new().await;
    let store = store().await;
    let layer = builder(&store)
        .cap_per_principal(3, Duration::from_secs(60))
        .build()
        .unwrap();
    let url = start(&shop, layer).await;
    let api = Api::new(&url);
    for i in 0..3 {
        let reply = api
            .post(
                Some("mallory"),
                Some(&format!("m{i}")),
                json!({ "item": i }),
            )
            .await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    let over = api
        .post(Some("mallory"), Some("m3"), json!({ "item": 3 }))
        .await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(over.problem(), "urn:idem:problem:too-many-keys");
    let after: u64 = over.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&after), "{after}");
    let record = idem::Store::load(&store, "HTTP", &idem_record_key("mallory", "m3"))
        .await
        .unwrap();
    assert!(
        record.is_none(),
        "nothing was written for the refused request"
    );
    let replay = api
        .post(Some("mallory"), Some("m0"), json!({ "item": 0 }))
        .await;
    assert!(replay.replayed(), "a replay is not a new record");
    let other = api
        .post(Some("alice"), Some("m3"), json!({ "item": 3 }))
        .await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert_eq!(shop.rows().await, 4);
}

/// Submit tokens over HTTP, and their subject binding end to end: a token issued to alice cannot
/// be spent by bob; alice spends it once; a 5xx puts it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_tokens_are_issued_to_a_caller_and_spent_once() {
    let tokens: Arc<dyn TokenStore> = Arc::new(MemoryTokens::new());
    let principal = Principal::header(HeaderName::from_static(USER));
    let runs = Arc::new(AtomicU32::new(0));
    let fail_next = Arc::new(AtomicU32::new(0));
    let submit = {
        let (runs, fail_next) = (Arc::clone(&runs), Arc::clone(&fail_next));
        post(move || async move {
            if fail_next
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return (StatusCode::SERVICE_UNAVAILABLE, "try later").into_response();
            }
            runs.fetch_add(1, Ordering::SeqCst);
            (StatusCode::OK, "submitted").into_response()
        })
    };
    let app = Router::new()
        .route(
            "/submit",
            submit.layer(TokenGuardLayer::shared(
                Arc::clone(&tokens),
                principal.clone(),
            )),
        )
        .route(
            "/tokens",
            TokenEndpoint::shared(tokens, principal)
                .ttl(Duration::from_secs(60))
                .unwrap()
                .route(),
        );
    let url = serve(app).await;
    let client = reqwest::Client::new();
    let issue = |user: &'static str| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let reply = client
                .post(format!("{url}/tokens"))
                .header(USER, user)
                .send()
                .await
                .unwrap();
            assert_eq!(reply.status().as_u16(), 201);
            let body: Value = reply.json().await.unwrap();
            assert_eq!(body["header"], "x-idem-token");
            body["token"].as_str().unwrap().to_owned()
        }
    };
    let submit = |user: Option<&'static str>, token: Option<String>| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let mut req = client.post(format!("{url}/submit"));
            if let Some(user) = user {
                req = req.header(USER, user);
            }
            if let Some(token) = token {
                req = req.header("x-idem-token", token);
            }
            let reply = req.send().await.unwrap();
            let status = reply.status().as_u16();
            let body = reply.text().await.unwrap();
            (status, body)
        }
    };

    let token = issue("alice").await;
    let (status, body) = submit(Some("bob"), Some(token.clone())).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("token-invalid") && body.contains("another subject"),
        "{body}"
    );
    assert_eq!(submit(Some("alice"), None).await.0, 400);
    assert_eq!(submit(None, Some(token.clone())).await.0, 401);
    let (status, body) = submit(Some("alice"), Some(token.clone())).await;
    assert_eq!((status, body.as_str()), (200, "submitted"));
    let (status, body) = submit(Some("alice"), Some(token.clone())).await;
    assert_eq!(status, 409);
    assert!(body.contains("urn:idem:problem:token-used"), "{body}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A double click: of two concurrent submits with one token, one runs.
    let token = issue("alice").await;
    let (a, b) = tokio::join!(
        submit(Some("alice"), Some(token.clone())),
        submit(Some("alice"), Some(token))
    );
    let mut statuses = [a.0, b.0];
    statuses.sort();
    assert_eq!(statuses, [200, 409]);
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // The handler fails with a 5xx: the token is put back and the user can submit again.
    let token = issue("alice").await;
    fail_next.store(1, Ordering::SeqCst);
    assert_eq!(submit(Some("alice"), Some(token.clone())).await.0, 503);
    assert_eq!(submit(Some("alice"), Some(token)).await.0, 200);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}
