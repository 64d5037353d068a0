//! The bad-input matrix: malformed inputs through idem's public API and idem-storm's flags, each
//! answered with a clear error and nothing half-written (rows of `idem_record` and `idem_token`
//! counted before and after).
//!
//! The table in `docs/BAD_INPUT.md` is generated from this test: it fails when the table is out of
//! date; `IDEM_BLESS=1 cargo test -p idem-storm --test bad_input` rewrites it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use idem::sqlx::{self, Row};
use idem::{Call, IdemError, ShardedStore, SqliteStore, Store, TokenStore, store::Limits};

/// One row of the matrix.
struct Row_ {
    area: &'static str,
    input: &'static str,
    answer: String,
    written: String,
}

async fn store() -> SqliteStore {
    let store = SqliteStore::in_memory().await.unwrap();
    store.migrate().await.unwrap();
    store
}

async fn rows(store: &SqliteStore) -> (i64, i64) {
    let count = |sql: &'static str| async move {
        sqlx::query(sql)
            .fetch_one(store.pool())
            .await
            .map_or(-1, |r| r.get::<i64, _>(0))
    };
    (
        count("SELECT COUNT(*) FROM idem_record").await,
        count("SELECT COUNT(*) FROM idem_token").await,
    )
}

/// Rows as they stood once a case's setup (a first call, an issued token) was done: what the bad
/// input is measured against.
static AFTER_SETUP: std::sync::Mutex<Option<(i64, i64)>> = std::sync::Mutex::new(None);

async fn setup_done(store: &SqliteStore) -> (i64, i64) {
    let now = rows(store).await;
    *AFTER_SETUP.lock().unwrap() = Some(now);
    now
}

fn written(before: (i64, i64), after: (i64, i64)) -> String {
    if before == after {
        "nothing".to_owned()
    } else {
        format!(
            "records {} → {}, tokens {} → {}",
            before.0, after.0, before.1, after.1
        )
    }
}

type Case = Box<dyn Fn(Arc<SqliteStore>) -> Pin<Box<dyn Future<Output = String>>>>;

fn case<F, Fut>(f: F) -> Case
where
    F: Fn(Arc<SqliteStore>) -> Fut + 'static,
    Fut: Future<Output = String> + 'static,
{
    Box::new(move |s| Box::pin(f(s)))
}

/// Runs an idempotent call returning `value` and says how it ended.
async fn call<T>(store: &dyn Store, call: Call, value: T) -> String
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    match call.run(store, async { Ok::<_, IdemError>(value) }).await {
        Ok(_) => "Ok".to_owned(),
        Err(e) => e.to_string(),
    }
}

fn api_cases() -> Vec<(&'static str, &'static str, Case)> {
    let long_key: &'static str = Box::leak("k".repeat(129).into_boxed_str());
    vec![
        (
            "key",
            "empty key",
            case(|s| async move { call(&*s, Call::new("PAY", ""), 1).await }),
        ),
        (
            "key",
            "key of spaces only",
            case(|s| async move { call(&*s, Call::new("PAY", "   "), 1).await }),
        ),
        (
            "key",
            "key of 129 bytes (limit 128)",
            case(move |s| async move { call(&*s, Call::new("PAY", long_key), 1).await }),
        ),
        (
            "key",
            "key with a NUL byte",
            case(|s| async move { call(&*s, Call::new("PAY", "a\0b"), 1).await }),
        ),
        (
            "biz",
            "empty biz",
            case(|s| async move { call(&*s, Call::new("", "k"), 1).await }),
        ),
        (
            "biz",
            "biz with a space",
            case(|s| async move { call(&*s, Call::new("PAY NOW", "k"), 1).await }),
        ),
        (
            "biz",
            "biz of 33 bytes (limit 32)",
            case(|s| async move { call(&*s, Call::new("P".repeat(33), "k"), 1).await }),
        ),
        (
            "biz",
            "biz with a NUL byte",
            case(|s| async move { call(&*s, Call::new("PA\0Y", "k"), 1).await }),
        ),
        (
            "biz",
            "biz of 11 CJK characters (33 bytes)",
            case(|s| async move {
                call(&*s, Call::new("支付支付支付支付支付支", "k"), 1).await
            }),
        ),
        (
            "options",
            "ttl equal to the lease",
            case(|s| async move {
                call(
                    &*s,
                    Call::new("PAY", "k")
                        .ttl(Duration::from_secs(30))
                        .lease(Duration::from_secs(30)),
                    1,
                )
                .await
            }),
        ),
        (
            "options",
            "ttl shorter than the lease",
            case(|s| async move {
                call(
                    &*s,
                    Call::new("PAY", "k")
                        .ttl(Duration::from_secs(1))
                        .lease(Duration::from_secs(30)),
                    1,
                )
                .await
            }),
        ),
        (
            "options",
            "lease of zero",
            case(
                |s| async move { call(&*s, Call::new("PAY", "k").lease(Duration::ZERO), 1).await },
            ),
        ),
        (
            "options",
            "heartbeat not shorter than the lease",
            case(|s| async move {
                call(
                    &*s,
                    Call::new("PAY", "k")
                        .lease(Duration::from_secs(1))
                        .heartbeat(Duration::from_secs(1)),
                    1,
                )
                .await
            }),
        ),
        (
            "options",
            "heartbeat of zero",
            case(
                |s| async move { call(&*s, Call::new("PAY", "k").heartbeat(Duration::ZERO), 1).await },
            ),
        ),
        (
            "options",
            "ttl of Duration::MAX",
            case(|s| async move { call(&*s, Call::new("PAY", "k").ttl(Duration::MAX), 1).await }),
        ),
        (
            "options",
            "lease one nanosecond over idem::MAX_DURATION",
            case(|s| async move {
                let over = idem::MAX_DURATION + Duration::from_nanos(1);
                call(&*s, Call::new("PAY", "k").lease(over).ttl(Duration::MAX), 1).await
            }),
        ),
        (
            "options",
            "wait of Duration::MAX",
            case(|s| async move { call(&*s, Call::new("PAY", "k").wait(Duration::MAX), 1).await }),
        ),
        (
            "options",
            "heartbeat of 1 ns",
            case(|s| async move {
                call(
                    &*s,
                    Call::new("PAY", "k").heartbeat(Duration::from_nanos(1)),
                    1,
                )
                .await
            }),
        ),
        (
            "options",
            "result ttl longer than the ttl",
            case(|s| async move {
                call(
                    &*s,
                    Call::new("PAY", "k")
                        .ttl(Duration::from_secs(60))
                        .result_ttl(Duration::from_secs(61)),
                    1,
                )
                .await
            }),
        ),
        (
            "options",
            "result ttl of zero",
            case(|s| async move {
                call(&*s, Call::new("PAY", "k").result_ttl(Duration::ZERO), 1).await
            }),
        ),
        (
            "options",
            "sweeper period of zero",
            case(|s| async move {
                idem::Sweeper::new(s.clone(), 100)
                    .spawn(Duration::ZERO)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default()
            }),
        ),
        (
            "payload",
            "fingerprint of a map with non-string keys",
            case(|s| async move {
                let payload: HashMap<(u8, u8), u8> = HashMap::from([((1, 2), 3)]);
                call(&*s, Call::new("PAY", "k").fingerprint(&payload), 1).await
            }),
        ),
        (
            "payload",
            "same key, different payload",
            case(|s| async move {
                call(&*s, Call::new("PAY", "k").fingerprint(&1), 1).await;
                let before = setup_done(&s).await;
                let answer = call(&*s, Call::new("PAY", "k").fingerprint(&2), 1).await;
                assert_eq!(rows(&s).await, before);
                format!("{answer} (after a first call with another payload)")
            }),
        ),
        (
            "result",
            "result over the snapshot limit",
            case(|s| async move {
                let small = SqliteStore::from_pool(s.pool().clone())
                    .with_limits(Limits {
                        max_snapshot_len: 16,
                        ..Limits::default()
                    })
                    .unwrap();
                call(&small, Call::new("PAY", "big"), "x".repeat(100)).await
            }),
        ),
        (
            "result",
            "result that cannot be serialized",
            case(|s| async move {
                let value: HashMap<(u8, u8), u8> = HashMap::from([((1, 2), 3)]);
                call(&*s, Call::new("PAY", "unser"), value).await
            }),
        ),
        (
            "result",
            "stored result of another type",
            case(|s| async move {
                call(&*s, Call::new("PAY", "typed"), 7u32).await;
                let before = setup_done(&s).await;
                let answer = call(&*s, Call::new("PAY", "typed"), "text".to_owned()).await;
                assert_eq!(rows(&s).await, before);
                format!("{answer} (a `u32` stored, a `String` asked for)")
            }),
        ),
        (
            "store",
            "unregistered store name",
            case(|_| async move {
                idem::store("nosuch")
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default()
            }),
        ),
        (
            "store",
            "closed pool",
            case(|_| async move {
                let closed = store().await;
                closed.pool().close().await;
                call(&closed, Call::new("PAY", "k"), 1).await
            }),
        ),
        (
            "store",
            "database without the table (no migrate())",
            case(|_| async move {
                let bare = SqliteStore::in_memory().await.unwrap();
                call(&bare, Call::new("PAY", "k"), 1).await
            }),
        ),
        (
            "store",
            "a table of another shape",
            case(|_| async move {
                let odd = SqliteStore::in_memory().await.unwrap();
                sqlx::query("CREATE TABLE idem_record (id INTEGER PRIMARY KEY, note TEXT)")
                    .execute(odd.pool())
                    .await
                    .unwrap();
                call(&odd, Call::new("PAY", "k"), 1).await
            }),
        ),
        (
            "store",
            "sharded store over no shards",
            case(|_| async move {
                ShardedStore::<SqliteStore>::new(Vec::new())
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default()
            }),
        ),
        (
            "tokens",
            "malformed token",
            case(|s| async move {
                s.tokens()
                    .consume("not-a-token", None)
                    .await
                    .unwrap_err()
                    .to_string()
            }),
        ),
        (
            "tokens",
            "oversized token",
            case(|s| async move {
                s.tokens()
                    .consume(&"a".repeat(4096), None)
                    .await
                    .unwrap_err()
                    .to_string()
            }),
        ),
        (
            "tokens",
            "unknown token",
            case(|s| async move {
                s.tokens()
                    .consume(&"0".repeat(48), None)
                    .await
                    .unwrap_err()
                    .to_string()
            }),
        ),
        (
            "tokens",
            "token of another subject",
            case(|s| async move {
                let t = s
                    .tokens()
                    .issue(Duration::from_secs(60), Some("alice"))
                    .await
                    .unwrap();
                let before = setup_done(&s).await;
                let answer = s
                    .tokens()
                    .consume(&t, Some("bob"))
                    .await
                    .unwrap_err()
                    .to_string();
                assert_eq!(rows(&s).await, before);
                answer
            }),
        ),
        (
            "tokens",
            "restore of a token never spent",
            case(|s| async move {
                let t = s
                    .tokens()
                    .issue(Duration::from_secs(60), None)
                    .await
                    .unwrap();
                setup_done(&s).await;
                s.tokens().restore(&t, None).await.unwrap_err().to_string()
            }),
        ),
        (
            "tokens",
            "token issued for zero time",
            case(|s| async move {
                s.tokens()
                    .issue(Duration::ZERO, None)
                    .await
                    .unwrap_err()
                    .to_string()
            }),
        ),
        (
            "tokens",
            "token issued for Duration::MAX",
            case(|s| async move {
                s.tokens()
                    .issue(Duration::MAX, None)
                    .await
                    .unwrap_err()
                    .to_string()
            }),
        ),
        (
            "tokens",
            "subject of 129 bytes (limit 128)",
            case(|s| async move {
                s.tokens()
                    .issue(Duration::from_secs(60), Some(&"s".repeat(129)))
                    .await
                    .unwrap_err()
                    .to_string()
            }),
        ),
        (
            "tokens",
            "token spent twice",
            case(|s| async move {
                let t = s
                    .tokens()
                    .issue(Duration::from_secs(60), None)
                    .await
                    .unwrap();
                s.tokens().consume(&t, None).await.unwrap();
                let before = setup_done(&s).await;
                let answer = s.tokens().consume(&t, None).await.unwrap_err().to_string();
                assert_eq!(rows(&s).await, before);
                answer
            }),
        ),
    ]
}

/// idem-storm's flags: the clap parse and the cross-flag checks the binary runs before it starts.
fn flag_cases() -> Vec<(&'static str, String)> {
    let cases: &[&'static str] = &[
        "--dup-rate 1.5",
        "--dup-rate x",
        "-c 0",
        "-n 0",
        "--lease soon",
        "--lease 1s --ttl 1s",
        "--lease 1ms",
        "--ttl 31d",
        "--result-ttl 11m",
        "--result-ttl 0s",
        "--error-rate 0.6 --panic-rate 0.6",
        "--store memory --mode tx",
        "--store redis-cluster",
        "--store nosuch",
        "--seed -1",
        "--store-timeout 0s",
        "--chaos 500ms --store postgres",
        "--chaos 1m --store sqlite",
        "--chaos 1m --store redis --workers 0",
        "--chaos 1m --store redis --faults nosuch",
    ];
    cases
        .iter()
        .map(|flags| {
            let argv = std::iter::once("idem-storm").chain(flags.split(' '));
            let answer = match idem_storm::Args::try_parse_from(argv) {
                Err(e) => e
                    .render()
                    .to_string()
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim_start_matches("error: ")
                    .to_owned(),
                Ok(args) => args.check().err().unwrap_or_else(|| "accepted".to_owned()),
            };
            (*flags, answer)
        })
        .collect()
}

fn table(rows: &[Row_]) -> String {
    let mut out = String::from("| # | Area | Input | Answer | Written |\n|---|---|---|---|---|\n");
    for (i, r) in rows.iter().enumerate() {
        let cell = |s: &str| {
            s.replace('|', "\\|")
                .replace('\n', " ")
                .replace('\0', "\\0")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            i + 1,
            r.area,
            cell(r.input),
            cell(&r.answer),
            r.written
        ));
    }
    out
}

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/BAD_INPUT.md");
const BEGIN: &str = "<!-- matrix: generated by idem-storm/tests/bad_input.rs -->\n";
const END: &str = "<!-- end of matrix -->";

#[tokio::test]
async fn bad_inputs_get_clear_errors_and_write_nothing() {
    let mut matrix = Vec::new();
    for (area, input, run) in api_cases() {
        let s = Arc::new(store().await);
        let before = setup_done(&s).await;
        let answer = run(s.clone()).await;
        let before = AFTER_SETUP.lock().unwrap().take().unwrap_or(before);
        let after = rows(&s).await;
        assert!(
            !answer.is_empty() && answer != "Ok",
            "{input}: accepted ({answer})"
        );
        matrix.push(Row_ {
            area,
            input,
            answer,
            written: written(before, after),
        });
    }
    for (flags, answer) in flag_cases() {
        assert_ne!(answer, "accepted", "idem-storm {flags}");
        matrix.push(Row_ {
            area: "idem-storm",
            input: Box::leak(format!("`{flags}`").into_boxed_str()),
            answer,
            written: "nothing (no storm)".to_owned(),
        });
    }
    assert!(matrix.len() >= 30, "{} rows", matrix.len());

    // Only the result rows write: the body ran, so its claim is kept as done with the reason
    // (repeats get the same error instead of running the business again).
    for r in &matrix {
        let writes = r.written != "nothing" && r.written != "nothing (no storm)";
        assert_eq!(
            writes,
            r.area == "result" && !r.input.contains("another type"),
            "{}: {}",
            r.input,
            r.written
        );
    }

    let generated = table(&matrix);
    let doc = std::fs::read_to_string(DOC).unwrap_or_default();
    let current = doc
        .split_once(BEGIN)
        .and_then(|(_, rest)| rest.split_once(END))
        .map(|(t, _)| t.to_owned());
    if current.as_deref() != Some(generated.as_str()) {
        if std::env::var("IDEM_BLESS").as_deref() == Ok("1") {
            let (head, tail) = match doc.split_once(BEGIN) {
                Some((head, rest)) => (
                    head.to_owned(),
                    rest.split_once(END).map_or("", |(_, t)| t).to_owned(),
                ),
                None => (doc.clone(), "\n".to_owned()),
            };
            std::fs::write(DOC, format!("{head}{BEGIN}{generated}{END}{tail}")).unwrap();
        } else {
            panic!(
                "docs/BAD_INPUT.md is out of date; rerun with IDEM_BLESS=1. The matrix now reads:\n{generated}"
            );
        }
    }
}
