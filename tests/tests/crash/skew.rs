//! Callers on clocks 10 minutes behind and ahead of the store (libfaketime).

use super::*;

/// Runs one whole call in a child (its spec adjusted by `spec_of`); its `RESULT` line.
#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
async fn once_at(site: &Site, biz: &str, key: &str, spec_of: impl Fn(Spec) -> Spec) -> String {
    let spec = spec_of(site.spec(biz, key, Duration::from_secs(2), Act::Once));
    tokio::task::spawn_blocking(move || {
        let mut child = Running::spawn(&spec);
        let said = child.wait_for("RESULT");
        child.child.wait().unwrap();
        said
    })
    .await
    .unwrap()
}

/// Callers 10 minutes behind and ahead of the store see the same outcomes as on a true clock: a
/// live claim is in progress for both, it expires after its lease (not 10 minutes early or late),
/// a record within its TTL replays for both.
#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
async fn skewed_clocks_change_no_outcome(site: Site) {
    if libfaketime().is_none() {
        assert!(
            !contract::server::required(),
            "libfaketime is missing (apt-get install faketime) and IDEM_REQUIRE_SERVICES=1"
        );
        eprintln!("skipped: libfaketime is not installed (apt-get install faketime)");
        return;
    }
    let (biz, key) = ("SKEW", "order-1");
    let lease = Duration::from_secs(2);
    // A short TTL: a caller deciding by its own clock 10 minutes ahead would find it expired.
    let ttl = Duration::from_secs(300);
    let skewed = |skew: &'static str| {
        move |mut spec: Spec| {
            spec.lease_ms = lease.as_millis() as u64;
            spec.ttl_ms = ttl.as_millis() as u64;
            spec.skew = Some(skew.to_owned());
            spec
        }
    };
    // A, 10 minutes behind, claims and hangs.
    let mut hold = skewed("-10m")(site.spec(biz, key, lease, Act::Hold));
    hold.ttl_ms = ttl.as_millis() as u64;
    let a = tokio::task::spawn_blocking(move || Running::start(&hold))
        .await
        .unwrap();
    // B, 10 minutes ahead, finds the claim live (by its own clock A's lease ended 10 minutes ago).
    let said = once_at(&site, biz, key, skewed("+10m")).await;
    assert!(
        said.starts_with("RESULT in_progress error a call with this key is still in progress"),
        "{said}"
    );
    a.kill();
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    // After the lease (by the store's clock) B takes over, once.
    assert_eq!(
        once_at(&site, biz, key, skewed("+10m")).await,
        "RESULT taken_over +10m"
    );
    // C, 10 minutes behind, and a caller on the true clock replay B's result.
    assert_eq!(
        once_at(&site, biz, key, skewed("-10m")).await,
        "RESULT replayed +10m"
    );
    assert_eq!(
        once_at(&site, biz, key, |s| s).await,
        "RESULT replayed +10m"
    );
    assert_eq!(effects_of(&site.effects, biz, key).await, ["+10m"]);
}

on_server! {
    feature = "redis": redis_skewed_clocks_change_no_outcome = skewed_clocks_change_no_outcome on redis_site;
    feature = "postgres": postgres_skewed_clocks_change_no_outcome = skewed_clocks_change_no_outcome on pg_site;
    feature = "mysql": mysql_skewed_clocks_change_no_outcome = skewed_clocks_change_no_outcome on my_site;
}
// Not DynamoDB: it has no clock a condition can read, so its callers decide by their own clocks
// within a skew margin (tests/stores/dynamo.rs, `skew`), and 10 minutes is past any margin.
