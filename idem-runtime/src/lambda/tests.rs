use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lambda_runtime::{Context, LambdaEvent, Service};

use super::*;
use crate::MemoryStore;

fn context(left: Option<Duration>) -> Context {
    let mut context = Context::default();
    if let Some(left) = left {
        let deadline = SystemTime::now() + left;
        context.deadline = deadline.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    }
    context
}

#[test]
fn the_lease_is_the_time_left_until_the_deadline() {
    let lease = remaining_lease(&context(Some(Duration::from_secs(20)))).unwrap();
    assert!(
        lease <= Duration::from_secs(20) && lease > Duration::from_secs(19),
        "{lease:?}"
    );
    assert_eq!(
        remaining_lease(&context(Some(Duration::from_millis(10)))),
        Some(MIN_INVOCATION_LEASE)
    );
    assert_eq!(remaining_lease(&context(None)), None);
    let mut past = Context::default();
    past.deadline = 1;
    assert_eq!(remaining_lease(&past), Some(MIN_INVOCATION_LEASE));
}

#[test]
fn a_call_in_an_invocation_holds_its_key_until_the_deadline_without_a_heartbeat() {
    let call = call("PAY", "o-1", &context(Some(Duration::from_secs(5))));
    assert!(call.lease <= Duration::from_secs(5) && call.lease > Duration::from_secs(4));
    assert_eq!(call.heartbeat_every(), None);
    let outside = super::call("PAY", "o-1", &context(None));
    assert_eq!(outside.lease, crate::DEFAULT_LEASE);
}

#[test]
fn ttls_no_longer_than_an_invocation_are_refused() {
    for ttl in [
        Duration::from_secs(60),
        MAX_INVOCATION,
        crate::MAX_DURATION + Duration::from_secs(1),
    ] {
        let built = Idempotent::builder(MemoryStore::new(), "PAY", |e: &String| e.clone())
            .ttl(ttl)
            .build(|_: LambdaEvent<String>| async { Ok::<_, IdemError>(1) });
        assert!(
            matches!(built, Err(IdemError::InvalidOptions { .. })),
            "{ttl:?}"
        );
    }
    let bad_biz = Idempotent::builder(MemoryStore::new(), "PA Y", |e: &String| e.clone())
        .build(|_: LambdaEvent<String>| async { Ok::<_, IdemError>(1) });
    assert!(matches!(bad_biz, Err(IdemError::InvalidBiz { .. })));
}

#[tokio::test]
async fn a_repeat_gets_the_first_answer_and_another_payload_is_refused() {
    #[derive(serde::Deserialize, Clone)]
    struct Order {
        no: String,
        amount: u64,
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let mut handler = Idempotent::builder(MemoryStore::new(), "PAY", |o: &Order| o.no.clone())
        .validate(|o: &Order| o.amount)
        .build(move |event: LambdaEvent<Order>| {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            async move { Ok::<_, IdemError>(format!("{}#{n}", event.payload.no)) }
        })
        .unwrap();
    let order = Order {
        no: "o-1".into(),
        amount: 5,
    };
    let ctx = || context(Some(Duration::from_secs(30)));
    let first = handler
        .call(LambdaEvent::new(order.clone(), ctx()))
        .await
        .unwrap();
    let again = handler
        .call(LambdaEvent::new(order.clone(), ctx()))
        .await
        .unwrap();
    assert_eq!((first.as_str(), again.as_str()), ("o-1#1", "o-1#1"));
    let other = Order { amount: 6, ..order };
    let refused = handler.call(LambdaEvent::new(other, ctx())).await;
    assert!(
        matches!(refused, Err(IdemError::PayloadMismatch)),
        "{refused:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let empty = Order {
        no: String::new(),
        amount: 1,
    };
    let refused = handler.call(LambdaEvent::new(empty, ctx())).await;
    assert!(
        matches!(refused, Err(IdemError::InvalidKey { .. })),
        "{refused:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn refusals_reach_the_runtime_with_their_names() {
    let d = lambda_runtime::Diagnostic::from(IdemError::InProgress {
        retry_after: Duration::from_secs(2),
    });
    assert_eq!(d.error_type, "idem.in-progress");
    assert!(d.error_message.contains("in progress"));
    let d = lambda_runtime::Diagnostic::from(IdemError::PayloadMismatch);
    assert_eq!(d.error_type, "idem.payload-mismatch");
}
