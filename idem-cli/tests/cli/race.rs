//! `idem release --mark-failed` racing a takeover of the same ended lease: one winner each time.

use super::*;

/// `idem release --mark-failed` through the binary while a takeover claims the same ended lease,
/// many times: either the release won (FAILED under the old fence; the claim then ran as a retry)
/// or the takeover did (the release refused or lost, nothing changed by it); never both, and the
/// new holder's mark succeeds.
pub(super) async fn release_races_a_takeover(t: Target) {
    let url = t.url.as_str();
    let store = idem::connect(url).await.unwrap();
    store.migrate().await.unwrap();
    let biz = server::unique("CLI_RACE");
    const TRIALS: u64 = 12;
    let (mut released, mut beaten) = (0, 0);
    for i in 0..TRIALS {
        let key = format!("k{i}");
        let old = stuck_record(&store, &biz, &key).await;
        let child = idem_cmd(
            url,
            &["release", &biz, &key, "--reason", "race", "--mark-failed"],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
        // Spread the claim over the binary's start, read and write (no assertion on time).
        tokio::time::sleep(Duration::from_millis(i * 2)).await;
        let (new, how) = acquire(&store, &req(&biz, &key, Duration::from_secs(60), HOUR)).await;
        let out = tokio::task::spawn_blocking(move || ran(child.wait_with_output().unwrap()))
            .await
            .unwrap();
        assert!(new.fence > old.fence, "{key}");
        match (out.code, how) {
            (0, Acquired::RetryAfterFailure) => {
                released += 1;
                assert!(out.stdout.starts_with("marked FAILED: "), "{key}: {out:?}");
                assert!(
                    out.stdout.contains(&format!("fence {}", old.fence)),
                    "{out:?}"
                );
            }
            (1, Acquired::TakeOver) => {
                beaten += 1;
                assert!(
                    out.stdout.starts_with("lost the race")
                        || out.stdout.starts_with("refused: the record is PROCESSING"),
                    "{key}: {out:?}"
                );
                assert!(
                    out.stdout.contains(&format!("fence {}", new.fence)),
                    "{out:?}"
                );
            }
            other => panic!("{key}: two winners or none: {other:?}, {out:?}"),
        }
        let rec = store.load(&biz, &key).await.unwrap().unwrap();
        assert_eq!(
            (rec.status, rec.fence),
            (Status::Processing, new.fence),
            "{key}: never FAILED under the new holder's fence"
        );
        store
            .complete(&biz, &key, &new, b"\"new\"", HOUR)
            .await
            .unwrap();
        let late = store.complete(&biz, &key, &old, b"\"old\"", HOUR).await;
        assert!(
            matches!(late, Err(IdemError::LeaseLost { .. })),
            "{key}: {late:?}"
        );
    }
    eprintln!(
        "{}: the release won {released}, the takeover {beaten}",
        t.name
    );
}
