//! What a call tells the outside: one `tracing` span per call with its outcome and attempt,
//! per-outcome counters, and store limits a deployment can tighten.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{Call, IdemError, Limits, MemoryStore, Store};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

type Fields = HashMap<String, String>;

/// Collects every `idem` span's fields, keyed by span id, in the order spans were created.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<(u64, Fields)>>>);

struct Visitor<'a>(&'a mut Fields);

impl Visit for Visitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        if attrs.metadata().name() == "idem" {
            let mut fields = Fields::new();
            attrs.record(&mut Visitor(&mut fields));
            self.0.lock().unwrap().push((id.into_u64(), fields));
        }
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = self.0.lock().unwrap();
        if let Some((_, fields)) = spans.iter_mut().rev().find(|(i, _)| *i == id.into_u64()) {
            values.record(&mut Visitor(fields));
        }
    }
}

async fn call(store: &MemoryStore, key: &str, fail: bool) -> Result<u32, IdemError> {
    Call::new("TRACE", key)
        .run(store, async move {
            if fail {
                Err(IdemError::store("business said no"))
            } else {
                Ok(7)
            }
        })
        .await
}

#[test]
fn every_call_is_a_span_with_its_outcome_and_attempt() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            let store = MemoryStore::new();
            call(&store, "a", false).await.unwrap(); // executed, attempt 1
            call(&store, "a", false).await.unwrap(); // replayed
            call(&store, "b", true).await.unwrap_err(); // failed, attempt 1
            call(&store, "b", false).await.unwrap(); // executed, attempt 2
            let held = store
                .claim(&idem::ClaimRequest {
                    biz: "TRACE",
                    key: "c",
                    fingerprint: None,
                    lease: Duration::from_secs(30),
                    ttl: Duration::from_secs(60),
                })
                .await
                .unwrap();
            assert!(matches!(held, idem::ClaimOutcome::Acquired { .. }));
            call(&store, "c", false).await.unwrap_err(); // in_progress
        })
    });
    let seen: Vec<(String, Option<String>, Option<String>)> = spans
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|(_, f)| {
            (
                f["biz"].clone(),
                f.get("outcome").cloned(),
                f.get("attempt").cloned(),
            )
        })
        .collect();
    let expect = |outcome: &str, attempt: Option<&str>| {
        (
            "TRACE".to_owned(),
            Some(outcome.to_owned()),
            attempt.map(str::to_owned),
        )
    };
    assert_eq!(
        seen,
        vec![
            expect("executed", Some("1")),
            expect("replayed", None),
            expect("failed", Some("1")),
            expect("executed", Some("2")),
            expect("in_progress", None),
        ]
    );
}

#[tokio::test]
async fn a_tighter_key_limit_is_enforced_before_anything_is_written() {
    let store = MemoryStore::with_limits(Limits {
        max_key_len: 8,
        ..Limits::default()
    });
    let too_long = call(&store, "123456789", false).await;
    assert!(
        matches!(too_long, Err(IdemError::InvalidKey { .. })),
        "{too_long:?}"
    );
    assert!(store.load("TRACE", "123456789").await.unwrap().is_none());
    assert_eq!(call(&store, "12345678", false).await.unwrap(), 7);
}

#[tokio::test]
async fn a_store_may_refuse_long_business_types() {
    let store = MemoryStore::with_limits(Limits {
        max_biz_len: 4,
        ..Limits::default()
    });
    let res: Result<u32, IdemError> = Call::new("TRACE", "k").run(&store, async { Ok(1) }).await;
    assert!(matches!(res, Err(IdemError::InvalidBiz { .. })), "{res:?}");
    assert!(store.load("TRACE", "k").await.unwrap().is_none());
}

#[tokio::test]
async fn a_ttl_not_longer_than_the_lease_is_refused() {
    let store = MemoryStore::new();
    let res: Result<u32, IdemError> = Call::new("TRACE", "k")
        .ttl(Duration::from_secs(1))
        .lease(Duration::from_secs(1))
        .run(&store, async { Ok(1) })
        .await;
    match res {
        Err(e @ IdemError::InvalidOptions { .. }) => assert_eq!(e.http_status(), 500),
        other => panic!("expected InvalidOptions, got {other:?}"),
    }
    assert!(store.load("TRACE", "k").await.unwrap().is_none());
}

#[test]
fn errors_say_whether_a_retry_can_help_and_which_http_status_fits() {
    let cases = [
        (
            IdemError::InProgress {
                retry_after: Duration::from_secs(1),
            },
            true,
            409,
        ),
        (IdemError::PayloadMismatch, false, 422),
        (
            IdemError::InvalidKey {
                reason: "empty".into(),
            },
            false,
            400,
        ),
        (IdemError::LeaseLost { attempt: 1 }, true, 409),
        (IdemError::unavailable("down"), true, 503),
        (IdemError::busy(idem::Busy::Locked, "locked"), true, 503),
        (
            IdemError::busy(idem::Busy::LockTimeout, "lock wait"),
            true,
            503,
        ),
        (IdemError::busy(idem::Busy::Deadlock, "deadlock"), true, 409),
        (
            IdemError::busy(idem::Busy::Serialization, "serialization"),
            true,
            409,
        ),
        (
            IdemError::StoreSchema {
                hint: "run migrate()".into(),
                source: "no such table".into(),
            },
            false,
            500,
        ),
        (IdemError::store("bad row"), false, 500),
        (IdemError::UnknownStore { name: "x".into() }, false, 500),
        (
            IdemError::NotSupported {
                backend: "memory",
                what: "state transitions",
            },
            false,
            500,
        ),
    ];
    for (e, retry, status) in cases {
        assert_eq!((e.is_retryable(), e.http_status()), (retry, status), "{e}");
    }
}
