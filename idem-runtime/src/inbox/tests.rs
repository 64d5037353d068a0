//! The inbox's verdicts, limits and batches, on the memory store.

use super::*;

fn inbox() -> Inbox {
    Inbox::builder()
        .max_attempts(3)
        .busy_delay(Duration::from_millis(50))
        .retry_delay(Duration::from_millis(100))
        .max_retry_delay(Duration::from_millis(250))
        .build()
        .unwrap()
}

#[test]
fn each_outcome_has_its_verdict() {
    let inbox = inbox();
    let v = |outcome, retryable, attempts| {
        inbox.verdict_for_error(Some(outcome), retryable, attempts, &"boom")
    };
    let busy = Verdict::Requeue {
        delay: Duration::from_millis(50),
    };
    assert_eq!(v(Outcome::InProgress, Some(true), 1), busy);
    assert_eq!(v(Outcome::LeaseLost, Some(true), 9), busy);
    assert_eq!(v(Outcome::MarkFailed, None, 9), busy);
    // A recover fn that could not tell: the claim is released for the next delivery to ask
    // again, so the message waits and comes back.
    assert_eq!(v(Outcome::RecoverFailed, None, 9), busy);
    assert_eq!(v(Outcome::VersionConflict, None, 9), busy);
    // A late redelivery of a message done long ago, whose result was dropped.
    assert_eq!(v(Outcome::ResultExpired, Some(false), 1), Verdict::Ack);
    assert!(matches!(
        v(Outcome::WrongState, None, 1),
        Verdict::DeadLetter { .. }
    ));
    assert!(matches!(
        v(Outcome::Mismatch, Some(false), 1),
        Verdict::DeadLetter { .. }
    ));
    assert!(matches!(
        v(Outcome::Rejected, Some(false), 1),
        Verdict::DeadLetter { .. }
    ));
    assert_eq!(v(Outcome::Rejected, Some(true), 1), busy);
    assert!(matches!(
        v(Outcome::Unstorable, Some(false), 1),
        Verdict::DeadLetter { .. }
    ));
    assert_eq!(
        v(Outcome::Failed, None, 1),
        Verdict::Requeue {
            delay: Duration::from_millis(100)
        }
    );
    assert_eq!(
        v(Outcome::Failed, None, 2),
        Verdict::Requeue {
            delay: Duration::from_millis(200)
        }
    );
    let Verdict::DeadLetter { reason } = v(Outcome::Failed, None, 3) else {
        panic!("the third failure of three is a dead letter");
    };
    assert_eq!(reason, "failed 3 times: boom");
    // An error with no idempotent call in it counts by the broker's deliveries alone.
    assert!(matches!(
        inbox.verdict_for_error(None, None, 3, &"boom"),
        Verdict::DeadLetter { .. }
    ));
}

#[test]
fn the_back_off_doubles_up_to_its_cap() {
    let inbox = Inbox::builder()
        .max_attempts(MAX_ATTEMPTS)
        .retry_delay(Duration::from_millis(100))
        .max_retry_delay(Duration::from_millis(250))
        .build()
        .unwrap();
    let delays: Vec<_> = (1..=4).map(|a| inbox.back_off(a).as_millis()).collect();
    assert_eq!(delays, [100, 200, 250, 250]);
    assert_eq!(inbox.back_off(u32::MAX), Duration::from_millis(250));
}

#[test]
fn every_value_out_of_range_is_refused_with_its_name() {
    let refused = |b: InboxBuilder| match b.build() {
        Err(IdemError::InvalidOptions { reason }) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(refused(Inbox::builder().max_attempts(0)).contains("max_attempts is 1 to 1000"));
    assert!(refused(Inbox::builder().max_attempts(1_001)).contains("max_attempts"));
    assert!(
        refused(Inbox::builder().busy_delay(MAX_DELAY + Duration::from_millis(1)))
            .contains("busy_delay")
    );
    assert!(
        refused(
            Inbox::builder()
                .retry_delay(Duration::from_secs(10))
                .max_retry_delay(Duration::from_secs(5))
        )
        .contains("shorter than retry_delay")
    );
    assert!(Inbox::builder().max_attempts(1).build().is_ok());
    assert!(Inbox::builder().busy_delay(MAX_DELAY).build().is_ok());
}

#[tokio::test]
async fn an_unreadable_payload_is_dead_lettered_without_calling_the_handler() {
    let inbox = inbox();
    let called = std::cell::Cell::new(false);
    let handled = inbox
        .handle_json(b"{not json", Some(1), |_: serde_json::Value| {
            called.set(true);
            async { Ok::<_, IdemError>(()) }
        })
        .await;
    assert!(!called.get());
    assert!(handled.result.is_none());
    let Verdict::DeadLetter { reason } = handled.verdict else {
        panic!("an unreadable payload is a dead letter");
    };
    assert!(reason.starts_with("unreadable payload: "), "{reason}");
}

#[tokio::test]
async fn a_batch_acks_a_message_once_its_mark_landed_and_requeues_one_whose_claim_was_lost() {
    use crate::store::{ClaimOutcome, ClaimRequest, Status, Store};
    use crate::{Call, MemoryStore, TestClock};
    let clock = TestClock::new();
    let store = MemoryStore::new().with_test_clock(clock.clone());
    let inbox = inbox();
    let lease = Duration::from_secs(5);
    let call = |key: &str| Call::new("SHIP", key).lease(lease);
    let batch = ["a", "b", "a"]
        .into_iter()
        .map(|k| BatchMessage::new(call(k), Some(1), k.to_owned()));
    let store_ref = &store;
    let (clock_ref, runs) = (&clock, std::cell::Cell::new(0));
    let handled = inbox
        .handle_batch(&store, batch, |key: String| {
            let runs = &runs;
            async move {
                runs.set(runs.get() + 1);
                if key == "b" {
                    // While b's mark is held back, its lease ends and another attempt takes
                    // the key over.
                    clock_ref.advance(Duration::from_secs(10));
                    let req = ClaimRequest {
                        biz: "SHIP",
                        key: "b",
                        fingerprint: None,
                        lease,
                        ttl: crate::DEFAULT_TTL,
                    };
                    assert!(matches!(
                        store_ref.claim(&req).await?,
                        ClaimOutcome::Acquired { .. }
                    ));
                }
                Ok::<_, IdemError>(format!("shipped {key}"))
            }
        })
        .await;
    assert_eq!(runs.get(), 2, "a's repeat replays, b runs once");
    assert_eq!(handled[0].verdict, Verdict::Ack);
    assert_eq!(handled[0].outcome, Some(Outcome::Executed));
    assert_eq!(
        handled[2].outcome,
        Some(Outcome::Replayed),
        "the repeat of a is run after a's mark was sent"
    );
    assert_eq!(
        handled[2].result.as_ref().unwrap().as_ref().unwrap(),
        "shipped a"
    );
    assert_eq!(handled[1].outcome, Some(Outcome::LeaseLost));
    assert!(matches!(handled[1].verdict, Verdict::Requeue { .. }));
    assert!(matches!(
        handled[1].result,
        Some(Err(IdemError::LeaseLost { .. }))
    ));
    let b = store.load("SHIP", "b").await.unwrap().unwrap();
    assert_eq!((b.status, b.attempt), (Status::Processing, 2));
    let a = store.load("SHIP", "a").await.unwrap().unwrap();
    assert_eq!(a.status, Status::Succeeded);
}

#[tokio::test]
async fn a_handler_that_makes_no_call_is_counted_by_the_brokers_deliveries() {
    let inbox = inbox();
    let fail = || async { Err::<(), _>("no call made") };
    let first = inbox.handle(Some(1), fail()).await;
    assert!(matches!(first.verdict, Verdict::Requeue { .. }));
    assert_eq!(first.outcome, None);
    let last = inbox.handle(Some(3), fail()).await;
    assert!(matches!(last.verdict, Verdict::DeadLetter { .. }));
    assert_eq!(last.attempts, 3);
    let ok = inbox.handle(None, async { Ok::<_, &str>(7) }).await;
    assert_eq!(ok.verdict, Verdict::Ack);
    assert_eq!(ok.result.unwrap().unwrap(), 7);
}
