//! Failures inside the body: a panic, a dropped future; and the fence the body can read.

use super::*;

pub async fn panic_in_body_never_claims_success(s: Subject) {
    let (store, clock, fx, biz) = (s.store, s.clock, Effects::new().await, biz("panic"));
    let task = {
        let (store, biz) = (store.clone(), biz.clone());
        tokio::spawn(async move {
            let _: Result<Receipt, PayError> = call(&biz, "o")
                .lease(secs(10))
                .run(&*store, async { panic!("business blew up") })
                .await;
        })
    };
    assert!(task.await.unwrap_err().is_panic());
    let rec = store.load(&biz, "o").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.snapshot), (Status::Processing, None));
    clock.advance(secs(11));
    let retried = call(&biz, "o")
        .lease(secs(10))
        .run(&*store, pay(&fx, &biz, "o", 9))
        .await
        .unwrap();
    assert_eq!(retried.amount, 9);
    assert_eq!(fx.count(&biz, "o").await, 1);
}

pub async fn dropped_future_never_claims_success(s: Subject) {
    let (store, clock, fx, biz) = (s.store, s.clock, Effects::new().await, biz("drop"));
    let running = {
        let (store, fx, biz) = (store.clone(), fx.clone(), biz.clone());
        tokio::spawn(async move {
            call(&biz, "o")
                .lease(secs(10))
                .run(&*store, async {
                    tokio::time::sleep(secs(60)).await;
                    pay(&fx, &biz, "o", 1).await
                })
                .await
        })
    };
    // Cancel the call once it holds the claim (the future is dropped mid-body).
    wait_for_record(&*store, &biz, "o").await;
    running.abort();
    assert!(
        running.await.unwrap_err().is_cancelled(),
        "the call must have been cancelled"
    );
    let rec = store.load(&biz, "o").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.snapshot), (Status::Processing, None));
    clock.advance(secs(11));
    call(&biz, "o")
        .lease(secs(10))
        .run(&*store, pay(&fx, &biz, "o", 1))
        .await
        .unwrap();
    assert_eq!(fx.count(&biz, "o").await, 1);
}

/// The body can read its claim's fence (to pass to its own downstream writes); it is the fence the
/// store holds.
pub async fn the_body_learns_its_fence(s: Subject) {
    let (store, biz) = (s.store, biz("fence_body"));
    assert!(
        idem::steps::current_claim().is_none(),
        "no claim outside a body"
    );
    let seen: Result<(u32, u64), IdemError> = call(&biz, "o")
        .run(&*store, async {
            let claim = idem::steps::current_claim().expect("inside the body");
            Ok((claim.attempt, claim.fence.get()))
        })
        .await;
    let (attempt, fence) = seen.unwrap();
    let rec = store.load(&biz, "o").await.unwrap().unwrap();
    assert_eq!((attempt, fence), (rec.attempt, rec.fence.get()));
}
