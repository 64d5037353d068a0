//! What arrives on the wire: headers never kept or kept twice, several key or token lines, a body
//! cut short, durations at their limits.

use super::*;

/// A cookie (a session), a hop-by-hop or framing header, a credential and the layer's
/// own header can never be kept: `keep_header` with one is refused when the layer is built.
#[tokio::test]
async fn headers_that_can_never_be_kept_are_refused_at_build() {
    let store = store().await;
    for name in [
        "set-cookie",
        "set-cookie2",
        "authorization",
        "proxy-authorization",
        "cookie",
        "authentication-info",
        "proxy-authentication-info",
        "proxy-authenticate",
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "content-length",
        "idempotent-replayed",
    ] {
        let err = builder(&store)
            .keep_header(HeaderName::from_static(name))
            .build()
            .err()
            .unwrap_or_else(|| panic!("keep_header({name}) was accepted"));
        assert!(
            matches!(&err, IdemError::InvalidOptions { reason } if reason.contains(&format!("`{name}` header is never kept, since "))),
            "{name}: {err}"
        );
    }
    let err = builder(&store)
        .keep_header(axum::http::header::SET_COOKIE)
        .build()
        .err()
        .unwrap();
    assert!(err.to_string().contains("session"), "it says why: {err}");
    // A challenge carries no secret: it may be kept.
    assert!(
        builder(&store)
            .keep_header(axum::http::header::WWW_AUTHENTICATE)
            .build()
            .is_ok()
    );
}

/// A header kept by default and named again is still replayed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_kept_twice_is_replayed_once() {
    let shop = Shop::new().await;
    let layer = builder(&store().await)
        .keep_header(axum::http::header::LOCATION)
        .build()
        .unwrap();
    let api = Api::new(&start(&shop, layer).await);
    let first = api
        .post(Some("alice"), Some("loc"), json!({ "item": "map" }))
        .await;
    let again = api
        .post(Some("alice"), Some("loc"), json!({ "item": "map" }))
        .await;
    assert!(again.replayed());
    let locations: Vec<_> = again.headers.get_all("location").iter().collect();
    assert_eq!(locations, [&first.headers["location"]]);
}

/// Several Idempotency-Key lines are one comma-joined value (RFC 9110 §5.3), not a key,
/// also when the lines are equal: 400 `invalid-key`, the handler does not run, nothing is stored.
/// The same for a body key present twice, and several lines of the caller's header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_key_lines_are_an_invalid_key_and_run_nothing() {
    let shop = Shop::new().await;
    let store = store().await;
    let layer = builder(&store).body_key("/request_id").build().unwrap();
    let url = start(&shop, layer).await;
    let body = r#"{"item":"gem"}"#;
    for lines in [
        ["idempotency-key: \"a\"", "idempotency-key: \"b\""],
        ["idempotency-key: \"a\"", "idempotency-key: \"a\""],
        ["idempotency-key: a", "idempotency-key: a"],
    ] {
        let request = raw_post(&["x-user: alice", lines[0], lines[1]], body.len(), body);
        let reply = raw(&url, &request, false).await;
        assert_eq!(reply.status, 400, "{lines:?}: {:?}", reply.body);
        assert_eq!(reply.problem(), "urn:idem:problem:invalid-key");
        let detail = reply.body["detail"].as_str().unwrap();
        assert!(
            detail.contains("2 Idempotency-Key header lines") && detail.contains("RFC 9110"),
            "{detail}"
        );
    }
    // What a proxy makes of two lines: one line, comma-joined.
    for joined in ["a,b", "a, b", "\"a\", \"b\""] {
        let line = format!("idempotency-key: {joined}");
        let request = raw_post(&["x-user: alice", &line], body.len(), body);
        let reply = raw(&url, &request, false).await;
        assert_eq!(reply.status, 400, "{joined}: {:?}", reply.body);
        assert_eq!(reply.problem(), "urn:idem:problem:invalid-key");
    }
    // The body key, present twice (equal or not), is the same ambiguity.
    for twice in [
        r#"{"item":"gem","request_id":"r1","request_id":"r2"}"#,
        r#"{"item":"gem","request_id":"r1","request_id":"r1"}"#,
    ] {
        let reply = raw(
            &url,
            &raw_post(&["x-user: alice"], twice.len(), twice),
            false,
        )
        .await;
        assert_eq!(reply.status, 400, "{twice}: {:?}", reply.body);
        assert_eq!(reply.problem(), "urn:idem:problem:invalid-key");
        assert!(
            reply.body["detail"]
                .as_str()
                .unwrap()
                .contains("/request_id"),
            "{:?}",
            reply.body
        );
    }
    // Two callers: a gateway that appended its line must not let the client's first line win.
    let request = raw_post(
        &["x-user: mallory", "x-user: alice", "idempotency-key: k"],
        body.len(),
        body,
    );
    let reply = raw(&url, &request, false).await;
    assert_eq!(reply.status, 401, "{:?}", reply.body);
    assert_eq!(reply.problem(), "urn:idem:problem:no-principal");
    assert_eq!(shop.rows().await, 0, "the handler never ran");
    assert_eq!(records(&store).await, 0, "nothing was stored");
    // One line is still a key.
    let request = raw_post(
        &["x-user: alice", "idempotency-key: \"a\""],
        body.len(),
        body,
    );
    assert_eq!(raw(&url, &request, false).await.status, 201);
    assert_eq!(records(&store).await, 1);
}

/// A body shorter than its Content-Length (the client stopped sending) is the client's
/// fault, not an over-size body: 400 `request-unreadable`, the handler does not run, nothing is
/// stored. A body over the limit is still 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_cut_short_is_a_bad_request_and_runs_nothing() {
    let shop = Shop::new().await;
    let store = store().await;
    let url = start(&shop, builder(&store).build().unwrap()).await;
    let body = r#"{"item":"half"}"#;
    let request = raw_post(&["x-user: alice", "idempotency-key: cut"], 100, body);
    let reply = raw(&url, &request, true).await;
    assert_eq!(reply.status, 400, "{:?}", reply.body);
    assert_eq!(reply.problem(), "urn:idem:problem:request-unreadable");
    assert_eq!(reply.body["status"], 400);
    assert_eq!(shop.rows().await, 0, "the handler never ran");
    assert_eq!(records(&store).await, 0, "nothing was stored");

    let huge = Api::new(&url)
        .client
        .post(format!("{url}/orders"))
        .header(USER, "alice")
        .header("idempotency-key", "huge")
        .body(vec![b' '; (1 << 20) + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(huge.status().as_u16(), 413);
    let problem: Value = huge.json().await.unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:request-too-large");
    // Over the limit, also when the client then stops sending.
    let request = raw_post(
        &["x-user: alice", "idempotency-key: big-cut"],
        (2 << 20) + 7,
        &" ".repeat((1 << 20) + 1),
    );
    let reply = raw(&url, &request, true).await;
    assert_eq!(reply.status, 413, "{:?}", reply.body);
    assert_eq!(reply.problem(), "urn:idem:problem:request-too-large");
    assert_eq!(records(&store).await, 0);

    // The same request sent whole runs.
    let request = raw_post(&["x-user: alice", "idempotency-key: cut"], body.len(), body);
    assert_eq!(raw(&url, &request, false).await.status, 201);
    assert_eq!(shop.rows().await, 1);
}

/// Several X-Idem-Token lines spend nothing: 400, and the token still works once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_token_lines_spend_nothing() {
    let tokens: Arc<dyn TokenStore> = Arc::new(MemoryTokens::new());
    let principal = Principal::header(HeaderName::from_static(USER));
    let runs = Arc::new(AtomicU32::new(0));
    let submit = {
        let runs = Arc::clone(&runs);
        post(move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            "submitted"
        })
    };
    let app = Router::new().route(
        "/submit",
        submit.layer(TokenGuardLayer::shared(Arc::clone(&tokens), principal)),
    );
    let url = serve(app).await;
    let first = tokens
        .issue(Duration::from_secs(60), Some("alice"))
        .await
        .unwrap();
    let second = tokens
        .issue(Duration::from_secs(60), Some("alice"))
        .await
        .unwrap();
    let request = |lines: &[&str]| {
        let mut request = String::from(
            "POST /submit HTTP/1.1\r\nhost: idem\r\nconnection: close\r\nx-user: alice\r\n",
        );
        for line in lines {
            request.push_str(&format!("x-idem-token: {line}\r\n"));
        }
        request.push_str("content-length: 0\r\n\r\n");
        request
    };
    for lines in [[&first, &second], [&first, &first]] {
        let reply = raw(&url, &request(&[lines[0], lines[1]]), false).await;
        assert_eq!(reply.status, 400, "{:?}", reply.body);
        assert_eq!(reply.problem(), "urn:idem:problem:token-invalid");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(raw(&url, &request(&[&first]), false).await.status, 200);
    assert_eq!(raw(&url, &request(&[&second]), false).await.status, 200);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "both tokens were still unspent"
    );
}

/// Every duration of the layer and of the token endpoint is checked at build: out of
/// its range it is `InvalidOptions` naming it (no panic per request, as `wait(Duration::MAX)`
/// was: `Instant + Duration::MAX` overflows); at the maximum the layer works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_out_of_range_are_refused_at_build_and_the_maximum_works() {
    use idem::MAX_DURATION;
    let store = store().await;
    let ns = Duration::from_nanos(1);
    let ms = Duration::from_millis(1);
    let refused = |b: IdempotencyBuilder, what: &str| {
        let err = b
            .build()
            .err()
            .unwrap_or_else(|| panic!("{what}: accepted"));
        assert!(
            matches!(&err, IdemError::InvalidOptions { reason } if reason.contains(what)),
            "{what}: {err}"
        );
    };
    let accepted = |b: IdempotencyBuilder, what: &str| {
        if let Err(e) = b.build() {
            panic!("{what}: {e}");
        }
    };
    for bad in [Duration::ZERO, ns] {
        refused(builder(&store).ttl(bad), "ttl");
        refused(builder(&store).lease(bad), "lease");
        refused(builder(&store).store_timeout(bad), "store timeout");
        refused(builder(&store).cap_per_principal(5, bad), "cap's window");
    }
    for too_long in [MAX_DURATION + ns, Duration::MAX] {
        refused(builder(&store).ttl(too_long), "the ttl");
        refused(builder(&store).ttl(too_long).lease(too_long), "the lease");
        refused(builder(&store).wait(too_long), "the wait");
        refused(builder(&store).store_timeout(too_long), "the store timeout");
        refused(builder(&store).heartbeat(too_long), "heartbeat");
        refused(
            builder(&store).cap_per_principal(5, too_long),
            "cap's window",
        );
    }
    // The lease is shorter than the ttl, so never the maximum itself.
    refused(
        builder(&store).ttl(MAX_DURATION).lease(MAX_DURATION),
        "lease",
    );
    for bad in [Duration::ZERO, ns, idem::DEFAULT_LEASE] {
        refused(builder(&store).heartbeat(bad), "heartbeat");
    }
    for bad in [Duration::ZERO, ns] {
        refused(builder(&store).result_ttl(bad), "result ttl");
    }
    refused(
        builder(&store)
            .ttl(Duration::from_secs(60))
            .result_ttl(Duration::from_secs(61)),
        "result ttl",
    );
    accepted(builder(&store).result_ttl(ms), "a 1 ms result ttl");
    accepted(
        builder(&store).ttl(MAX_DURATION).result_ttl(MAX_DURATION),
        "a result kept as long as the longest ttl",
    );
    accepted(builder(&store).lease(ms), "a 1 ms lease");
    accepted(builder(&store).store_timeout(ms), "a 1 ms store timeout");
    accepted(
        builder(&store).store_timeout(MAX_DURATION),
        "the longest store timeout",
    );
    accepted(builder(&store).heartbeat(ms), "a 1 ms heartbeat");
    accepted(builder(&store).wait(Duration::ZERO), "no wait");
    accepted(builder(&store).wait(ns), "a 1 ns wait");
    accepted(builder(&store).cap_per_principal(5, ms), "a 1 ms window");
    accepted(
        builder(&store)
            .ttl(MAX_DURATION)
            .lease(MAX_DURATION - Duration::from_secs(1)),
        "the longest lease",
    );

    let endpoint = || {
        TokenEndpoint::new(
            MemoryTokens::new(),
            Principal::header(HeaderName::from_static(USER)),
        )
    };
    for bad in [Duration::ZERO, ns, MAX_DURATION + ns, Duration::MAX] {
        let err = endpoint()
            .ttl(bad)
            .err()
            .unwrap_or_else(|| panic!("{bad:?}"));
        assert!(
            matches!(&err, IdemError::InvalidOptions { reason } if reason.contains("token's ttl")),
            "{err}"
        );
    }
    assert!(endpoint().ttl(ms).is_ok());
    assert!(endpoint().ttl(MAX_DURATION).is_ok());

    // At the maximum: a record for ten years, a wait as long, a cap window as long.
    let shop = Shop::new().await;
    shop.slow_ms.store(400, Ordering::SeqCst);
    let layer = builder(&store)
        .ttl(MAX_DURATION)
        .lease(Duration::from_secs(30))
        .wait(MAX_DURATION)
        .cap_per_principal(100, MAX_DURATION)
        .build()
        .unwrap();
    let api = Api::new(&start(&shop, layer).await);
    let (first, repeat) = api
        .overlapping("decade", "clock", Duration::from_millis(100))
        .await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    assert!(repeat.replayed(), "{:?}", repeat.body);
    assert_eq!(repeat.body, first.body);
    shop.slow_ms.store(0, Ordering::SeqCst);
    let again = api
        .post(Some("alice"), Some("decade"), json!({ "item": "clock" }))
        .await;
    assert!(again.replayed());
    assert_eq!(shop.rows().await, 1);
    // And the longest lease the ttl allows claims and replays too.
    let layer = builder(&store)
        .biz("HTTP2")
        .ttl(MAX_DURATION)
        .lease(MAX_DURATION - Duration::from_secs(1))
        .build()
        .unwrap();
    let api = Api::new(&start(&shop, layer).await);
    let first = api
        .post(Some("alice"), Some("long-lease"), json!({ "item": "oak" }))
        .await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    let again = api
        .post(Some("alice"), Some("long-lease"), json!({ "item": "oak" }))
        .await;
    assert!(again.replayed(), "{:?}", again.body);
    assert_eq!(shop.rows().await, 2);
}
