//! `#[idempotent]` end to end, as a user writes it: free fns, methods, stores by name and by
//! expression, composite keys, replay reports and counters.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use idem::metrics::Outcome;
use idem::{IdemError, MemoryStore, Store, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error("business failed")]
    Business,
    #[error(transparent)]
    Idem(#[from] IdemError),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Transfer {
    user_id: u64,
    client_req_id: String,
    cents: u64,
}

static RUNS: AtomicU32 = AtomicU32::new(0);

fn setup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| idem::register_store("macro_mem", MemoryStore::new()));
}

#[idempotent(
    biz = "XFER",
    key = "(t.user_id, t.client_req_id)",
    store = "macro_mem",
    fingerprint = "t"
)]
async fn transfer(t: &Transfer) -> Result<u32, AppError> {
    Ok(RUNS.fetch_add(1, Ordering::SeqCst))
}

#[tokio::test]
async fn composite_key_runs_once_and_reports_the_replay() {
    setup();
    let t = Transfer {
        user_id: 7,
        client_req_id: "c-1".into(),
        cents: 500,
    };
    let (first, r1) = idem::metrics::observe(transfer(&t)).await;
    let (second, r2) = idem::metrics::observe(transfer(&t)).await;
    assert_eq!(first.unwrap(), second.unwrap());
    assert_eq!(r1.unwrap().outcome, Outcome::Executed);
    assert!(r2.unwrap().replayed());
    // Another user with the same client request id is another record.
    let other = Transfer {
        user_id: 8,
        ..t.clone()
    };
    let third = transfer(&other).await.unwrap();
    assert_ne!(third, second_value(&t).await);
    // Same key, other payload: refused.
    let tampered = Transfer { cents: 1, ..t };
    assert!(matches!(
        transfer(&tampered).await,
        Err(AppError::Idem(IdemError::PayloadMismatch))
    ));
}

async fn second_value(t: &Transfer) -> u32 {
    transfer(t).await.unwrap()
}

struct Ledger {
    store: Arc<MemoryStore>,
    runs: AtomicU32,
}

impl Ledger {
    #[idempotent(biz = "POST", key = entry_id, store = self.store)]
    async fn post(&self, entry_id: &str, fail: bool) -> Result<u32, AppError> {
        if fail {
            return Err(AppError::Business);
        }
        Ok(self.runs.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

#[tokio::test]
async fn method_with_store_expression_fails_then_retries() {
    let ledger = Ledger {
        store: Arc::new(MemoryStore::new()),
        runs: AtomicU32::new(0),
    };
    assert!(matches!(
        ledger.post("e-1", true).await,
        Err(AppError::Business)
    ));
    assert_eq!(
        ledger
            .store
            .load("POST", "e-1")
            .await
            .unwrap()
            .unwrap()
            .status,
        idem::store::Status::Failed
    );
    assert_eq!(ledger.post("e-1", false).await.unwrap(), 1);
    assert_eq!(
        ledger.post("e-1", false).await.unwrap(),
        1,
        "replayed, not run again"
    );
    assert_eq!(ledger.runs.load(Ordering::SeqCst), 1);
}

#[idempotent(biz = "GHOST", key = "id", store = "never_registered")]
async fn ghost(id: u64) -> Result<u64, AppError> {
    RUNS.fetch_add(1000, Ordering::SeqCst);
    Ok(id)
}

#[tokio::test]
async fn unknown_store_name_is_a_clear_error_and_nothing_runs() {
    let before = RUNS.load(Ordering::SeqCst);
    let res = ghost(1).await;
    match res {
        Err(AppError::Idem(IdemError::UnknownStore { name })) => {
            assert_eq!(name, "never_registered")
        }
        other => panic!("expected UnknownStore, got {other:?}"),
    }
    assert!(
        RUNS.load(Ordering::SeqCst) - before < 1000,
        "the body must not run"
    );
}

#[idempotent(biz = "TYPO", key = "id", store = "macro_mam")]
async fn misspelled(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[tokio::test]
async fn a_misspelled_store_name_is_told_the_registered_one() {
    setup();
    let err = misspelled(1).await.unwrap_err().to_string();
    assert!(
        err.contains("no store is registered as `macro_mam`; did you mean `macro_mem`?")
            && err.contains("(registered: ")
            && err.contains("`macro_mem`"),
        "{err}"
    );
}

#[idempotent(biz = "CNT", key = "n", store = "macro_mem")]
async fn counted(n: u32) -> Result<u32, AppError> {
    Ok(n * 2)
}

#[tokio::test]
async fn counters_give_the_duplicate_rate() {
    setup();
    let before = idem::metrics::counts_for("CNT");
    for n in 0..10 {
        counted(n).await.unwrap();
        counted(n).await.unwrap();
    }
    let c = idem::metrics::counts_for("CNT").since(&before);
    assert_eq!(
        (c.get(Outcome::Executed), c.get(Outcome::Replayed)),
        (10, 10)
    );
    assert!((c.duplicate_rate() - 0.5).abs() < 1e-9);
}

#[idempotent(biz = "KEYS", key = "k", store = "macro_mem")]
async fn with_key(k: &str) -> Result<String, AppError> {
    Ok(k.to_uppercase())
}

#[tokio::test]
async fn bad_runtime_keys_are_refused_through_the_macro() {
    setup();
    for k in ["", " ", "a\0"] {
        assert!(
            matches!(
                with_key(k).await,
                Err(AppError::Idem(IdemError::InvalidKey { .. }))
            ),
            "{k:?}"
        );
    }
    assert_eq!(with_key("ok").await.unwrap(), "OK");
}

/// Who is calling: in a service, from the session or the verified token, never from the body.
struct Caller {
    id: u64,
}

#[derive(Serialize, Deserialize)]
struct CreateOrder {
    client_req_id: String,
    item: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    user: u64,
    item: String,
}

static SCOPED_RUNS: AtomicU32 = AtomicU32::new(0);
static UNSCOPED_RUNS: AtomicU32 = AtomicU32::new(0);

#[idempotent(
    biz = "ORDER",
    key = "(caller.id, req.client_req_id)",
    store = "macro_mem"
)]
async fn create_order(caller: &Caller, req: &CreateOrder) -> Result<Order, AppError> {
    SCOPED_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(Order {
        user: caller.id,
        item: req.item.clone(),
    })
}

#[idempotent(biz = "ORDER_UNSCOPED", key = "req.client_req_id", store = "macro_mem")]
async fn create_order_unscoped(caller: &Caller, req: &CreateOrder) -> Result<Order, AppError> {
    UNSCOPED_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(Order {
        user: caller.id,
        item: req.item.clone(),
    })
}

/// Two users who send the same client request id each run once and each get their own answer when
/// the key is scoped by the caller; without the caller in the key the second user would be handed
/// the first one's order.
#[tokio::test]
async fn a_key_scoped_by_its_caller_keeps_callers_apart() {
    setup();
    let (alice, bob) = (Caller { id: 1 }, Caller { id: 2 });
    let req = |item: &str| CreateOrder {
        client_req_id: "req-1".into(),
        item: item.into(),
    };
    let order = |user, item: &str| Order {
        user,
        item: item.into(),
    };
    assert_eq!(
        create_order(&alice, &req("book")).await.unwrap(),
        order(1, "book")
    );
    assert_eq!(
        create_order(&bob, &req("lamp")).await.unwrap(),
        order(2, "lamp")
    );
    for (caller, item, user) in [(&alice, "book", 1), (&bob, "lamp", 2)] {
        let (again, report) = idem::metrics::observe(create_order(caller, &req(item))).await;
        assert_eq!(
            again.unwrap(),
            order(user, item),
            "each caller replays its own"
        );
        assert!(report.unwrap().replayed());
    }
    assert_eq!(SCOPED_RUNS.load(Ordering::SeqCst), 2, "one run per caller");

    // The hazard the scope prevents: the same client key from another caller replays the first.
    let first = create_order_unscoped(&alice, &req("book")).await.unwrap();
    let leaked = create_order_unscoped(&bob, &req("lamp")).await.unwrap();
    assert_eq!(leaked, first, "bob is handed alice's order");
    assert_eq!(UNSCOPED_RUNS.load(Ordering::SeqCst), 1);
}

/// The longest literal the macro accepts (`"3650d"`, `tests/ui/idempotent_duration_too_long.rs`
/// refuses one day more) is the runtime's `MAX_DURATION`: the call runs, on a record that lives
/// that long.
#[idempotent(
    biz = "LONG",
    key = "id",
    store = "macro_mem",
    ttl = "3650d",
    on_in_progress = "wait(3650d)"
)]
async fn kept_for_ten_years(id: &str) -> Result<u32, AppError> {
    Ok(RUNS.fetch_add(1, Ordering::SeqCst))
}

#[tokio::test]
async fn the_longest_literal_is_the_runtimes_maximum() {
    setup();
    assert_eq!(
        idem::MAX_DURATION,
        std::time::Duration::from_secs(3650 * 86_400)
    );
    let first = kept_for_ten_years("k-max").await.unwrap();
    assert_eq!(
        kept_for_ten_years("k-max").await.unwrap(),
        first,
        "replayed"
    );
    let store = idem::store("macro_mem").unwrap();
    let record = store.load("LONG", "k-max").await.unwrap().unwrap();
    let days_left = (record.expire_at_ms - record.lease_until_ms) / 86_400_000;
    assert!((3649..=3650).contains(&days_left), "{record:?}");
}

/// `heartbeat` is on by default (a third of the lease): a body slower than its lease keeps its
/// claim. `heartbeat = "off"` turns it off: the same body is taken over by a repeat while it runs.
#[idempotent(
    biz = "BEAT",
    key = "key",
    store = "macro_mem",
    lease = "300ms",
    ttl = "1m"
)]
async fn slow_with_default_heartbeat(key: &str) -> Result<String, AppError> {
    tokio::time::sleep(std::time::Duration::from_millis(900)).await;
    Ok("slow".to_owned())
}

#[idempotent(
    biz = "BEAT",
    key = "key",
    store = "macro_mem",
    lease = "300ms",
    ttl = "1m",
    heartbeat = "off"
)]
async fn slow_without_heartbeat(key: &str) -> Result<String, AppError> {
    tokio::time::sleep(std::time::Duration::from_millis(900)).await;
    Ok("slow".to_owned())
}

#[idempotent(
    biz = "BEAT",
    key = "key",
    store = "macro_mem",
    lease = "300ms",
    ttl = "1m"
)]
async fn quick_repeat(key: &str) -> Result<String, AppError> {
    Ok("repeat ran".to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_is_on_by_default_and_off_on_request() {
    setup();
    let first = tokio::spawn(slow_with_default_heartbeat("on"));
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let repeat = quick_repeat("on").await;
    assert!(
        matches!(repeat, Err(AppError::Idem(IdemError::InProgress { .. }))),
        "the default heartbeat kept the claim: {repeat:?}"
    );
    assert_eq!(first.await.unwrap().unwrap(), "slow");

    let first = tokio::spawn(slow_without_heartbeat("off"));
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        quick_repeat("off").await.unwrap(),
        "repeat ran",
        "taken over"
    );
    let late = first.await.unwrap();
    assert!(
        matches!(late, Err(AppError::Idem(IdemError::LeaseLost { .. }))),
        "{late:?}"
    );
}

/// What the "real business" recorded, by order: the effect a recover fn looks up.
static PAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
static ASKED: AtomicU32 = AtomicU32::new(0);

async fn find_payment(order_no: &str) -> Result<Option<String>, AppError> {
    ASKED.fetch_add(1, Ordering::SeqCst);
    let paid = PAID.lock().unwrap().iter().any(|o| o == order_no);
    Ok(paid.then(|| format!("found {order_no}")))
}

#[idempotent(
    biz = "RECOVER",
    key = "order_no",
    store = "macro_mem",
    lease = "200ms",
    ttl = "1m",
    heartbeat = "off",
    recover = "find_payment(order_no)"
)]
async fn charge(order_no: &str, hang: bool) -> Result<String, AppError> {
    PAID.lock().unwrap().push(order_no.to_owned());
    if hang {
        // The holder "dies" after its effect: it never returns, so its mark never lands.
        std::future::pending::<()>().await;
    }
    Ok(format!("charged {order_no}"))
}

/// `recover = "…"`: a takeover asks it first; what it finds is stored and replayed, and the body
/// does not run again. A fresh call never asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_backfills_a_takeover_instead_of_running_again() {
    setup();
    assert_eq!(charge("o-1", false).await.unwrap(), "charged o-1");
    assert_eq!(
        ASKED.load(Ordering::SeqCst),
        0,
        "a fresh claim does not ask"
    );

    let dead = tokio::spawn(charge("o-2", true));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    dead.abort();
    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    let (res, report) = idem::metrics::observe(charge("o-2", false)).await;
    assert_eq!(res.unwrap(), "found o-2");
    assert_eq!(report.unwrap().outcome, Outcome::Recovered);
    assert_eq!(ASKED.load(Ordering::SeqCst), 1);
    let paid = PAID.lock().unwrap().iter().filter(|o| *o == "o-2").count();
    assert_eq!(paid, 1, "the body ran once");
    let (again, report) = idem::metrics::observe(charge("o-2", false)).await;
    assert_eq!(again.unwrap(), "found o-2");
    assert_eq!(report.unwrap().outcome, Outcome::Replayed);
}

/// A store on a test clock for `result_ttl`: the key stays used 30 days, the result is kept one.
fn kept_store() -> (Arc<MemoryStore>, idem::TestClock) {
    static STORE: std::sync::OnceLock<(Arc<MemoryStore>, idem::TestClock)> =
        std::sync::OnceLock::new();
    STORE
        .get_or_init(|| {
            let clock = idem::TestClock::new();
            (
                Arc::new(MemoryStore::new().with_test_clock(clock.clone())),
                clock,
            )
        })
        .clone()
}

static CHARGES: AtomicU32 = AtomicU32::new(0);

#[idempotent(
    biz = "CHARGE",
    key = order_no,
    store = kept_store().0,
    ttl = "30d",
    result_ttl = "1d"
)]
async fn charge_once(order_no: &str) -> Result<u32, AppError> {
    Ok(CHARGES.fetch_add(1, Ordering::SeqCst))
}

#[tokio::test]
async fn a_result_kept_a_day_refuses_a_late_repeat_for_the_rest_of_the_month() {
    let (store, clock) = kept_store();
    let before = idem::metrics::counts_for("CHARGE");
    let first = charge_once("ORD-30").await.unwrap();
    let record = store.load("CHARGE", "ORD-30").await.unwrap().unwrap();
    let day = 24 * 3600 * 1000;
    let until = record.result_until_ms.unwrap();
    assert!(
        record.expire_at_ms - until >= 28 * day,
        "the key outlives its result by 29 days: {record:?}"
    );
    clock.advance(std::time::Duration::from_secs(23 * 3600));
    assert_eq!(charge_once("ORD-30").await.unwrap(), first, "a replay");
    clock.advance(std::time::Duration::from_secs(2 * 3600));
    let (late, report) = idem::metrics::observe(charge_once("ORD-30")).await;
    assert!(
        matches!(late, Err(AppError::Idem(IdemError::ResultExpired))),
        "{late:?}"
    );
    assert_eq!(report.unwrap().outcome, Outcome::ResultExpired);
    let counted = idem::metrics::counts_for("CHARGE").since(&before);
    assert_eq!(
        (
            counted.get(Outcome::Executed),
            counted.get(Outcome::Replayed),
            counted.get(Outcome::ResultExpired)
        ),
        (1, 1, 1),
        "the refusal is counted under its own outcome"
    );
    assert_eq!(
        CHARGES.load(Ordering::SeqCst),
        1,
        "the body ran once; the late repeat was refused"
    );
}

/// The side effect of `held_open`: one row per execution, counted apart from idem's own records.
static OPENED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Holds the body open until `release` is notified, and reports the claim it runs under.
#[idempotent(biz = "HELD", key = key, store = "macro_mem")]
async fn held_open(key: &str, release: Arc<tokio::sync::Notify>) -> Result<u64, AppError> {
    let claim = idem::steps::current_claim().expect("the body runs as the claim's holder");
    OPENED.lock().unwrap().push(key.to_owned());
    release.notified().await;
    Ok(claim.fence.get())
}

#[idempotent(
    biz = "HELD",
    key = key,
    store = "macro_mem",
    on_in_progress = "wait(5s)"
)]
async fn held_or_wait(key: &str) -> Result<u64, AppError> {
    OPENED.lock().unwrap().push(key.to_owned());
    Ok(0)
}

/// On the memory store `#[idempotent]` claims before the call's future is made (no subscriber
/// takes its span here): a body still runs as the claim's holder, an in-progress repeat is refused
/// (or waited out, when the fn says so) and counted, and every caller released at once gets the
/// one execution's answer or an in-progress refusal; the executions are audited in a table of
/// their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_decided_at_once_is_held_refused_and_waited_out_as_any_other() {
    setup();
    let key = "held-1";
    let release = Arc::new(tokio::sync::Notify::new());
    let first = tokio::spawn(held_open(key, release.clone()));
    while !OPENED.lock().unwrap().iter().any(|k| k == key) {
        tokio::task::yield_now().await;
    }
    let (refused, report) = idem::metrics::observe(held_open(key, release.clone())).await;
    assert!(
        matches!(refused, Err(AppError::Idem(IdemError::InProgress { .. }))),
        "{refused:?}"
    );
    assert_eq!(report.unwrap().outcome, Outcome::InProgress);
    let waiter = tokio::spawn(held_or_wait(key));
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(
        !waiter.is_finished(),
        "the waiting repeat waits for the holder"
    );
    release.notify_one();
    let fence = first.await.unwrap().unwrap();
    assert_eq!(
        waiter.await.unwrap().unwrap(),
        fence,
        "the waiter gets the first answer"
    );

    // Many callers of one new key released at once: one execution, one answer.
    let key = "held-2";
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let release = Arc::new(tokio::sync::Notify::new());
    let callers: Vec<_> = (0..32)
        .map(|_| {
            let (barrier, release) = (barrier.clone(), release.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                held_open(key, release).await
            })
        })
        .collect();
    while !OPENED.lock().unwrap().iter().any(|k| k == key) {
        tokio::task::yield_now().await;
    }
    release.notify_one();
    let mut answers = Vec::new();
    for caller in callers {
        match caller.await.unwrap() {
            Ok(fence) => answers.push(fence),
            Err(AppError::Idem(IdemError::InProgress { .. })) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    let ran = OPENED.lock().unwrap().iter().filter(|k| *k == key).count();
    assert_eq!(ran, 1, "one execution");
    // The holder's answer, and the same for every caller that came after it finished; the
    // callers that came while it ran were told it was in progress.
    assert!(!answers.is_empty());
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");
    let replay = held_open(key, Arc::new(tokio::sync::Notify::new()))
        .await
        .unwrap();
    assert_eq!(replay, answers[0], "a repeat afterwards replays it");
}
