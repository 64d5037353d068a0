//! Holders killed after their effect, through `#[idempotent(recover = …)]` (SQLite).

use super::*;

/// The effects table the attribute trial's fns use (one per process: only that trial sets it).
static ATTRIBUTE_EFFECTS: std::sync::OnceLock<SqlitePool> = std::sync::OnceLock::new();

/// Registers the attribute trial's store (`crash_attribute`) and effects table in this process.
pub(super) async fn attribute_site(records: &PathBuf, effects: &PathBuf) {
    idem::register_store("crash_attribute", SqliteStore::open(records).await.unwrap());
    let _ = ATTRIBUTE_EFFECTS.set(effects_pool(effects).await);
}

/// The "real business result": the first effect recorded for the order.
async fn payment_of(order: &str) -> Result<Option<String>, IdemError> {
    let seen = effects_of(ATTRIBUTE_EFFECTS.get().unwrap(), "CRASHATTR", order).await;
    Ok(seen.first().map(|who| format!("recovered {who}")))
}

/// Writes the effect, then (when `hang`) says READY and waits to be killed.
#[idem::idempotent(
    biz = "CRASHATTR",
    key = "order",
    store = "crash_attribute",
    lease = "3s",
    recover = "payment_of(order)"
)]
pub(super) async fn charge(order: &str, who: &str, hang: bool) -> Result<String, IdemError> {
    effect(ATTRIBUTE_EFFECTS.get().unwrap(), "CRASHATTR", order, who).await?;
    if hang {
        say("READY");
        std::future::pending::<()>().await;
    }
    Ok(format!("charged by {who}"))
}

/// `killed_after_its_effect` through `#[idempotent(recover = …)]`: 10 children killed after their
/// effect; after the lease each repeat is recovered, and the body never runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_killed_after_its_effect_through_the_attribute() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    let site = sqlite_site().await;
    let Backend::Sqlite { path } = &site.backend else {
        unreachable!()
    };
    attribute_site(path, &site.effects_path).await;
    let lease = Duration::from_secs(3);
    let keys = site
        .kill_n(
            10,
            "CRASHATTR",
            lease,
            Act::EffectThroughTheAttribute,
            10,
            async |key| {
                let record = site
                    .store
                    .load("CRASHATTR", key)
                    .await
                    .unwrap()
                    .expect("claimed");
                assert_eq!(record.status, Status::Processing, "{key}");
            },
        )
        .await;
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    for key in &keys {
        let (res, report) = idem::metrics::observe(charge(key, "repeat", false)).await;
        assert_eq!(res.unwrap(), "recovered child", "{key}");
        assert_eq!(report.unwrap().outcome, Outcome::Recovered, "{key}");
        assert_eq!(
            effects_of(&site.effects, "CRASHATTR", key).await,
            ["child"],
            "{key}"
        );
        let again = charge(key, "third", false).await.unwrap();
        assert_eq!(again, "recovered child", "{key}: replayed");
    }
}
