//! Contract cases for a call's recover fn, run on every store: a takeover asks it before the body
//! runs again; what it finds is stored (fenced) and replayed; `None` runs the body; an error
//! releases the claim so the next call asks again; a fresh claim and a retry after a recorded
//! failure never ask.
//!
//! The holder that died is a claim taken directly on the store and never finished; the store's test
//! clock then moves past its lease.

use std::sync::atomic::{AtomicU32, Ordering};

use idem::metrics::Outcome;
use idem::{
    IdemError,
    store::{Acquired, Status},
};

use super::{Effects, PayError, Receipt, Subject, acquire, biz, call, pay, req, secs};

/// What the "real business" says happened: the effects table, read by key.
async fn found(fx: &Effects, biz: &str, key: &str, asked: &AtomicU32) -> Option<Receipt> {
    asked.fetch_add(1, Ordering::SeqCst);
    (fx.count(biz, key).await > 0).then(|| Receipt {
        order: key.to_owned(),
        amount: 7,
        serial: u32::MAX,
    })
}

/// A holder claimed, had its effect, and died before its mark: after its lease, a repeat with a
/// recover fn finds the effect, stores it as the success, and the body does not run again; every
/// later repeat replays it without asking.
pub async fn a_takeover_asks_recover_before_running_the_body(s: Subject) {
    let (store, clock, fx, biz) = (s.store, s.clock, Effects::new().await, biz("recover"));
    let asked = AtomicU32::new(0);
    let (dead, _) = acquire(&*store, &req(&biz, "paid", secs(10))).await;
    fx.record(&biz, "paid").await;
    clock.advance(secs(11));
    let (res, report) = idem::metrics::observe(
        call(&biz, "paid")
            .lease(secs(10))
            .recover(|| async { Ok::<_, PayError>(found(&fx, &biz, "paid", &asked).await) })
            .run(&*store, pay(&fx, &biz, "paid", 7)),
    )
    .await;
    let recovered = res.unwrap();
    assert_eq!(
        recovered.serial,
        u32::MAX,
        "the recovered result: {recovered:?}"
    );
    let report = report.expect("a report");
    assert_eq!(
        (report.outcome, report.attempt),
        (Outcome::Recovered, dead.attempt + 1)
    );
    assert_eq!(
        fx.count(&biz, "paid").await,
        1,
        "the body did not run again"
    );
    let rec = store.load(&biz, "paid").await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Succeeded);
    assert!(rec.fence > dead.fence, "stored under the takeover's fence");
    // The dead holder, were it to wake, is fenced out.
    let late = store
        .complete(&biz, "paid", &dead, b"{\"Ok\":\"late\"}", secs(60))
        .await;
    assert!(matches!(late, Err(IdemError::LeaseLost { .. })), "{late:?}");
    let (again, report) = idem::metrics::observe(
        call(&biz, "paid")
            .recover(|| async { Ok::<_, PayError>(found(&fx, &biz, "paid", &asked).await) })
            .run(&*store, pay(&fx, &biz, "paid", 7)),
    )
    .await;
    assert_eq!(again.unwrap(), recovered);
    assert_eq!(report.unwrap().outcome, Outcome::Replayed);
    assert_eq!(asked.load(Ordering::SeqCst), 1, "a replay does not ask");

    // A holder that died before its effect: recover finds nothing and the body runs.
    let (dead, _) = acquire(&*store, &req(&biz, "unpaid", secs(10))).await;
    clock.advance(secs(11));
    let (res, report) = idem::metrics::observe(
        call(&biz, "unpaid")
            .lease(secs(10))
            .recover(|| async { Ok::<_, PayError>(found(&fx, &biz, "unpaid", &asked).await) })
            .run(&*store, pay(&fx, &biz, "unpaid", 7)),
    )
    .await;
    assert_ne!(res.unwrap().serial, u32::MAX, "the body's own result");
    let report = report.unwrap();
    assert_eq!(
        (report.outcome, report.attempt),
        (Outcome::TakenOver, dead.attempt + 1)
    );
    assert_eq!(asked.load(Ordering::SeqCst), 2);
    assert_eq!(fx.count(&biz, "unpaid").await, 1, "the body ran once");
}

/// A recover fn that cannot tell (the gateway is down) refuses the call with its own error and
/// runs nothing; the record stays PROCESSING with its lease released, so the next call takes it
/// over at once and asks again.
pub async fn a_failed_recover_releases_the_claim(s: Subject) {
    let (store, clock, fx, biz) = (s.store, s.clock, Effects::new().await, biz("recover_err"));
    let asked = AtomicU32::new(0);
    let (dead, _) = acquire(&*store, &req(&biz, "o", secs(10))).await;
    clock.advance(secs(11));
    let (res, report) = idem::metrics::observe(
        call(&biz, "o")
            .lease(secs(10))
            .recover(|| async {
                asked.fetch_add(1, Ordering::SeqCst);
                Err::<Option<Receipt>, _>(PayError::Declined)
            })
            .run(&*store, pay(&fx, &biz, "o", 7)),
    )
    .await;
    assert!(matches!(res, Err(PayError::Declined)), "{res:?}");
    assert_eq!(report.unwrap().outcome, Outcome::RecoverFailed);
    assert_eq!(fx.count(&biz, "o").await, 0, "nothing ran");
    let rec = store.load(&biz, "o").await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Processing);
    assert!(rec.fence > dead.fence);
    // No clock move: the released claim is taken over at once, and recover is asked again.
    let (res, report) = idem::metrics::observe(
        call(&biz, "o")
            .lease(secs(10))
            .recover(|| async { Ok::<_, PayError>(found(&fx, &biz, "o", &asked).await) })
            .run(&*store, pay(&fx, &biz, "o", 7)),
    )
    .await;
    res.unwrap();
    assert_eq!(report.unwrap().outcome, Outcome::TakenOver);
    assert_eq!(asked.load(Ordering::SeqCst), 2);
    assert_eq!(fx.count(&biz, "o").await, 1);
}

/// Recover is for records that may have had their effect: a fresh claim and a retry after a
/// recorded failure run the body without asking.
pub async fn recover_is_not_asked_for_a_fresh_claim_or_a_retry(s: Subject) {
    let (store, fx, biz) = (s.store, Effects::new().await, biz("recover_no"));
    let asked = AtomicU32::new(0);
    let ask = || async {
        asked.fetch_add(1, Ordering::SeqCst);
        Ok::<Option<Receipt>, PayError>(None)
    };
    let (res, report) = idem::metrics::observe(
        call(&biz, "fresh")
            .recover(ask)
            .run(&*store, pay(&fx, &biz, "fresh", 7)),
    )
    .await;
    res.unwrap();
    assert_eq!(report.unwrap().outcome, Outcome::Executed);

    let (failed, how) = acquire(&*store, &req(&biz, "failed", secs(10))).await;
    assert_eq!(how, Acquired::Fresh);
    store.fail(&biz, "failed", &failed).await.unwrap();
    let (res, report) = idem::metrics::observe(
        call(&biz, "failed")
            .recover(ask)
            .run(&*store, pay(&fx, &biz, "failed", 7)),
    )
    .await;
    res.unwrap();
    assert_eq!(report.unwrap().outcome, Outcome::Executed);
    assert_eq!(asked.load(Ordering::SeqCst), 0, "never asked");
    assert_eq!(fx.count(&biz, "failed").await, 1);
}
