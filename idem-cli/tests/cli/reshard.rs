//! `idem reshard` on three SQLite files: the status of a store with no layout, a planned move
//! that changes no routing, the move itself, its bad flags, and every key replayed afterwards
//! whatever the order of the shards.

use super::*;

/// Calls keys `0..n` through `url`; how many bodies ran.
async fn call_all(url: &str, n: usize) -> usize {
    let store = idem::connect(url).await.unwrap();
    let mut ran = 0;
    for i in 0..n {
        let key = format!("k{i}");
        let mut body_ran = false;
        let answer: Result<String, IdemError> = Call::new("PAY", &key)
            .run(&store, async {
                body_ran = true;
                Ok(format!("receipt {i}"))
            })
            .await;
        assert_eq!(answer.unwrap(), format!("receipt {i}"));
        ran += usize::from(body_ran);
    }
    ran
}

#[tokio::test(flavor = "multi_thread")]
async fn reshard_moves_the_keys_and_every_list_replays_them() {
    let dir = tempfile::tempdir().unwrap();
    let shard = |name: &str| format!("sqlite:{}", dir.path().join(format!("{name}.db")).display());
    let (a, b, c) = (shard("a"), shard("b"), shard("c"));
    for url in [&a, &b, &c] {
        assert_eq!(idem(url, &["migrate"]).await.code, 0);
    }
    let two = format!("sharded:{a}|{b}");
    let three = format!("sharded:{a}|{b}|{c}");
    assert_eq!(call_all(&two, 120).await, 120);

    let status = idem(&two, &["reshard", "--status"]).await;
    assert_eq!(status.code, 0, "{status:?}");
    assert!(status.stdout.contains("no layout written"), "{status:?}");

    // Bad flags and lists, refused before anything is written.
    for (args, says) in [
        (
            vec!["reshard", three.as_str(), "--settle", "1s"],
            "outside 3s",
        ),
        (vec!["reshard", three.as_str(), "--batch", "0"], "0"),
        (vec!["reshard", a.as_str()], "not a sharded one"),
        (vec!["reshard"], "TO_URL"),
    ] {
        let out = idem(&two, &args).await;
        assert_eq!(out.code, 2, "{args:?}: {out:?}");
        assert!(out.stderr.contains(says), "{args:?}: {out:?}");
    }
    let out = idem(&a, &["reshard", "--status"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("not a sharded one"), "{out:?}");

    let planned = idem(&two, &["reshard", &three, "--plan-only"]).await;
    assert_eq!(planned.code, 0, "{planned:?}");
    assert!(planned.stdout.contains("step 1 (planned)"), "{planned:?}");
    // Planned: the new list, in another order, routes as the old one.
    assert_eq!(call_all(&format!("sharded:{c}|{b}|{a}"), 120).await, 0);

    let done = idem(&two, &["reshard", &three, "--batch", "7"]).await;
    assert_eq!(done.code, 0, "{done:?}");
    assert!(done.stdout.contains("step 4 (done)"), "{done:?}");
    assert!(
        done.stdout.contains("the window can close") || done.stdout.contains("done:"),
        "{done:?}"
    );
    let status = idem(&three, &["reshard", "--status"]).await;
    assert!(status.stdout.contains("step 4, done"), "{status:?}");
    assert_eq!(call_all(&format!("sharded:{b}|{c}|{a}"), 120).await, 0);
    // The sharded store's own records are left out of its stats.
    let stats = idem(&three, &["stats"]).await;
    assert_eq!(stats.code, 0, "{stats:?}");
    assert!(!stats.stdout.contains("idem.layout"), "{stats:?}");
}
