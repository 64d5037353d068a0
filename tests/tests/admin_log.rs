//! What a release or a mark of failure by hand (`idem::admin::{release, mark_failed}`, `idem
//! release`) logs: one `tracing` warning each with the business type, the reason and the fence, and never the key (idem's rule: no span or
//! event carries a key, a token or a result).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::admin::{self, Release, Released};
use idem::{
    MemoryStore, Store,
    store::{ClaimOutcome, ClaimRequest},
};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};

type Fields = HashMap<String, String>;

/// Every event's level and fields.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<(tracing::Level, Fields)>>>);

struct Visitor<'a>(&'a mut Fields);

impl Visit for Visitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Events {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::new();
        event.record(&mut Visitor(&mut fields));
        self.0
            .lock()
            .unwrap()
            .push((*event.metadata().level(), fields));
    }
}

#[test]
fn a_release_logs_biz_reason_and_fence_but_not_the_key() {
    const KEY: &str = "SECRET-KEY-4711";
    let events = Events::default();
    let subscriber = tracing_subscriber::registry().with(events.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let fence = tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            let store = MemoryStore::new();
            let req = ClaimRequest {
                biz: "PAY",
                key: KEY,
                fingerprint: None,
                lease: Duration::from_secs(30),
                ttl: Duration::from_secs(3600),
            };
            let ClaimOutcome::Acquired { claim, .. } = store.claim(&req).await.unwrap() else {
                panic!("a fresh key is acquired");
            };
            store.release("PAY", KEY, &claim).await.unwrap();
            let opts = Release {
                reason: "INC-9: worker died",
                force: false,
            };
            let done = admin::release(&store, "PAY", KEY, opts).await.unwrap();
            assert!(matches!(done, Released::LeaseEnded { .. }), "{done:?}");
            let done = admin::mark_failed(&store, "PAY", KEY, opts).await.unwrap();
            assert!(matches!(done, Released::Failed { .. }), "{done:?}");
            claim.fence
        })
    });
    let events = events.0.lock().unwrap();
    let warned: Vec<&Fields> = events
        .iter()
        .filter(|(level, _)| *level == tracing::Level::WARN)
        .map(|(_, f)| f)
        .collect();
    assert_eq!(warned.len(), 2, "a release, a mark of failure: {events:?}");
    for fields in &warned {
        assert_eq!(fields.get("biz").map(String::as_str), Some("PAY"));
        assert_eq!(
            fields.get("reason").map(String::as_str),
            Some("INC-9: worker died")
        );
        assert_eq!(fields.get("fence"), Some(&fence.get().to_string()));
    }
    assert!(
        warned[1]
            .get("message")
            .is_some_and(|m| m.contains("without asking recover")),
        "{warned:?}"
    );
    for (_, fields) in events.iter() {
        for (name, value) in fields {
            assert!(!value.contains(KEY), "{name} = {value} carries the key");
        }
    }
}
