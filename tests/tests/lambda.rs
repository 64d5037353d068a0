//! The Lambda adapters on `DynamoStore`, against the local DynamoDB-compatible server
//! (`IDEM_DYNAMO_URL`, default `http://127.0.0.1:8000`), invoked in process with the event shapes
//! Lambda sends (SQS, API Gateway HTTP API payload 2.0). What ran is audited in an SQLite table
//! of the test's own (one row per body run), not by idem's counters.

#[path = "contract/server.rs"]
mod server;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::lambda::events::apigw::{ApiGatewayV2httpRequest, ApiGatewayV2httpResponse};
use idem::lambda::events::encodings::Body;
use idem::lambda::events::sqs::{SqsBatchResponse, SqsEvent};
use idem::lambda::lambda_runtime::{Context, LambdaEvent, Service};
use idem::lambda::sqs::SqsBatch;
use idem::lambda::{Idempotent, apigw::HttpApi};
use idem::{DynamoStore, IdemError};
use serde_json::json;
use sqlx::SqlitePool;
use tokio::sync::Barrier;

fn endpoint() -> String {
    server::dynamo_url()
}

/// A store on a table of this test's own, migrated; `None` (one skip line) when the server is
/// down.
async fn store() -> Option<Arc<DynamoStore>> {
    let url = format!(
        "dynamodb://{}?endpoint={}",
        server::unique("idemlambda"),
        endpoint()
    );
    server::reach("DynamoDB", &endpoint(), async {
        let store = DynamoStore::connect(&url).await?;
        store.migrate().await?;
        Ok::<_, IdemError>(Arc::new(store))
    })
    .await
}

/// The side effects: one row per body run, in an SQLite file of the test's own.
#[derive(Clone)]
struct Effects {
    pool: SqlitePool,
    _dir: Arc<tempfile::TempDir>,
}

impl Effects {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("effects.db").display()
        );
        let pool = SqlitePool::connect(&url).await.unwrap();
        sqlx::query(
            "CREATE TABLE effects (key TEXT NOT NULL, record TEXT NOT NULL, ok INTEGER NOT NULL)",
        )
        .execute(&pool)
        .await
        .unwrap();
        Effects {
            pool,
            _dir: Arc::new(dir),
        }
    }

    async fn ran(&self, key: &str, record: &str, ok: bool) {
        sqlx::query("INSERT INTO effects (key, record, ok) VALUES (?, ?, ?)")
            .bind(key)
            .bind(record)
            .bind(ok)
            .execute(&self.pool)
            .await
            .unwrap();
    }

    /// `(key, record, ok)` of every run.
    async fn rows(&self) -> Vec<(String, String, bool)> {
        sqlx::query_as("SELECT key, record, ok FROM effects ORDER BY rowid")
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }

    async fn successes(&self) -> BTreeMap<String, usize> {
        let mut per_key = BTreeMap::new();
        for (key, _, ok) in self.rows().await {
            if ok {
                *per_key.entry(key).or_insert(0) += 1;
            }
        }
        per_key
    }
}

/// An invocation's context with `left` until its deadline.
fn context(left: Duration) -> Context {
    let mut context = Context::default();
    context.request_id = server::unique("req");
    context.deadline = (SystemTime::now() + left)
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    context
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Order {
    order_no: String,
    amount: u64,
}

/// 64 concurrent invocations of one event: the body runs once, every invocation gets its answer
/// or is told the key is in progress, and a later retry of each gets the first answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_one_event_runs_its_handler_once() {
    let Some(store) = store().await else { return };
    let effects = Effects::new().await;
    let audit = effects.clone();
    let handler = Idempotent::builder(store, "PAY", |o: &Order| o.order_no.clone())
        .validate(|o: &Order| o.amount)
        .build(move |event: LambdaEvent<Order>| {
            let effects = audit.clone();
            async move {
                // Long enough that the other invocations arrive while it runs.
                tokio::time::sleep(Duration::from_millis(300)).await;
                effects
                    .ran(&event.payload.order_no, &event.context.request_id, true)
                    .await;
                Ok::<_, IdemError>(format!(
                    "paid {} by {}",
                    event.payload.order_no, event.context.request_id
                ))
            }
        })
        .unwrap();
    let order = Order {
        order_no: server::unique("ORD"),
        amount: 42,
    };
    let barrier = Arc::new(Barrier::new(64));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (mut handler, order, barrier) = (handler.clone(), order.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            handler
                .call(LambdaEvent::new(order, context(Duration::from_secs(30))))
                .await
        }));
    }
    let mut answers = HashSet::new();
    let mut in_progress = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(answer) => {
                answers.insert(answer);
            }
            Err(IdemError::InProgress { .. }) => in_progress += 1,
            Err(e) => panic!("unexpected refusal: {e}"),
        }
    }
    let rows = effects.rows().await;
    eprintln!(
        "64 invocations of one event: {} answered, {in_progress} told in progress, the body ran {} time(s)",
        64 - in_progress,
        rows.len()
    );
    assert_eq!(rows.len(), 1, "the body ran {} times: {rows:?}", rows.len());
    let first = format!("paid {} by {}", order.order_no, rows[0].1);
    assert_eq!(
        answers,
        HashSet::from([first.clone()]),
        "{in_progress} in progress"
    );
    // The repeats told "in progress" retry, as Lambda does, and get the first answer.
    let mut handler = handler;
    for _ in 0..in_progress.min(4) {
        let again = handler
            .call(LambdaEvent::new(
                order.clone(),
                context(Duration::from_secs(30)),
            ))
            .await
            .unwrap();
        assert_eq!(again, first);
    }
    let other = Order {
        amount: 43,
        ..order
    };
    let refused = handler
        .call(LambdaEvent::new(other, context(Duration::from_secs(30))))
        .await;
    assert!(
        matches!(refused, Err(IdemError::PayloadMismatch)),
        "{refused:?}"
    );
    assert_eq!(effects.rows().await.len(), 1);
}

/// An invocation that times out is killed at its deadline (here: its future dropped); a retry
/// before the deadline is told "in progress", the retry after it takes the key over at once (its
/// lease was the invocation's remaining time) and asks the recover fn first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_times_out_is_taken_over_by_its_retry_after_the_deadline() {
    let Some(store) = store().await else { return };
    let effects = Effects::new().await;
    let key = server::unique("ORD");
    let first_context = context(Duration::from_secs(3));
    let deadline = first_context.deadline();
    let slow = {
        let (store, effects, key) = (store.clone(), effects.clone(), key.clone());
        async move {
            idem::lambda::call("SLOW", &key, &first_context)
                .run(&*store, async {
                    effects.ran(&key, "first", false).await;
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok::<_, IdemError>("never".to_owned())
                })
                .await
        }
    };
    let killed = tokio::spawn(async move {
        // Lambda stops the invocation at its deadline.
        tokio::time::timeout(Duration::from_secs(3), slow).await
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let early: Result<String, IdemError> =
        idem::lambda::call("SLOW", &key, &context(Duration::from_secs(30)))
            .run(&*store, async { Ok("too early".to_owned()) })
            .await;
    assert!(
        matches!(early, Err(IdemError::InProgress { .. })),
        "{early:?}"
    );
    assert!(
        killed.await.unwrap().is_err(),
        "the first invocation ran past its deadline"
    );
    // Past the deadline, and the store's skew margin.
    let wait = deadline
        .duration_since(SystemTime::now())
        .unwrap_or_default()
        + idem::dynamodb::DEFAULT_SKEW_MARGIN
        + Duration::from_millis(200);
    tokio::time::sleep(wait).await;
    let asked = Arc::new(Mutex::new(0));
    let retry: String = idem::lambda::call("SLOW", &key, &context(Duration::from_secs(30)))
        .recover({
            let asked = asked.clone();
            move || async move {
                *asked.lock().unwrap() += 1;
                Ok::<_, IdemError>(None)
            }
        })
        .run(&*store, async {
            effects.ran(&key, "retry", true).await;
            Ok::<_, IdemError>("done by the retry".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(retry, "done by the retry");
    assert_eq!(*asked.lock().unwrap(), 1, "the takeover asks recover first");
    let rows = effects.rows().await;
    assert_eq!(
        rows.iter().map(|r| r.1.as_str()).collect::<Vec<_>>(),
        ["first", "retry"]
    );
    let replay: String = idem::lambda::call("SLOW", &key, &context(Duration::from_secs(30)))
        .run(&*store, async { Ok::<_, IdemError>("again".to_owned()) })
        .await
        .unwrap();
    assert_eq!(replay, "done by the retry");
}

/// An SQS record in the shape Lambda delivers it.
fn sqs_record(id: &str, order_no: &str, receive_count: u32, queue: &str) -> serde_json::Value {
    json!({
        "messageId": id,
        "receiptHandle": format!("AQEB{id}"),
        "body": json!({ "order_no": order_no, "amount": 10 }).to_string(),
        "attributes": {
            "ApproximateReceiveCount": receive_count.to_string(),
            "SentTimestamp": "1545082649183",
            "SenderId": "AIDAIENQZJOLO23YVJ4VO",
            "ApproximateFirstReceiveTimestamp": "1545082649185"
        },
        "messageAttributes": {},
        "md5OfBody": "e4e68fb7bd0e697a0ae8f1bb342846b3",
        "eventSource": "aws:sqs",
        "eventSourceARN": format!("arn:aws:sqs:us-east-2:123456789012:{queue}"),
        "awsRegion": "us-east-2"
    })
}

fn sqs_event(records: Vec<serde_json::Value>) -> LambdaEvent<SqsEvent> {
    let event: SqsEvent = serde_json::from_value(json!({ "Records": records })).unwrap();
    LambdaEvent::new(event, context(Duration::from_secs(30)))
}

fn listed(response: &SqsBatchResponse) -> HashSet<String> {
    response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect()
}

/// Ten SQS batches, two at a time, with duplicates inside a batch and across batches, and keys
/// whose body fails on its first run: each batch lists exactly the records whose body failed or
/// whose key was not done, never one whose key was done; the listed records delivered again
/// (as SQS does) finish every key, each run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqs_batches_list_only_the_records_to_deliver_again() {
    let Some(store) = store().await else { return };
    let effects = Effects::new().await;
    let batch = Arc::new(SqsBatch::builder(store, "SHIP").build().unwrap());
    let prefix = server::unique("SHIP");
    let keys: Vec<String> = (0..25).map(|i| format!("{prefix}-{i}")).collect();
    // Keys whose body fails the first time it runs.
    let fails_once: HashSet<String> = keys.iter().step_by(4).cloned().collect();
    let failed = Arc::new(Mutex::new(HashSet::<String>::new()));
    // Ten batches of 10 records: keys drawn with repeats inside and across batches.
    let mut pending: Vec<Vec<(String, String, u32)>> = (0..10)
        .map(|b| {
            (0..10)
                .map(|r| {
                    let key = keys[(b * 7 + r * 3 + r * r) % keys.len()].clone();
                    (format!("m-{b}-{r}"), key, 1)
                })
                .collect()
        })
        .collect();
    let mut rounds = 0;
    let mut listed_total = 0;
    while !pending.is_empty() {
        rounds += 1;
        assert!(
            rounds <= 20,
            "records still listed after 20 deliveries: {pending:?}"
        );
        let mut again = Vec::new();
        for pair in pending.chunks(2) {
            let mut tasks = Vec::new();
            for records in pair.iter().cloned() {
                let (batch, effects, fails_once, failed) = (
                    batch.clone(),
                    effects.clone(),
                    fails_once.clone(),
                    failed.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    let event = sqs_event(
                        records
                            .iter()
                            .map(|(id, key, n)| sqs_record(id, key, *n, "orders"))
                            .collect(),
                    );
                    let response = batch
                        .handle_json(
                            event,
                            |o: &Order| o.order_no.clone(),
                            |o: Order| {
                                let (effects, fails_once, failed) =
                                    (effects.clone(), fails_once.clone(), failed.clone());
                                async move {
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                    let fail = fails_once.contains(&o.order_no)
                                        && failed.lock().unwrap().insert(o.order_no.clone());
                                    effects.ran(&o.order_no, "", !fail).await;
                                    if fail {
                                        Err(IdemError::InvalidOptions {
                                            reason: "the warehouse said no".into(),
                                        })
                                    } else {
                                        Ok(format!("shipped {}", o.order_no))
                                    }
                                }
                            },
                        )
                        .await;
                    (records, response)
                }));
            }
            for task in tasks {
                let (records, response) = task.await.unwrap();
                let listed = listed(&response);
                let done = effects.successes().await;
                let ids: HashSet<String> = records.iter().map(|r| r.0.clone()).collect();
                assert!(
                    listed.is_subset(&ids),
                    "{listed:?} lists records not in the batch"
                );
                for (id, key, n) in records {
                    if listed.contains(&id) {
                        again.push((id, key, n + 1));
                    } else {
                        // Not listed: its key is done, by this record or an earlier one.
                        assert_eq!(
                            done.get(&key),
                            Some(&1),
                            "{id} ({key}) not listed but not done"
                        );
                    }
                }
            }
        }
        // The failed runs' records were listed: every key that failed has a record delivered
        // again (or done since by another record).
        let done = effects.successes().await;
        for (key, _, ok) in effects.rows().await {
            if !ok {
                assert!(
                    done.contains_key(&key) || again.iter().any(|r| r.1 == key),
                    "{key} failed and no record of it was listed"
                );
            }
        }
        listed_total += again.len();
        // Deliver the listed records again, in batches of up to 10.
        pending = again.chunks(10).map(<[_]>::to_vec).collect();
    }
    let done = effects.successes().await;
    let used: HashSet<&String> = keys.iter().collect();
    eprintln!(
        "10 SQS batches of 10 records over {} keys: {listed_total} records listed and delivered again \
         in {} more round(s); {} body runs, {} of them failures",
        used.len(),
        rounds - 1,
        effects.rows().await.len(),
        effects.rows().await.iter().filter(|r| !r.2).count()
    );
    assert_eq!(done.len(), used.len(), "every key done: {done:?}");
    assert!(done.values().all(|n| *n == 1), "a key ran twice: {done:?}");
    let failures = effects.rows().await.iter().filter(|r| !r.2).count();
    assert_eq!(failures, fails_once.len(), "each failing key failed once");
}

/// A FIFO queue's batch stops at its first failure: that record and every later one are listed,
/// the later ones not run.
#[tokio::test]
async fn a_fifo_batch_lists_every_record_from_its_first_failure_on() {
    let Some(store) = store().await else { return };
    let effects = Effects::new().await;
    let batch = SqsBatch::builder(store, "FIFO").build().unwrap();
    let prefix = server::unique("F");
    let records = (0..5)
        .map(|i| {
            sqs_record(
                &format!("f-{i}"),
                &format!("{prefix}-{i}"),
                1,
                "orders.fifo",
            )
        })
        .collect();
    let response = batch
        .handle_json(
            sqs_event(records),
            |o: &Order| o.order_no.clone(),
            |o: Order| {
                let effects = effects.clone();
                async move {
                    let fail = o.order_no.ends_with("-2");
                    effects.ran(&o.order_no, "", !fail).await;
                    if fail {
                        Err(IdemError::InvalidOptions {
                            reason: "no".into(),
                        })
                    } else {
                        Ok(1)
                    }
                }
            },
        )
        .await;
    assert_eq!(
        listed(&response),
        HashSet::from(["f-2".to_owned(), "f-3".to_owned(), "f-4".to_owned()])
    );
    assert_eq!(
        effects.rows().await.len(),
        3,
        "records after the failure did not run"
    );
    // An unreadable body is listed, and runs nothing.
    let mut bad = sqs_record("f-bad", "x", 1, "orders");
    bad["body"] = json!("not json");
    let response = batch
        .handle_json(
            sqs_event(vec![bad]),
            |o: &Order| o.order_no.clone(),
            |_: Order| async { Ok::<_, IdemError>(1) },
        )
        .await;
    assert_eq!(listed(&response), HashSet::from(["f-bad".to_owned()]));
}

/// An API Gateway HTTP API request (payload format 2.0) from the caller `sub`, as a JWT authorizer
/// passes it on (none: no authorizer claim).
fn http_request_from(
    sub: Option<&str>,
    key: Option<&str>,
    body: &str,
) -> LambdaEvent<ApiGatewayV2httpRequest> {
    let mut headers = json!({ "content-type": "application/json", "user-agent": "curl/8.5.0" });
    if let Some(key) = key {
        headers["idempotency-key"] = json!(key);
    }
    let request: ApiGatewayV2httpRequest = serde_json::from_value(json!({
        "version": "2.0",
        "routeKey": "POST /orders",
        "rawPath": "/orders",
        "rawQueryString": "",
        "headers": headers,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "api-id",
            "domainName": "id.execute-api.us-east-1.amazonaws.com",
            "domainPrefix": "id",
            "http": {
                "method": "POST",
                "path": "/orders",
                "protocol": "HTTP/1.1",
                "sourceIp": "192.0.2.1",
                "userAgent": "curl/8.5.0"
            },
            "requestId": "id",
            "routeKey": "POST /orders",
            "stage": "$default",
            "time": "12/Mar/2020:19:03:58 +0000",
            "timeEpoch": 1583348638390u64,
            "authorizer": match sub {
                Some(sub) => json!({ "jwt": { "claims": { "sub": sub }, "scopes": [] } }),
                None => json!({}),
            }
        },
        "body": body,
        "isBase64Encoded": false
    }))
    .unwrap();
    LambdaEvent::new(request, context(Duration::from_secs(30)))
}

/// The caller `alice`'s request.
fn http_request(key: Option<&str>, body: &str) -> LambdaEvent<ApiGatewayV2httpRequest> {
    http_request_from(Some("alice"), key, body)
}

/// The caller as the JWT authorizer said it.
fn sub(request: &ApiGatewayV2httpRequest) -> Option<String> {
    let jwt = request.request_context.authorizer.as_ref()?.jwt.as_ref()?;
    jwt.claims.get("sub").cloned()
}

fn created(body: String) -> ApiGatewayV2httpResponse {
    let mut response = ApiGatewayV2httpResponse::default();
    response.status_code = 201;
    response.body = Some(Body::Text(body));
    response
}

fn text(response: &ApiGatewayV2httpResponse) -> String {
    match &response.body {
        Some(Body::Text(t)) => t.clone(),
        other => format!("{other:?}"),
    }
}

/// The HTTP API adapter: a repeat gets the stored response without running the handler; a
/// repeat while the first runs is 409, another body under the key 422, no key 400; a 5xx answer
/// is not stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_api_answers_each_key_once() {
    let Some(store) = store().await else { return };
    let effects = Effects::new().await;
    // Keys are kept per caller: without a principal (or a reason to share them) it is refused.
    for unscoped in [None, Some(" ")] {
        let builder = HttpApi::builder(store.clone(), "ORDERS");
        let builder = match unscoped {
            Some(reason) => builder.unscoped(reason),
            None => builder,
        };
        let err = builder.build().unwrap_err();
        assert!(matches!(err, IdemError::InvalidOptions { .. }), "{err}");
    }
    let api = HttpApi::builder(store, "ORDERS")
        .principal(sub)
        .build()
        .unwrap();
    let key = server::unique("k");
    let handle = |key: Option<String>, body: &'static str, status: i64| {
        let (api, effects) = (api.clone(), effects.clone());
        async move {
            api.handle(http_request(key.as_deref(), body), |event| async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let request_body = event.payload.body.unwrap_or_default();
                effects
                    .ran(key.as_deref().unwrap_or("-"), &request_body, status < 500)
                    .await;
                let mut response = created(format!("created from {request_body}"));
                response.status_code = status;
                Ok::<_, IdemError>(response)
            })
            .await
            .unwrap()
        }
    };
    let (first, concurrent) = tokio::join!(
        handle(Some(key.clone()), r#"{"order_no":"A-1"}"#, 201),
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            handle(Some(key.clone()), r#"{"order_no":"A-1"}"#, 201).await
        }
    );
    assert_eq!(first.status_code, 201);
    assert_eq!(concurrent.status_code, 409, "{}", text(&concurrent));
    assert!(concurrent.headers.contains_key("retry-after"));
    assert!(text(&concurrent).contains("urn:idem:problem:in-progress"));
    let replay = handle(Some(key.clone()), r#"{"order_no":"A-1"}"#, 201).await;
    assert_eq!((replay.status_code, text(&replay)), (201, text(&first)));
    let other = handle(Some(key.clone()), r#"{"order_no":"B-2"}"#, 201).await;
    assert_eq!(other.status_code, 422, "{}", text(&other));
    let missing = handle(None, "{}", 201).await;
    assert_eq!(missing.status_code, 400);
    assert!(text(&missing).contains("missing-key"));
    assert_eq!(effects.rows().await.len(), 1, "only the first request ran");
    // Another caller with the same key and body is another request: it runs, and never gets
    // alice's response.
    let bob = api
        .handle(
            http_request_from(Some("bob"), Some(&key), r#"{"order_no":"A-1"}"#),
            |_| async { Ok::<_, IdemError>(created("bob's order".to_owned())) },
        )
        .await
        .unwrap();
    assert_eq!(text(&bob), "bob's order");
    // No caller: 401, nothing run.
    let nobody = api
        .handle(
            http_request_from(None, Some(&key), r#"{"order_no":"A-1"}"#),
            |_| async { Ok::<_, IdemError>(created("ran".to_owned())) },
        )
        .await
        .unwrap();
    assert_eq!(nobody.status_code, 401);
    assert!(text(&nobody).contains("no-principal"));
    // A 5xx answer is not stored: the retry runs the handler again.
    let key5 = server::unique("k5");
    assert_eq!(handle(Some(key5.clone()), "{}", 503).await.status_code, 503);
    assert_eq!(handle(Some(key5.clone()), "{}", 200).await.status_code, 200);
    assert_eq!(
        handle(Some(key5), "{}", 503).await.status_code,
        200,
        "the 200 was stored"
    );
    assert_eq!(effects.rows().await.len(), 3);
}
