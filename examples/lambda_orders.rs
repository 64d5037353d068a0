//! An AWS Lambda function on DynamoDB: a payment handler made idempotent by the order number,
//! and an SQS consumer that answers only the records to deliver again.
//!
//! In Lambda (`AWS_LAMBDA_RUNTIME_API` set by the service), it serves the function named by
//! `IDEM_FUNCTION` (`pay`, the default, or `ship`) with `lambda_runtime::run`. Anywhere else it
//! invokes both handlers in process with the events Lambda would send, against the
//! DynamoDB-compatible server at `IDEM_DYNAMO_URL` (default `http://127.0.0.1:8000`, the moto
//! server of the repository's CI), and exits non-zero unless each order was paid and shipped once:
//!
//! ```text
//! cargo run --example lambda_orders --features lambda,dynamodb
//! ```
//!
//! The table is `IDEM_TABLE` (default `idem_lambda_orders`), created here when missing (in Lambda,
//! made beforehand with `idem migrate dynamodb://TABLE` or by the deployment); on AWS, the
//! function's role needs `dynamodb:GetItem`, `PutItem`, `UpdateItem`, `DeleteItem` and `Query`
//! on it and its index.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::lambda::events::sqs::{SqsBatchResponse, SqsEvent};
use idem::lambda::lambda_runtime::{self, Context, LambdaEvent, Service, service_fn};
use idem::lambda::{Idempotent, sqs::SqsBatch};
use idem::{DynamoStore, IdemError};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    order_no: String,
    amount_cents: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order_no: String,
    payment_id: String,
}

/// How many times the business ran, per handler: what this example checks.
static PAID: AtomicUsize = AtomicUsize::new(0);
static SHIPPED: AtomicUsize = AtomicUsize::new(0);

/// The business: charge the order (here, count it).
async fn pay(event: LambdaEvent<Order>) -> Result<Receipt, IdemError> {
    let n = PAID.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(Receipt {
        order_no: event.payload.order_no.clone(),
        payment_id: format!("pay-{}-{n}", event.payload.order_no),
    })
}

async fn ship(order: Order) -> Result<String, IdemError> {
    SHIPPED.fetch_add(1, Ordering::SeqCst);
    Ok(format!("shipped {}", order.order_no))
}

async fn store() -> Result<DynamoStore, IdemError> {
    let table = std::env::var("IDEM_TABLE").unwrap_or_else(|_| "idem_lambda_orders".to_owned());
    let url = match std::env::var("AWS_LAMBDA_RUNTIME_API") {
        Ok(_) => format!("dynamodb://{table}"),
        Err(_) => {
            let endpoint = std::env::var("IDEM_DYNAMO_URL")
                .unwrap_or_else(|_| "http://127.0.0.1:8000".to_owned());
            format!("dynamodb://{table}?endpoint={endpoint}")
        }
    };
    let store = DynamoStore::connect(&url).await?;
    if std::env::var("AWS_LAMBDA_RUNTIME_API").is_err() {
        // In Lambda the table is made once, by `idem migrate` or the deployment.
        store.migrate().await?;
    }
    Ok(store)
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let store = Arc::new(store().await?);
    let payments = Idempotent::builder(store.clone(), "PAY", |o: &Order| o.order_no.clone())
        // Another amount under a paid order number is refused, not answered with the first receipt.
        .validate(|o: &Order| o.amount_cents)
        .build(pay)?;
    let shipments = Arc::new(SqsBatch::builder(store, "SHIP").build()?);
    let consume = move |event: LambdaEvent<SqsEvent>| {
        let shipments = shipments.clone();
        async move {
            let response = shipments
                .handle_json(event, |o: &Order| o.order_no.clone(), ship)
                .await;
            Ok::<SqsBatchResponse, lambda_runtime::Error>(response)
        }
    };
    if std::env::var("AWS_LAMBDA_RUNTIME_API").is_ok() {
        return match std::env::var("IDEM_FUNCTION").as_deref() {
            Ok("ship") => lambda_runtime::run(service_fn(consume)).await,
            _ => lambda_runtime::run(payments).await,
        };
    }
    invoke_locally(payments, consume).await
}

/// The events Lambda would send, invoked in process: an order paid, then retried; an SQS batch
/// with the order twice, then delivered again.
async fn invoke_locally<S, C, F>(mut payments: S, consume: C) -> Result<(), lambda_runtime::Error>
where
    S: Service<LambdaEvent<Order>, Response = Receipt, Error = IdemError>,
    C: Fn(LambdaEvent<SqsEvent>) -> F,
    F: std::future::Future<Output = Result<SqsBatchResponse, lambda_runtime::Error>>,
{
    let run = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let order = Order {
        order_no: format!("ORD-{run}"),
        amount_cents: 1_250,
    };
    let first = payments
        .call(LambdaEvent::new(order.clone(), context()))
        .await?;
    let retry = payments
        .call(LambdaEvent::new(order.clone(), context()))
        .await?;
    println!("paid: {first:?}; the retry got: {retry:?}");
    let other = Order {
        amount_cents: 9_999,
        ..order.clone()
    };
    let refused = payments.call(LambdaEvent::new(other, context())).await;
    println!("another amount under {}: {refused:?}", order.order_no);

    let record = |id: &str| {
        serde_json::json!({
            "messageId": id,
            "body": serde_json::to_string(&order).unwrap(),
            "attributes": { "ApproximateReceiveCount": "1" },
            "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:eu-west-1:123456789012:orders",
        })
    };
    let batch: SqsEvent = serde_json::from_value(serde_json::json!({
        "Records": [record("m-1"), record("m-2")]
    }))?;
    let listed = consume(LambdaEvent::new(batch.clone(), context())).await?;
    let again = consume(LambdaEvent::new(batch, context())).await?;
    println!(
        "SQS: {} then {} records to deliver again",
        listed.batch_item_failures.len(),
        again.batch_item_failures.len()
    );

    let (paid, shipped) = (PAID.load(Ordering::SeqCst), SHIPPED.load(Ordering::SeqCst));
    println!("paid {paid} time(s), shipped {shipped} time(s)");
    let ok = first == retry
        && matches!(refused, Err(IdemError::PayloadMismatch))
        && listed.batch_item_failures.is_empty()
        && again.batch_item_failures.is_empty()
        && (paid, shipped) == (1, 1);
    if !ok {
        return Err("an order was not paid and shipped exactly once".into());
    }
    Ok(())
}

/// An invocation's context: 30 s to its deadline, as a function with a 30 s timeout gets.
fn context() -> Context {
    let mut context = Context::default();
    context.deadline = (SystemTime::now() + Duration::from_secs(30))
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    context
}
