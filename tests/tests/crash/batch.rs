//! A consumer killed (SIGKILL) while it holds a batch: after every body of its batch ran and
//! before the batch's marks were sent (`Inbox::handle_batch` holds them back), and right after its
//! batch claim, before any body ran. Nothing is marked done that the child did not mark; while the
//! child's leases live, another batch is told "in progress" and runs nothing; once they ended,
//! batches released together take each key over exactly once.

use idem::inbox::{BatchMessage, Inbox, Verdict};

use super::*;

/// The keys of one child's batch.
pub(crate) fn batch_keys(key: &str) -> Vec<String> {
    (0..BATCH).map(|i| format!("{key}-{i}")).collect()
}

const BATCH: usize = 6;

/// The child's act: one batch through `Inbox::handle_batch`, each body writing its effect; with
/// `before_bodies` it says READY in the first body before any effect, else in the last body
/// after every effect (the marks still held back). Then it waits to be killed.
pub(crate) async fn hold_a_batch(spec: &Spec, before_bodies: bool) {
    let store = open(&spec.backend).await;
    let effects = effects_pool(&spec.effects).await;
    let lease = Duration::from_millis(spec.lease_ms);
    let keys = batch_keys(&spec.key);
    let last = keys.last().cloned().unwrap_or_default();
    let messages = keys.iter().map(|k| {
        BatchMessage::new(
            Call::new(spec.biz.clone(), k).lease(lease),
            Some(1),
            k.clone(),
        )
    });
    let inbox = Inbox::builder().build().unwrap();
    let (effects, biz) = (&effects, spec.biz.as_str());
    let _ = inbox
        .handle_batch(&*store, messages, |key: String| {
            let last = last.clone();
            async move {
                if before_bodies {
                    say("READY");
                    std::future::pending::<()>().await;
                }
                effect(effects, biz, &key, "child").await?;
                if key == last {
                    say("READY");
                    std::future::pending::<()>().await;
                }
                Ok::<_, IdemError>(key)
            }
        })
        .await;
}

/// Two batches of the same keys released together until every message is acked; how many of
/// their bodies ran per key.
async fn batches_until_acked(site: &Site, biz: &str, keys: &[String], lease: Duration) {
    let barrier = Arc::new(Barrier::new(2));
    let mut tasks = tokio::task::JoinSet::new();
    for who in ["p1", "p2"] {
        let (store, effects, barrier) = (site.store.clone(), site.effects.clone(), barrier.clone());
        let (biz, keys) = (biz.to_owned(), keys.to_vec());
        tasks.spawn(async move {
            barrier.wait().await;
            let inbox = Inbox::builder().build().unwrap();
            let mut pending = keys;
            for _ in 0..100 {
                if pending.is_empty() {
                    return;
                }
                let messages = pending.iter().map(|k| {
                    BatchMessage::new(Call::new(biz.clone(), k).lease(lease), Some(1), k.clone())
                });
                let handled = inbox
                    .handle_batch(&*store, messages, |key: String| {
                        let (effects, biz) = (effects.clone(), biz.clone());
                        async move {
                            effect(&effects, &biz, &key, who).await?;
                            Ok::<_, IdemError>(key)
                        }
                    })
                    .await;
                let mut next = Vec::new();
                for (key, h) in pending.iter().zip(handled) {
                    match h.verdict {
                        Verdict::Ack => {}
                        Verdict::Requeue { .. } => next.push(key.clone()),
                        Verdict::DeadLetter { reason } => panic!("{key}: {reason}"),
                    }
                }
                pending = next;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("{who}: keys still in progress after 100 batches: {pending:?}");
        });
    }
    tasks.join_all().await;
}

async fn killed_holding_a_batch(site: Site, act: Act, child_effects: usize) {
    let biz = if act == Act::BatchBeforeBodies {
        "CRASHB0"
    } else {
        "CRASHB1"
    };
    let lease = Duration::from_secs(3);
    let spec = site.spec(biz, "b", lease, act);
    tokio::task::spawn_blocking(move || {
        let mut child = Running::spawn(&spec);
        child.wait_for("READY");
        child.kill();
    })
    .await
    .unwrap();
    let keys = batch_keys("b");
    for key in &keys {
        let record = site.store.load(biz, key).await.unwrap().expect("claimed");
        assert_eq!(
            record.status,
            Status::Processing,
            "{key}: nothing is marked done that the child did not mark"
        );
        assert_eq!(
            effects_of(&site.effects, biz, key).await.len(),
            child_effects,
            "{key}"
        );
    }
    // While the child's leases live: in progress, nothing runs.
    let inbox = Inbox::builder().build().unwrap();
    let messages = keys
        .iter()
        .map(|k| BatchMessage::new(Call::new(biz, k).lease(lease), Some(1), k.clone()));
    let handled = inbox
        .handle_batch(&*site.store, messages, |key: String| async move {
            Ok::<_, IdemError>(key)
        })
        .await;
    for (key, h) in keys.iter().zip(&handled) {
        assert_eq!(h.outcome, Some(Outcome::InProgress), "{key}: {h:?}");
        assert!(matches!(h.verdict, Verdict::Requeue { .. }), "{key}");
    }
    // Once they ended: two batches released together take each key over once.
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    batches_until_acked(&site, biz, &keys, lease).await;
    for key in &keys {
        let effects = effects_of(&site.effects, biz, key).await;
        assert_eq!(
            effects.len(),
            child_effects + 1,
            "{key}: one takeover ran the body once more: {effects:?}"
        );
        let record = site.store.load(biz, key).await.unwrap().unwrap();
        assert_eq!(
            (record.status, record.attempt),
            (Status::Succeeded, 2),
            "{key}"
        );
    }
}

async fn killed_after_its_batchs_bodies(site: Site) {
    // Lease mode alone cannot know the bodies ran: the takeover runs each again (a recover fn or
    // steps are how a body finds its earlier effect).
    killed_holding_a_batch(site, Act::BatchAfterBodies, 1).await;
}

async fn killed_before_its_batchs_bodies(site: Site) {
    killed_holding_a_batch(site, Act::BatchBeforeBodies, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_killed_after_its_batchs_bodies() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    killed_after_its_batchs_bodies(sqlite_site().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_killed_before_its_batchs_bodies() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    killed_before_its_batchs_bodies(sqlite_site().await).await;
}

on_server! {
    feature = "redis": redis_killed_after_its_batchs_bodies = killed_after_its_batchs_bodies on redis_site;
    feature = "redis": redis_killed_before_its_batchs_bodies = killed_before_its_batchs_bodies on redis_site;
    feature = "postgres": postgres_killed_after_its_batchs_bodies = killed_after_its_batchs_bodies on pg_site;
    feature = "postgres": postgres_killed_before_its_batchs_bodies = killed_before_its_batchs_bodies on pg_site;
    feature = "mysql": mysql_killed_after_its_batchs_bodies = killed_after_its_batchs_bodies on my_site;
    feature = "mysql": mysql_killed_before_its_batchs_bodies = killed_before_its_batchs_bodies on my_site;
    feature = "dynamodb": dynamo_killed_after_its_batchs_bodies = killed_after_its_batchs_bodies on dynamo_site;
    feature = "dynamodb": dynamo_killed_before_its_batchs_bodies = killed_before_its_batchs_bodies on dynamo_site;
}
