//! Holders killed in lease mode between their claim and their mark, before or after their
//! effect, and a holder paused (SIGSTOP) past its lease.

use super::*;

async fn killed_between_claim_and_mark(site: Site) {
    let biz = "CRASH";
    // Long enough that every key of a batch is checked before its lease ends.
    let lease = Duration::from_secs(5);
    let keys = site
        .kill_trials(biz, lease, Act::Hold, 10, async |key| {
            // The claim outlives its holder: until the lease ends every caller is told so.
            let record = site.store.load(biz, key).await.unwrap().expect("claimed");
            assert_eq!(record.status, Status::Processing, "{key}");
            let outcomes = site.burst(biz, key, lease).await;
            assert!(
                outcomes.iter().all(|o| *o == Outcome::InProgress),
                "{key} before its lease ended: {outcomes:?}"
            );
        })
        .await;
    // Once every lease has ended: exactly one caller of each burst takes over, once.
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    for key in &keys {
        let outcomes = site.burst(biz, key, lease).await;
        let took_over = outcomes
            .iter()
            .filter(|o| **o == Outcome::TakenOver)
            .count();
        assert_eq!(took_over, 1, "{key}: {outcomes:?}");
        assert!(
            outcomes.iter().all(|o| matches!(
                o,
                Outcome::TakenOver | Outcome::InProgress | Outcome::Replayed
            )),
            "{key}: {outcomes:?}"
        );
        assert_eq!(effects_of(&site.effects, biz, key).await.len(), 1, "{key}");
        let record = site.store.load(biz, key).await.unwrap().unwrap();
        assert_eq!(
            (record.status, record.attempt),
            (Status::Succeeded, 2),
            "{key}"
        );
    }
}

/// Children killed after their effect and before their mark (a crash between the payment and its
/// record), 20 trials. After the lease, a repeat with a recover fn (which reads the effects table,
/// the "real business result") finds the effect and stores it: 0 double effects, the repeat and
/// every later one get the recovered result. Without a recover fn, the documented behaviour of
/// lease mode alone: the takeover runs the body again, a second effect.
async fn killed_after_its_effect(site: Site) {
    let biz = "CRASHFX";
    let lease = Duration::from_secs(3);
    let keys = site
        .kill_n(20, biz, lease, Act::Effect, 10, async |key| {
            let record = site.store.load(biz, key).await.unwrap().expect("claimed");
            assert_eq!(record.status, Status::Processing, "{key}");
        })
        .await;
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let recover = |key: String| {
        let effects = site.effects.clone();
        move || async move {
            let seen = effects_of(&effects, biz, &key).await;
            Ok::<_, IdemError>(seen.first().map(|who| format!("recovered {who}")))
        }
    };
    for (i, key) in keys.iter().enumerate() {
        let effects = site.effects.clone();
        let body = async move {
            effect(&effects, biz, key, "repeat").await?;
            Ok::<_, IdemError>("ran again".to_owned())
        };
        let call = Call::new(biz, key).lease(lease);
        if i % 2 == 0 {
            let (res, report) =
                idem::metrics::observe(call.recover(recover(key.clone())).run(&*site.store, body))
                    .await;
            assert_eq!(res.unwrap(), "recovered child", "{key}");
            assert_eq!(report.unwrap().outcome, Outcome::Recovered, "{key}");
            assert_eq!(
                effects_of(&site.effects, biz, key).await,
                ["child"],
                "{key}"
            );
            let again: String = Call::new(biz, key)
                .recover(recover(key.clone()))
                .run(&*site.store, async {
                    Ok::<_, IdemError>("third".to_owned())
                })
                .await
                .unwrap();
            assert_eq!(again, "recovered child", "{key}: a repeat replays it");
        } else {
            let (res, report) = idem::metrics::observe(call.run(&*site.store, body)).await;
            assert_eq!(res.unwrap(), "ran again", "{key}");
            assert_eq!(report.unwrap().outcome, Outcome::TakenOver, "{key}");
            assert_eq!(
                effects_of(&site.effects, biz, key).await,
                ["child", "repeat"],
                "{key}: without recover, lease mode runs the body again"
            );
        }
        let record = site.store.load(biz, key).await.unwrap().unwrap();
        assert_eq!(record.status, Status::Succeeded, "{key}");
    }
}

async fn paused_past_the_lease(site: Site) {
    let (biz, key) = ("PAUSE", "order-1");
    let lease = Duration::from_millis(600);
    let spec = site.spec(biz, key, lease, Act::Stall);
    let mut a = tokio::task::spawn_blocking(move || Running::start(&spec))
        .await
        .unwrap();
    a.signal("-STOP");
    // While A is paused its lease runs out (its heartbeat is paused too); B takes over.
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    let effects = site.effects.clone();
    let (b, report) =
        idem::metrics::observe(Call::new(biz, key).lease(lease).run(&*site.store, async {
            effect(&effects, biz, key, "B").await?;
            Ok::<_, IdemError>("B".to_owned())
        }))
        .await;
    assert_eq!(b.unwrap(), "B");
    assert_eq!(report.unwrap().outcome, Outcome::TakenOver);
    // A resumes and finishes its body: it is told it lost the claim.
    a.signal("-CONT");
    let said = tokio::task::spawn_blocking(move || {
        writeln!(a.stdin, "go").unwrap();
        let said = a.wait_for("RESULT");
        a.child.wait().unwrap();
        said
    })
    .await
    .unwrap();
    assert_eq!(said, "RESULT lease-lost");
    // The stored result is B's: a repeat replays it, and A's is never seen.
    let (again, report) = idem::metrics::observe(
        Call::new(biz, key)
            .lease(lease)
            .run(&*site.store, async { Ok::<_, IdemError>("C".to_owned()) }),
    )
    .await;
    assert_eq!(again.unwrap(), "B");
    assert_eq!(report.unwrap().outcome, Outcome::Replayed);
    // Both bodies ran (a paused process cannot be un-run); only B's result was stored.
    assert_eq!(effects_of(&site.effects, biz, key).await, ["B", "A"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_killed_between_claim_and_mark() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    killed_between_claim_and_mark(sqlite_site().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_killed_after_its_effect() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    killed_after_its_effect(sqlite_site().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_paused_past_the_lease() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    paused_past_the_lease(sqlite_site().await).await;
}

on_server! {
    feature = "redis": redis_killed_between_claim_and_mark = killed_between_claim_and_mark on redis_site;
    feature = "redis": redis_paused_past_the_lease = paused_past_the_lease on redis_site;
    feature = "redis": redis_killed_after_its_effect = killed_after_its_effect on redis_site;
    feature = "postgres": postgres_killed_after_its_effect = killed_after_its_effect on pg_site;
    feature = "mysql": mysql_killed_after_its_effect = killed_after_its_effect on my_site;
    feature = "postgres": postgres_killed_between_claim_and_mark = killed_between_claim_and_mark on pg_site;
    feature = "postgres": postgres_paused_past_the_lease = paused_past_the_lease on pg_site;
    feature = "mysql": mysql_killed_between_claim_and_mark = killed_between_claim_and_mark on my_site;
    feature = "mysql": mysql_paused_past_the_lease = paused_past_the_lease on my_site;
    feature = "dynamodb": dynamo_killed_between_claim_and_mark = killed_between_claim_and_mark on dynamo_site;
    feature = "dynamodb": dynamo_killed_after_its_effect = killed_after_its_effect on dynamo_site;
    feature = "dynamodb": dynamo_paused_past_the_lease = paused_past_the_lease on dynamo_site;
}
