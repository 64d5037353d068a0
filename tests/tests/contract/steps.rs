//! Contract cases for recovery points (`idem::step`), run on every store: a step's result is saved
//! under the record, fenced; a takeover and a retry of the same payload resume after the saved
//! steps; a success, a new life of the record and another payload start without them; every limit
//! is a clear error.
//!
//! The "external API" the steps call is the effects table, counting calls per downstream key
//! (`idem::steps::step_key`), never idem's own counters.

use std::time::Duration;

use idem::metrics::Outcome;
use idem::{
    IdemError, Store, step,
    steps::{MAX_STEPS, step_key},
    store::{Acquired, ClaimRequest, Status},
};
use tokio::sync::Notify;

use super::{Effects, PayError, Subject, acquire, biz, call, req, secs};

/// The fake external API: one call recorded under the downstream key the step passes (its
/// `step_key`), answering with that key.
async fn api(fx: &Effects, biz: &str, step: &str) -> Result<String, PayError> {
    let key = step_key(step).expect("inside an idempotent body");
    fx.record(biz, &key).await;
    Ok(key)
}

/// A body of three steps, each one call to the API; with `die`, it signals after step two and
/// never goes on (its holder is dropped there: a process killed between two steps).
async fn three_steps(
    fx: &Effects,
    biz: &str,
    die: Option<&Notify>,
) -> Result<Vec<String>, PayError> {
    let one = step("one", api(fx, biz, "one")).await?;
    let two = step("two", api(fx, biz, "two")).await?;
    if let Some(died) = die {
        died.notify_one();
        std::future::pending::<()>().await;
    }
    let three = step("three", api(fx, biz, "three")).await?;
    Ok(vec![one, two, three])
}

/// The store-level rules: `save_steps` writes only under the held fence (a repeat of the same save
/// succeeds); a takeover and a retry keep the log; a success replaces it; nothing is written for a
/// claim that is no longer held.
pub async fn saved_steps_are_fenced_and_outlive_takeovers_and_failures(s: Subject) {
    let (store, clock, biz) = (s.store, s.clock, biz("steps_fence"));
    let (first, _) = acquire(&*store, &req(&biz, "k", secs(10))).await;
    let log1 = br#"{"one":"a"}"#;
    store.save_steps(&biz, "k", &first, log1).await.unwrap();
    store.save_steps(&biz, "k", &first, log1).await.unwrap();
    let rec = store.load(&biz, "k").await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Processing);
    assert_eq!(rec.steps.as_deref(), Some(&log1[..]));
    assert_eq!(rec.snapshot, None, "an unfinished record has no result");

    clock.advance(secs(11));
    let (second, how) = acquire(&*store, &req(&biz, "k", secs(10))).await;
    assert_eq!(how, Acquired::TakeOver);
    let rec = store.load(&biz, "k").await.unwrap().unwrap();
    assert_eq!(
        rec.steps.as_deref(),
        Some(&log1[..]),
        "a takeover keeps them"
    );
    let stale = store.save_steps(&biz, "k", &first, br#"{"x":1}"#).await;
    assert!(
        matches!(stale, Err(IdemError::LeaseLost { .. })),
        "{stale:?}"
    );
    let log2 = br#"{"one":"a","two":"b"}"#;
    store.save_steps(&biz, "k", &second, log2).await.unwrap();
    store.fail(&biz, "k", &second).await.unwrap();
    let rec = store.load(&biz, "k").await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Failed);
    assert_eq!(
        rec.steps.as_deref(),
        Some(&log2[..]),
        "a failure keeps them"
    );
    let after_fail = store.save_steps(&biz, "k", &second, log1).await;
    assert!(
        matches!(after_fail, Err(IdemError::LeaseLost { .. })),
        "{after_fail:?}"
    );

    let (third, how) = acquire(&*store, &req(&biz, "k", secs(10))).await;
    assert_eq!(how, Acquired::RetryAfterFailure);
    let rec = store.load(&biz, "k").await.unwrap().unwrap();
    assert_eq!(rec.steps.as_deref(), Some(&log2[..]), "a retry keeps them");
    store
        .complete(&biz, "k", &third, b"{\"Ok\":1}", secs(60))
        .await
        .unwrap();
    let rec = store.load(&biz, "k").await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Succeeded);
    assert_eq!(rec.snapshot.as_deref(), Some(&b"{\"Ok\":1}"[..]));
    assert_eq!(rec.steps, None, "the result replaced them");
    let done = store.save_steps(&biz, "k", &third, log1).await;
    assert!(matches!(done, Err(IdemError::LeaseLost { .. })), "{done:?}");
    let rec = store.load(&biz, "k").await.unwrap().unwrap();
    assert_eq!(rec.snapshot.as_deref(), Some(&b"{\"Ok\":1}"[..]));

    let missing = store.save_steps(&biz, "none", &third, log1).await;
    assert!(
        matches!(missing, Err(IdemError::LeaseLost { .. })),
        "{missing:?}"
    );
    assert!(store.load(&biz, "none").await.unwrap().is_none());
}

/// Saved steps belong to one life of the record and one payload: a record that expired, and a
/// retry with another (fingerprinted) payload, start with none.
pub async fn a_new_life_or_another_payload_starts_without_steps(s: Subject) {
    let (store, clock, biz) = (s.store, s.clock, biz("steps_reset"));
    let with_fp = |key: &'static str, fp: &'static str| ClaimRequest {
        fingerprint: Some(fp),
        ..req(&biz, key, secs(10))
    };
    let (claim, _) = acquire(&*store, &with_fp("p", "fp-1")).await;
    store.save_steps(&biz, "p", &claim, b"{}").await.unwrap();
    store.fail(&biz, "p", &claim).await.unwrap();
    let (_, how) = acquire(&*store, &with_fp("p", "fp-2")).await;
    assert_eq!(how, Acquired::RetryAfterFailure);
    let rec = store.load(&biz, "p").await.unwrap().unwrap();
    assert_eq!(rec.steps, None, "another payload starts afresh");

    let (claim, _) = acquire(&*store, &with_fp("same", "fp-1")).await;
    store.save_steps(&biz, "same", &claim, b"{}").await.unwrap();
    store.fail(&biz, "same", &claim).await.unwrap();
    let (_, how) = acquire(&*store, &with_fp("same", "fp-1")).await;
    assert_eq!(how, Acquired::RetryAfterFailure);
    let rec = store.load(&biz, "same").await.unwrap().unwrap();
    assert_eq!(
        rec.steps.as_deref(),
        Some(&b"{}"[..]),
        "the same payload resumes"
    );

    let (claim, _) = acquire(&*store, &req(&biz, "old", secs(10))).await;
    store.save_steps(&biz, "old", &claim, b"{}").await.unwrap();
    store.fail(&biz, "old", &claim).await.unwrap();
    clock.advance(super::TTL + secs(1));
    let (_, how) = acquire(&*store, &req(&biz, "old", secs(10))).await;
    assert_eq!(how, Acquired::Fresh);
    let rec = store.load(&biz, "old").await.unwrap().unwrap();
    assert_eq!(rec.steps, None, "a new life starts afresh");
}

/// A 3-step body whose holder dies after step two: the takeover returns the first two steps'
/// saved results and runs step three only; each step's downstream key is the same in both
/// attempts (the API saw each key once).
pub async fn a_takeover_runs_only_the_steps_not_saved(s: Subject) {
    let (store, clock, fx, biz) = (s.store, s.clock, Effects::new().await, biz("steps_take"));
    let died = Notify::new();
    tokio::select! {
        res = call(&biz, "o").lease(secs(10)).run(&*store, three_steps(&fx, &biz, Some(&died))) => {
            panic!("the first attempt never ends: {res:?}")
        }
        () = died.notified() => {}
    }
    let rec = store.load(&biz, "o").await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Processing);
    assert!(rec.steps.is_some(), "steps one and two saved");
    clock.advance(secs(11));
    let (res, report) = idem::metrics::observe(
        call(&biz, "o")
            .lease(secs(10))
            .run(&*store, three_steps(&fx, &biz, None)),
    )
    .await;
    let keys = res.unwrap();
    assert_eq!(report.unwrap().outcome, Outcome::TakenOver);
    assert_eq!(keys.len(), 3);
    for key in &keys {
        assert_eq!(key.len(), 32, "{key}");
        assert_eq!(fx.count(&biz, key).await, 1, "one API call per step key");
    }
    assert_eq!(
        fx.totals(&biz).await,
        (3, 3),
        "three steps, three calls in all"
    );
    // A repeat replays the whole result.
    let again = call(&biz, "o")
        .run(&*store, three_steps(&fx, &biz, None))
        .await
        .unwrap();
    assert_eq!(again, keys);
    assert_eq!(fx.totals(&biz).await, (3, 3));
}

/// A body that fails after a step: the retry (same payload) gets the step's saved result and runs
/// only what follows.
pub async fn a_retry_after_a_failure_resumes_after_the_saved_steps(s: Subject) {
    let (store, fx, biz) = (s.store, Effects::new().await, biz("steps_retry"));
    let failing = async {
        step("charge", api(&fx, &biz, "charge")).await?;
        Err::<String, _>(PayError::Declined)
    };
    let (res, report) = idem::metrics::observe(call(&biz, "o").run(&*store, failing)).await;
    assert!(matches!(res, Err(PayError::Declined)), "{res:?}");
    assert_eq!(report.unwrap().outcome, Outcome::Failed);
    let retry = async {
        let charge = step("charge", api(&fx, &biz, "charge")).await?;
        let ship = step("ship", api(&fx, &biz, "ship")).await?;
        Ok::<_, PayError>(format!("{charge}/{ship}"))
    };
    let done = call(&biz, "o").run(&*store, retry).await.unwrap();
    let (charge, ship) = done.split_once('/').unwrap();
    assert_eq!(fx.count(&biz, charge).await, 1, "charged once");
    assert_eq!(fx.count(&biz, ship).await, 1);
    assert_eq!(fx.totals(&biz).await, (2, 2));
}

/// Every way a step can be refused, each a clear `IdemError::Step` (or `LeaseLost`), with its work
/// run or not as the error says.
pub async fn steps_are_refused_with_clear_errors(s: Subject) {
    let (store, clock, fx, biz) = (s.store, s.clock, Effects::new().await, biz("steps_bad"));
    // Outside a body: the work just runs, and there is no step key.
    assert_eq!(step_key("x"), None);
    let plain: Result<u32, IdemError> = step("x", async { Ok(7) }).await;
    assert_eq!(plain.unwrap(), 7);

    // A bad name: refused before the work runs.
    for bad in ["", "a\u{0}b"] {
        let res: Result<(), PayError> = call(&biz, "name")
            .run(&*store, async {
                step(bad, api(&fx, &biz, "bad")).await?;
                Ok(())
            })
            .await;
        let Err(PayError::Idem(IdemError::Step { reason, .. })) = res else {
            panic!("{res:?}")
        };
        assert!(reason.contains("did not run"), "{reason}");
    }
    assert_eq!(fx.totals(&biz).await, (0, 0), "no bad step ran");

    // One step too many: refused before its work runs; the first MAX_STEPS ran once each.
    let res: Result<(), PayError> = call(&biz, "many")
        .run(&*store, async {
            for i in 0..=MAX_STEPS {
                step(&format!("s{i}"), api(&fx, &biz, &format!("s{i}"))).await?;
            }
            Ok(())
        })
        .await;
    let Err(PayError::Idem(IdemError::Step { step: name, reason })) = res else {
        panic!("{res:?}")
    };
    assert_eq!(name, format!("s{MAX_STEPS}"));
    assert!(reason.contains("at most"), "{reason}");
    assert_eq!(fx.totals(&biz).await, (MAX_STEPS as i64, MAX_STEPS as i64));

    // A result too large to save: the work ran (the error says so), nothing was saved, and the
    // step runs again in the next attempt.
    let limit = store.limits().max_snapshot_len;
    let huge = |fx: Effects, biz: String| async move {
        step("huge", async move {
            fx.record(&biz, "huge").await;
            Ok::<_, PayError>("x".repeat(limit))
        })
        .await
    };
    let res = call(&biz, "huge")
        .run(&*store, huge(fx.clone(), biz.clone()))
        .await;
    let Err(PayError::Idem(IdemError::Step { reason, .. })) = res else {
        panic!("{:?}", res.map(|s| s.len()))
    };
    assert!(
        reason.contains("the step ran") && reason.contains("limit"),
        "{reason}"
    );
    let rec = store.load(&biz, "huge").await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Failed);
    assert!(
        rec.steps.as_deref().is_none_or(|s| s.len() < 64),
        "the huge step is not saved"
    );
    let again = call(&biz, "huge")
        .run(&*store, huge(fx.clone(), biz.clone()))
        .await;
    assert!(again.is_err());
    assert_eq!(
        fx.count(&biz, "huge").await,
        2,
        "not saved, so it ran again"
    );

    // A saved result that no longer decodes as the step's type: refused, the work does not run.
    let first = call(&biz, "typed")
        .run(&*store, async {
            step("n", api(&fx, &biz, "n")).await?;
            Err::<(), _>(PayError::Declined)
        })
        .await;
    assert!(matches!(first, Err(PayError::Declined)), "{first:?}");
    let res: Result<u64, PayError> = call(&biz, "typed")
        .run(&*store, async {
            step("n", async {
                fx.record(&biz, "typed-again").await;
                Ok::<u64, PayError>(1)
            })
            .await
        })
        .await;
    let Err(PayError::Idem(IdemError::Step { reason, .. })) = res else {
        panic!("{res:?}")
    };
    assert!(reason.contains("does not decode"), "{reason}");
    assert_eq!(fx.count(&biz, "typed-again").await, 0);

    // A holder that lost its claim cannot save: the step answers LeaseLost.
    let go = Notify::new();
    let taken = async {
        wait_until_held(&*store, &biz, "lost").await;
        clock.advance(secs(11));
        let (_, how) = acquire(&*store, &req(&biz, "lost", secs(10))).await;
        assert_eq!(how, Acquired::TakeOver);
        go.notify_one();
    };
    let lost = call(&biz, "lost")
        .lease(secs(10))
        .no_heartbeat()
        .run(&*store, async {
            go.notified().await;
            step("late", api(&fx, &biz, "late")).await
        });
    let (res, ()) = tokio::join!(lost, taken);
    assert!(
        matches!(res, Err(PayError::Idem(IdemError::LeaseLost { .. }))),
        "{res:?}"
    );
    let rec = store.load(&biz, "lost").await.unwrap().unwrap();
    assert_eq!(rec.steps, None, "the late holder saved nothing");

    // A holder that paused past its lease (by its own clock) confirms its claim before the next
    // step's work: taken over meanwhile, it runs nothing more.
    let go = Notify::new();
    let lease = Duration::from_millis(300);
    let taken = async {
        wait_until_held(&*store, &biz, "paused").await;
        tokio::time::sleep(lease + Duration::from_millis(150)).await;
        let (_, how) = acquire(&*store, &req(&biz, "paused", secs(10))).await;
        assert_eq!(how, Acquired::TakeOver);
        go.notify_one();
    };
    let paused = call(&biz, "paused")
        .lease(lease)
        .no_heartbeat()
        .run(&*store, async {
            step("before", api(&fx, &biz, "before")).await?;
            go.notified().await;
            step("after", async {
                fx.record(&biz, "paused-after").await;
                Ok::<_, PayError>(())
            })
            .await
        });
    let (res, ()) = tokio::join!(paused, taken);
    assert!(
        matches!(res, Err(PayError::Idem(IdemError::LeaseLost { .. }))),
        "{res:?}"
    );
    assert_eq!(
        fx.count(&biz, "paused-after").await,
        0,
        "the step after the pause did not run"
    );
}

/// Waits (bounded) until `(biz, key)` is PROCESSING.
async fn wait_until_held(store: &dyn Store, biz: &str, key: &str) {
    for _ in 0..500 {
        if let Some(rec) = store.load(biz, key).await.unwrap()
            && rec.status == Status::Processing
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("({biz}, {key}) never held");
}
