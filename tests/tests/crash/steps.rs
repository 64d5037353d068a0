//! Holders killed between two recovery points (`idem::step`): the takeover runs only the step
//! not saved, under the same downstream keys.

use super::*;

/// The fake external API of the steps trials: one row per call, under the downstream key the step
/// passes (its `step_key`) and who called; it answers with that key.
async fn api(effects: &SqlitePool, biz: &str, step: &str, who: &str) -> Result<String, IdemError> {
    let key = idem::steps::step_key(step).expect("inside an idempotent body");
    effect(effects, biz, &key, who).await?;
    Ok(key)
}

/// Three steps, each one API call; with `die`, it says READY after step two and waits to be
/// killed. Answers each step's result and the step key the attempt itself computed for it.
pub(super) async fn three_steps(
    effects: &SqlitePool,
    biz: &str,
    who: &str,
    die: bool,
) -> Result<Vec<String>, IdemError> {
    let mut out = Vec::new();
    for (i, name) in ["one", "two", "three"].into_iter().enumerate() {
        if die && i == 2 {
            say("READY");
            std::future::pending::<()>().await;
        }
        out.push(idem::step(name, api(effects, biz, name, who)).await?);
        out.push(idem::steps::step_key(name).expect("inside the body"));
    }
    Ok(out)
}

/// Children killed after step two of three (10 trials). After the lease the takeover gets steps
/// one and two from the record (the child's keys, the same as its own) and runs step three only:
/// the API saw each downstream key once.
async fn killed_between_steps(site: Site) {
    let biz = "CRASHSTEP";
    let lease = Duration::from_secs(3);
    let keys = site
        .kill_n(10, biz, lease, Act::Steps, 10, async |key| {
            let record = site.store.load(biz, key).await.unwrap().expect("claimed");
            assert_eq!(record.status, Status::Processing, "{key}");
            assert!(record.steps.is_some(), "{key}: steps one and two saved");
        })
        .await;
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    for key in &keys {
        let (res, report) = idem::metrics::observe(Call::new(biz, key).lease(lease).run(
            &*site.store,
            three_steps(&site.effects, biz, "repeat", false),
        ))
        .await;
        let got = res.unwrap();
        assert_eq!(report.unwrap().outcome, Outcome::TakenOver, "{key}");
        for (step, pair) in got.chunks(2).enumerate() {
            assert_eq!(
                pair[0], pair[1],
                "{key} step {step}: the same downstream key"
            );
            let expected: &[&str] = if step < 2 { &["child"] } else { &["repeat"] };
            assert_eq!(
                effects_of(&site.effects, biz, &pair[0]).await,
                expected,
                "{key} step {step}: one API call per downstream key"
            );
        }
        let record = site.store.load(biz, key).await.unwrap().unwrap();
        assert_eq!(record.status, Status::Succeeded, "{key}");
    }
    let (calls,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM effects WHERE biz = ?")
        .bind(biz)
        .fetch_one(&site.effects)
        .await
        .unwrap();
    assert_eq!(
        calls,
        3 * keys.len() as i64,
        "three API calls per key in all"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_killed_between_steps() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    killed_between_steps(sqlite_site().await).await;
}

on_server! {
    feature = "redis": redis_killed_between_steps = killed_between_steps on redis_site;
    feature = "postgres": postgres_killed_between_steps = killed_between_steps on pg_site;
    feature = "mysql": mysql_killed_between_steps = killed_between_steps on my_site;
    feature = "dynamodb": dynamo_killed_between_steps = killed_between_steps on dynamo_site;
}
