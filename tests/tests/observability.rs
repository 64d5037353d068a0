//! What a call tells the outside: one `tracing` span per call with its outcome and attempt,
//! per-outcome counters, and store limits a deployment can tighten; and what it never tells: no raw
//! key, token or result in any span or event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{Call, IdemError, MemoryStore, Store, store::Limits};
use tracing::Instrument;
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

/// Held by each test while it has a subscriber of its own. tracing keeps one global level filter,
/// the most any live subscriber wants, and recomputes it as subscribers come and go; two tests
/// setting theirs at once on two threads can leave it at the other's level, and a test then sees
/// no span at all (seen once in CI, on a loaded machine).
static SUBSCRIBED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn subscribed() -> std::sync::MutexGuard<'static, ()> {
    SUBSCRIBED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `work` to its end on a current-thread runtime, with `subscriber` as this thread's.
fn under<S>(subscriber: S, work: impl std::future::Future<Output = ()>)
where
    S: tracing::Subscriber + Send + Sync + 'static,
{
    let _alone = subscribed();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || rt.block_on(work));
}

#[test]
fn every_call_is_a_span_with_its_outcome_and_attempt() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    under(subscriber, async {
        {
            let store = MemoryStore::new();
            call(&store, "a", false).await.unwrap(); // executed, attempt 1
            call(&store, "a", false).await.unwrap(); // replayed
            call(&store, "b", true).await.unwrap_err(); // failed, attempt 1
            call(&store, "b", false).await.unwrap(); // executed, attempt 2
            let held = store
                .claim(&idem::store::ClaimRequest {
                    biz: "TRACE",
                    key: "c",
                    fingerprint: None,
                    lease: Duration::from_secs(30),
                    ttl: Duration::from_secs(60),
                })
                .await
                .unwrap();
            assert!(matches!(held, idem::store::ClaimOutcome::Acquired { .. }));
            call(&store, "c", false).await.unwrap_err(); // in_progress
        }
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

// ---- nothing secret in spans or logs --------------------------------------------------------

/// Every span (its name, its fields, and what is recorded into it later) and every event (every
/// field, the message too), at every level, as text.
#[derive(Clone, Default)]
struct Everything(Arc<Mutex<Vec<String>>>);

struct AllFields<'a>(&'a mut String);

impl Visit for AllFields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        use std::fmt::Write;
        let _ = write!(self.0, " {}={value}", field.name());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        use std::fmt::Write;
        let _ = write!(self.0, " {}={value} ({value:?})", field.name());
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Everything {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        let mut line = format!("span {}", attrs.metadata().name());
        attrs.record(&mut AllFields(&mut line));
        self.0.lock().unwrap().push(line);
    }
    fn on_record(&self, _: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut line = "record".to_owned();
        values.record(&mut AllFields(&mut line));
        self.0.lock().unwrap().push(line);
    }
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        let mut line = format!("event {} {}", meta.level(), meta.target());
        event.record(&mut AllFields(&mut line));
        self.0.lock().unwrap().push(line);
    }
}

const SECRET_KEY: &str = "client-key-5f2c91";
const SECRET_RESULT: &str = "result-text-8d41e7";

#[derive(Debug, thiserror::Error)]
enum ObsError {
    #[error("declined")]
    Declined,
    #[error(transparent)]
    Idem(#[from] IdemError),
}

/// A subscriber that takes only warnings gets no `idem` span, and the call writes nothing into
/// the caller's span, even one with fields named as the call's.
#[test]
fn with_info_off_a_call_makes_no_span_and_leaves_the_callers_alone() {
    /// The fields recorded into every span after it was made, by span name.
    #[derive(Clone, Default)]
    struct Recorded(Arc<Mutex<Vec<(String, Fields)>>>);
    impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Recorded {
        fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
            let name = attrs.metadata().name().to_owned();
            self.0
                .lock()
                .unwrap()
                .push((format!("new {name}"), Fields::new()));
        }
        fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
            let mut fields = Fields::new();
            values.record(&mut Visitor(&mut fields));
            let name = ctx.span(id).map_or("?", |s| s.name()).to_owned();
            self.0
                .lock()
                .unwrap()
                .push((format!("record {name}"), fields));
        }
    }
    let recorded = Recorded::default();
    let subscriber = tracing_subscriber::registry()
        .with(recorded.clone())
        .with(tracing_subscriber::filter::LevelFilter::WARN);
    under(subscriber, async {
        {
            let store = MemoryStore::new();
            let caller = tracing::warn_span!(
                "handler",
                outcome = tracing::field::Empty,
                attempt = tracing::field::Empty
            );
            async {
                call(&store, "a", false).await.unwrap(); // executed
                call(&store, "a", false).await.unwrap(); // replayed
                call(&store, "b", true).await.unwrap_err(); // failed
            }
            .instrument(caller)
            .await;
        }
    });
    let seen = recorded.0.lock().unwrap().clone();
    assert_eq!(seen, vec![("new handler".to_owned(), Fields::new())]);
}

fn obs_setup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        idem::register_store("obs_mem", MemoryStore::new());
        idem::register_tokens("obs_tokens", idem::MemoryTokens::new());
    });
}

/// A scoped key through the attribute: the generated code's span must not carry it either.
#[idem::idempotent(biz = "OBSM", key = "(user_id, client_key)", store = "obs_mem")]
async fn scoped(user_id: u64, client_key: &str) -> Result<String, ObsError> {
    Ok(format!("{SECRET_RESULT}-{user_id}-{client_key}"))
}

struct Form {
    token: String,
    fail: bool,
}

#[idem::consume_token(token = "form.token", store = "obs_tokens", restore_on_err)]
async fn submit(form: &Form) -> Result<String, ObsError> {
    if form.fail {
        Err(ObsError::Declined)
    } else {
        Ok(SECRET_RESULT.to_owned())
    }
}

/// Calls that execute, replay, mismatch, fail, lose their lease, find one in progress, run in a
/// transaction and spend, reuse and restore submit tokens: whatever idem writes to `tracing`, at
/// any level, never holds a raw key, token or result.
#[test]
fn no_raw_key_token_or_result_reaches_spans_or_logs() {
    obs_setup();
    let all = Everything::default();
    let subscriber = tracing_subscriber::registry().with(all.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _alone = subscribed();
    let tokens: Vec<String> = tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            tracing::trace!(canary = "canary-0b7e", "the layer sees TRACE events");
            let clock = idem::TestClock::new();
            let store = MemoryStore::new().with_test_clock(clock.clone());
            let key = |suffix: &str| format!("{SECRET_KEY}-{suffix}");
            let result = |suffix: &str| format!("{SECRET_RESULT}-{suffix}");
            let run = |k: String, fp: &'static str, out: Result<String, ObsError>| {
                Call::new("OBS", &k)
                    .fingerprint(&fp)
                    .run(&store, async move { out })
            };
            // Executed, replayed, mismatch.
            run(key("a"), "p", Ok(result("a"))).await.unwrap();
            assert_eq!(
                run(key("a"), "p", Ok(result("x"))).await.unwrap(),
                result("a")
            );
            let mismatch = run(key("a"), "other", Ok(result("x"))).await;
            assert!(matches!(
                mismatch,
                Err(ObsError::Idem(IdemError::PayloadMismatch))
            ));
            // Failed, then executed on retry.
            run(key("f"), "p", Err(ObsError::Declined))
                .await
                .unwrap_err();
            run(key("f"), "p", Ok(result("f"))).await.unwrap();
            // Lease lost: the body outlives its lease and another call takes over meanwhile.
            let late = Call::new("OBS", &key("l"))
                .lease(Duration::from_secs(10))
                .ttl(Duration::from_secs(60))
                .run(&store, async {
                    clock.advance(Duration::from_secs(11));
                    let taker: Result<String, ObsError> = Call::new("OBS", &key("l"))
                        .lease(Duration::from_secs(10))
                        .ttl(Duration::from_secs(60))
                        .run(&store, async { Ok(result("taker")) })
                        .await;
                    taker.unwrap();
                    Ok::<_, ObsError>(result("late"))
                })
                .await;
            assert!(
                matches!(late, Err(ObsError::Idem(IdemError::LeaseLost { .. }))),
                "{late:?}"
            );
            // In progress.
            store
                .claim(&idem::store::ClaimRequest {
                    biz: "OBS",
                    key: &key("p"),
                    fingerprint: None,
                    lease: Duration::from_secs(30),
                    ttl: Duration::from_secs(60),
                })
                .await
                .unwrap();
            let busy = run(key("p"), "p", Ok(result("p"))).await;
            assert!(matches!(
                busy,
                Err(ObsError::Idem(IdemError::InProgress { .. }))
            ));
            // Through the attribute, with a key scoped by its caller: executed, then replayed.
            let first = scoped(7, SECRET_KEY).await.unwrap();
            assert_eq!(scoped(7, SECRET_KEY).await.unwrap(), first);
            // Transaction mode: executed, then replayed.
            #[cfg(feature = "sqlite")]
            {
                let sqlite = idem::SqliteStore::in_memory().await.unwrap();
                sqlite.migrate().await.unwrap();
                for _ in 0..2 {
                    let mut tx = sqlite.begin().await.unwrap();
                    let out: Result<String, ObsError> = Call::new("OBS", &key("tx"))
                        .run_in_tx(&mut tx, async |_tx| Ok(result("tx")))
                        .await;
                    assert_eq!(out.unwrap(), result("tx"));
                    tx.commit().await.unwrap();
                }
            }
            // Submit tokens: spent, spent again, and restored after a failed body.
            let tokens = idem::tokens("obs_tokens").unwrap();
            let spent = tokens.issue(Duration::from_secs(60), None).await.unwrap();
            let form = Form {
                token: spent.clone(),
                fail: false,
            };
            assert_eq!(submit(&form).await.unwrap(), SECRET_RESULT);
            let again = submit(&form).await;
            assert!(
                matches!(again, Err(ObsError::Idem(IdemError::TokenUsed))),
                "{again:?}"
            );
            let restored = tokens.issue(Duration::from_secs(60), None).await.unwrap();
            let failing = Form {
                token: restored.clone(),
                fail: true,
            };
            assert!(matches!(submit(&failing).await, Err(ObsError::Declined)));
            let unknown = Form {
                token: format!("{spent}00"),
                fail: false,
            };
            assert!(submit(&unknown).await.is_err());
            vec![spent, restored]
        })
    });
    let seen = all.0.lock().unwrap().join("\n");
    // The layer really saw every path (else the absence below would prove nothing).
    for shown in [
        "canary-0b7e",
        "outcome=executed",
        "outcome=replayed",
        "outcome=mismatch",
        "outcome=failed",
        "outcome=lease_lost",
        "outcome=in_progress",
        "span idem.consume_token",
        "outcome=used",
        "outcome=restored",
        "outcome=invalid",
        "biz=OBSM",
        "event ERROR",
    ] {
        assert!(seen.contains(shown), "{shown} not captured:\n{seen}");
    }
    let mut secrets = vec![SECRET_KEY.to_owned(), SECRET_RESULT.to_owned()];
    secrets.extend(tokens);
    for secret in &secrets {
        assert!(!seen.contains(secret.as_str()), "{secret} leaked:\n{seen}");
    }
}

#[tokio::test]
async fn a_tighter_key_limit_is_enforced_before_anything_is_written() {
    let store = MemoryStore::new()
        .with_limits(Limits {
            max_key_len: 8,
            ..Limits::default()
        })
        .unwrap();
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
    let store = MemoryStore::new()
        .with_limits(Limits {
            max_biz_len: 4,
            ..Limits::default()
        })
        .unwrap();
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
        (
            IdemError::busy(idem::error::Busy::Locked, "locked"),
            true,
            503,
        ),
        (
            IdemError::busy(idem::error::Busy::LockTimeout, "lock wait"),
            true,
            503,
        ),
        (
            IdemError::busy(idem::error::Busy::Deadlock, "deadlock"),
            true,
            409,
        ),
        (
            IdemError::busy(idem::error::Busy::Serialization, "serialization"),
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
