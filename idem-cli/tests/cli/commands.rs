//! Every command of the binary on one store, each outcome checked against the store itself.

use super::*;

/// `ms` to the second as RFC 3339 UTC starts it (`2026-12-01T17:14:35`), from `date`.
fn rfc3339_prefix(ms: i64) -> String {
    let out = Command::new("date")
        .args(["-u", "-d", &format!("@{}", ms / 1000), "+%Y-%m-%dT%H:%M:%S"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The numbers of `biz`'s row of `idem stats`: PROCESSING, SUCCEEDED, FAILED, TOTAL, TOMBSTONES.
fn stats_row(out: &str, biz: &str) -> Option<Vec<u64>> {
    out.lines().find_map(|line| {
        let mut cells = line.split_whitespace();
        (cells.next() == Some(biz)).then(|| cells.map(|c| c.parse().unwrap()).collect())
    })
}

/// Every command of the binary on one store, each outcome checked against the store itself.
pub(super) async fn every_command(t: Target) {
    let url = t.url.as_str();
    let sql = t.name != "redis";
    eprintln!("{}: {}", t.name, url);

    // migrate --print, without connecting: the DDL with the test's table, or none.
    let out = idem(url, &["migrate", "--print"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    if sql {
        assert!(out.stdout.contains("CREATE TABLE IF NOT EXISTS"), "{out:?}");
        assert!(out.stdout.contains(&t.place), "{out:?}");
    } else {
        assert!(out.stdout.contains("no DDL"), "{out:?}");
    }
    // The URL after `migrate`, as the library's messages print it: the same DDL; --url with
    // another URL is refused, IDEM_STORE_URL gives way.
    let printed = out.stdout.clone();
    let out = idem_bare(&["migrate", "--print", url], None).await;
    assert_eq!((out.code, &out.stdout), (0, &printed), "{out:?}");
    let out = idem_bare(&["migrate", "--print", url], Some("memory:")).await;
    assert_eq!((out.code, &out.stdout), (0, &printed), "{out:?}");
    let out = idem("memory:", &["migrate", "--print", url]).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("two store URLs"), "{out:?}");
    let out = idem(url, &["migrate", "--print", url]).await;
    assert_eq!(
        (out.code, &out.stdout),
        (0, &printed),
        "the same URL twice: {out:?}"
    );

    // migrate: applied (the URL after `migrate`), and the store works afterwards.
    let out = idem_bare(&["migrate", url], None).await;
    assert_eq!(out.code, 0, "{out:?}");
    let said = if sql {
        "migrated: "
    } else {
        "nothing to migrate"
    };
    assert!(out.stdout.starts_with(said), "{out:?}");
    let store = idem::connect(url).await.unwrap();

    let out = idem(url, &["stats"]).await;
    assert_eq!(
        (out.code, out.stdout.starts_with("no records")),
        (0, true),
        "{out:?}"
    );

    // The records, made through the library.
    let (a, b) = (server::unique("CLI_A"), server::unique("CLI_B"));
    let done: String = Call::new(a.clone(), "done")
        .fingerprint(&("done", 7))
        .run(&store, async { Ok::<_, IdemError>("receipt-7".to_owned()) })
        .await
        .unwrap();
    assert_eq!(done, "receipt-7");
    let failed: Result<String, IdemError> = Call::new(a.clone(), "failed")
        .run(&store, async { Err(IdemError::store("declined")) })
        .await;
    assert!(failed.is_err());
    let stuck = stuck_record(&store, &a, "stuck").await;
    let (live, _) = acquire(&store, &req(&b, "live", Duration::from_secs(600), HOUR)).await;

    // stats: the aligned table with totals.
    let out = idem(url, &["stats"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.lines().next().unwrap().split_whitespace().eq([
            "BIZ",
            "PROCESSING",
            "SUCCEEDED",
            "FAILED",
            "TOTAL",
            "TOMBSTONES"
        ]),
        "{out:?}"
    );
    assert_eq!(
        stats_row(&out.stdout, &a),
        Some(vec![1, 1, 1, 3, 0]),
        "{out:?}"
    );
    assert!(
        out.stdout.lines().any(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            l.starts_with("  POST /orders/{id} ") && cells[2..] == ["1", "0", "0", "1", "0"]
        }),
        "the stuck layer record counted under its route: {out:?}"
    );
    assert_eq!(
        stats_row(&out.stdout, &b),
        Some(vec![1, 0, 0, 1, 0]),
        "{out:?}"
    );
    assert_eq!(
        stats_row(&out.stdout, "total"),
        Some(vec![2, 1, 1, 4, 0]),
        "{out:?}"
    );

    // inspect.
    let rec = store.load(&a, "done").await.unwrap().unwrap();
    let out = idem(url, &["inspect", &a, "done"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let fp = rec.fingerprint.clone().unwrap();
    for line in [
        "status       SUCCEEDED".to_owned(),
        "attempt      1".to_owned(),
        format!("fence        {}", rec.fence),
        format!("fingerprint  present ({})", &fp[..12]),
        format!(
            "result       {} bytes",
            rec.snapshot.as_ref().unwrap().len()
        ),
        "steps        absent".to_owned(),
        "lease        none: a SUCCEEDED record is held by no call".to_owned(),
    ] {
        assert!(out.stdout.lines().any(|l| l == line), "{line:?} in {out:?}");
    }
    assert!(
        !out.stdout.contains("lease until"),
        "a finished record's lease is not shown as running: {out:?}"
    );
    assert!(
        !out.stdout.contains("request "),
        "no route for a record that is not the HTTP layer's: {out:?}"
    );
    let expiry = format!("expires at   {}.", rfc3339_prefix(rec.expire_at_ms));
    let line = out.stdout.lines().find(|l| l.starts_with("expires at"));
    assert!(
        line.is_some_and(|l| l.starts_with(&expiry) && l.ends_with("Z (in 6d23h)")),
        "{expiry:?} in {out:?}"
    );
    assert!(
        !out.stdout.contains("receipt-7"),
        "the result only when asked: {out:?}"
    );
    let out = idem(url, &["inspect", &a, "done", "--show-result"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("receipt-7"), "{out:?}");
    let out = idem(url, &["inspect", &a, "absent"]).await;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.starts_with("no record"), "{out:?}");

    // inspect by what an HTTP layer's client sent: its caller and its Idempotency-Key.
    let layer_key = idem::key::http_record_key(Some("alice"), "order-77").unwrap();
    Call::new(a.clone(), &layer_key)
        .run(&store, async { Ok::<_, IdemError>(1u8) })
        .await
        .unwrap();
    let out = idem(
        url,
        &["inspect", &a, "\"order-77\"", "--principal", "alice"],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.starts_with(&format!(
            "HTTP or gRPC layer key \"\\\"order-77\\\"\" of principal \"alice\": record {layer_key}"
        )) && out.stdout.contains("status       SUCCEEDED"),
        "{out:?}"
    );
    let out = idem(url, &["inspect", &a, "order-77", "--principal", "bob"]).await;
    assert_eq!(out.code, 1, "another caller's key: {out:?}");
    assert!(out.stdout.contains("no record"), "{out:?}");
    let out = idem(url, &["inspect", &a, "two words", "--http"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("Idempotency-Key"), "{out:?}");

    // stuck: the ended lease, not the live one.
    let out = idem(url, &["stuck"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let listed: Vec<&str> = out.stdout.lines().skip(1).collect();
    assert!(listed[0].starts_with(&format!("{a}  stuck")), "{out:?}");
    assert!(listed[0].contains(&stuck.fence.to_string()), "{out:?}");
    assert!(
        listed[0].ends_with("ago)  POST /orders/{id}"),
        "the layer record's method and route: {out:?}"
    );
    assert!(
        out.stdout.lines().next().unwrap().ends_with("  REQUEST"),
        "{out:?}"
    );
    let out = idem(url, &["inspect", &a, "stuck"]).await;
    assert!(
        out.stdout
            .lines()
            .any(|l| l == "request      POST /orders/{id}")
            && out
                .stdout
                .lines()
                .any(|l| l == "fingerprint  present (0123456789ab)"),
        "{out:?}"
    );
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("lease until  ") && l.contains("(ended ")),
        "{out:?}"
    );
    assert!(!out.stdout.contains("live"), "{out:?}");
    assert_eq!(
        listed[listed.len() - 2],
        "1 stuck record (PROCESSING past their lease)"
    );
    // What is not listed (a record under a live lease, such as b's) is said, with where to see it.
    for out in [
        idem(url, &["stuck"]).await,
        idem(url, &["stuck", "--biz", &b, "--limit", "5"]).await,
    ] {
        assert_eq!(out.code, 0, "{out:?}");
        let last = out.stdout.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("not listed: records PROCESSING under a lease still running")
                && last.contains("`idem stats`")
                && last.contains("`idem inspect BIZ KEY`"),
            "{out:?}"
        );
    }
    let out = idem(url, &["stuck", "--biz", &b, "--limit", "5"]).await;
    assert!(out.stdout.starts_with("no stuck records"), "{out:?}");
    // The live one is seen with inspect: its lease is running.
    let out = idem(url, &["inspect", &b, "live"]).await;
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("lease until  ") && l.contains("(in 9m")),
        "{out:?}"
    );
    for bad in ["0", "10001", "x"] {
        let out = idem(url, &["stuck", "--limit", bad]).await;
        assert_eq!(out.code, 2, "{out:?}");
        assert!(out.stderr.contains("--limit"), "{out:?}");
    }
    let out = idem(url, &["stuck", "--limit", "0"]).await;
    assert!(
        out.stderr.contains("1..=10000"),
        "the range is told: {out:?}"
    );

    // release: refusals change nothing.
    let before = store.load(&a, "done").await.unwrap();
    let out = idem(
        url,
        &["release", &a, "done", "--reason", "INC-7", "--force"],
    )
    .await;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stdout.starts_with("refused: the record SUCCEEDED"),
        "{out:?}"
    );
    assert_eq!(
        store.load(&a, "done").await.unwrap(),
        before,
        "a success is never touched"
    );
    let out = idem(url, &["release", &b, "live", "--reason", "INC-7"]).await;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stdout.starts_with("refused: the record is PROCESSING"),
        "{out:?}"
    );
    assert!(out.stdout.contains("--force"), "{out:?}");
    let out = idem(url, &["release", &a, "absent", "--reason", "INC-7"]).await;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.starts_with("not found"), "{out:?}");
    for bad in ["", "two\nlines", &"x".repeat(201)] {
        let out = idem(url, &["release", &a, "stuck", "--reason", bad]).await;
        assert_eq!(out.code, 2, "{bad:?}: {out:?}");
        assert!(out.stderr.contains("1 to 200 bytes"), "{out:?}");
    }
    let out = idem(url, &["release", &a, "stuck"]).await;
    assert_eq!(out.code, 2, "--reason is required: {out:?}");
    let rec = store.load(&a, "stuck").await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.fence),
        (Status::Processing, stuck.fence),
        "unchanged"
    );

    // release: the stuck claim's lease ends, under its fence, and stays PROCESSING; the next call
    // takes it over and asks its recover fn, which finds the effect: the body does not run.
    let out = idem(
        url,
        &["release", &a, "stuck", "--reason", "INC-7: worker died"],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.starts_with(&format!(
            "released: was PROCESSING (attempt 1, fence {}), its lease ended now",
            stuck.fence
        )) && out.stdout.contains("asks its recover fn"),
        "{out:?}"
    );
    let rec = store.load(&a, "stuck").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.fence), (Status::Processing, stuck.fence));
    let (rerun, report) = idem::metrics::observe(
        Call::new(a.clone(), "stuck")
            .recover(|| async { Ok::<_, IdemError>(Some(7u8)) })
            .run(&store, async { Ok::<_, IdemError>(1u8) }),
    )
    .await;
    assert_eq!(rerun.unwrap(), 7, "the recovered result, not a second run");
    let report = report.unwrap();
    assert_eq!(
        (report.outcome, report.attempt),
        (idem::metrics::Outcome::Recovered, 2)
    );
    // --mark-failed of a FAILED record: nothing to do.
    let out = idem(
        url,
        &[
            "release",
            &a,
            "failed",
            "--reason",
            "INC-7",
            "--mark-failed",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.starts_with("already released"), "{out:?}");
    // --force --mark-failed on a live lease: FAILED under its fence, with the warning; its
    // holder's mark is then refused, and the next call runs the body again.
    let out = idem(
        url,
        &[
            "release",
            &b,
            "live",
            "--reason",
            "INC-8",
            "--force",
            "--mark-failed",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.starts_with("marked FAILED: was PROCESSING")
            && out.stdout.contains("WITHOUT asking recover")
            && out.stdout.contains("its live lease OVERRIDDEN by --force")
            && out.stdout.contains("its mark will be refused by the fence"),
        "{out:?}"
    );
    assert_eq!(
        store.load(&b, "live").await.unwrap().unwrap().status,
        Status::Failed
    );
    let late = store.complete(&b, "live", &live, b"\"late\"", HOUR).await;
    assert!(matches!(late, Err(IdemError::LeaseLost { .. })), "{late:?}");
    // --force on a live lease (a release): said to have overridden it; the record stays
    // PROCESSING under its fence, the next call takes it over at once, and the old holder's mark
    // is then refused.
    let d = server::unique("CLI_D");
    let (held, _) = acquire(&store, &req(&d, "live", Duration::from_secs(600), HOUR)).await;
    let out = idem(
        url,
        &[
            "release",
            &d,
            "live",
            "--reason",
            "INC-9: pod gone",
            "--force",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.starts_with(&format!(
            "released: was PROCESSING (attempt 1, fence {}), its live lease OVERRIDDEN by --force (",
            held.fence
        )) && out.stdout.contains("its holder may still be running")
            && out.stdout.contains("that holder's mark is refused by the fence"),
        "{out:?}"
    );
    let rec = store.load(&d, "live").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.fence), (Status::Processing, held.fence));
    let (_, how) = acquire(&store, &req(&d, "live", Duration::from_secs(60), HOUR)).await;
    assert_eq!(how, Acquired::TakeOver);
    let late = store.complete(&d, "live", &held, b"\"late\"", HOUR).await;
    assert!(matches!(late, Err(IdemError::LeaseLost { .. })), "{late:?}");
    // Without --force on an ended lease: nothing said of an override.
    let out = idem(url, &["release", &d, "live", "--reason", "INC-9"]).await;
    assert_eq!(out.code, 1, "the new holder's lease runs: {out:?}");
    let ended = stuck_record(&store, &d, "ended").await;
    let out = idem(
        url,
        &["release", &d, "ended", "--reason", "INC-9", "--force"],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.starts_with(&format!(
            "released: was PROCESSING (attempt 1, fence {}), its lease ended now",
            ended.fence
        )) && !out.stdout.contains("OVERRIDDEN"),
        "--force on an ended lease overrides nothing: {out:?}"
    );

    // A layer's key names the layer by the record's request: a gRPC method's path, an HTTP
    // method and route; without one, by the default business types.
    for (biz, fingerprint, layer) in [
        (d.as_str(), Some("/shop.Orders/Create"), "gRPC layer"),
        (d.as_str(), Some("POST /orders/{id}"), "HTTP layer"),
        ("GRPC", None, "gRPC layer"),
        ("HTTP", None, "HTTP layer"),
    ] {
        let sent = server::unique("k");
        let key = idem::key::http_record_key(Some("carol"), &sent).unwrap();
        let fp = fingerprint.map(|route| format!("{route} {}", "0".repeat(64)));
        let mut r = req(biz, &key, Duration::from_secs(60), HOUR);
        r.fingerprint = fp.as_deref();
        let (claim, _) = acquire(&store, &r).await;
        store.complete(biz, &key, &claim, b"1", HOUR).await.unwrap();
        for args in [
            vec!["inspect", biz, &sent, "--principal", "carol"],
            vec![
                "release",
                biz,
                &sent,
                "--principal",
                "carol",
                "--reason",
                "x",
            ],
        ] {
            let out = idem(url, &args).await;
            assert!(
                out.stdout.starts_with(&format!(
                    "{layer} key {sent:?} of principal \"carol\": record {key}\n"
                )),
                "{args:?}: {out:?}"
            );
        }
    }

    // sweep: expired records (and tokens), then none.
    for bad in ["0", "10001"] {
        let out = idem(url, &["sweep", "--batch", bad]).await;
        assert_eq!(out.code, 2, "{out:?}");
        assert!(out.stderr.contains("1..=10000"), "{out:?}");
    }
    let tokens = store.tokens().unwrap();
    let tiny = Duration::from_millis(1);
    // A lease long enough for the mark to land on a slow machine (a 1 ms lease could end before
    // it, and Redis would expire the key), a life of 1 ms: expired once marked.
    let lease = Duration::from_millis(500);
    for key in ["e1", "e2", "e3"] {
        let (c, _) = acquire(&store, &req(&b, key, lease, tiny)).await;
        store.complete(&b, key, &c, b"1", tiny).await.unwrap();
        tokens.issue(tiny, None).await.unwrap();
    }
    // Not an assertion on time: only so the lives (and Redis's keys, which last the lease) are
    // over by every clock.
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let out = idem(url, &["sweep", "--batch", "1", "--tokens"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let count = |what: &str| -> u64 {
        let line = out
            .stdout
            .lines()
            .find(|l| l.ends_with(what))
            .unwrap_or_else(|| panic!("{what} in {out:?}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    if sql {
        // Redis expires them by itself: whatever is left for the sweep.
        assert_eq!(count("expired records"), 3, "{out:?}");
        assert_eq!(count("expired tokens"), 3, "{out:?}");
    }
    assert!(out.stderr.is_empty(), "no spinner off a terminal: {out:?}");
    for key in ["e1", "e2", "e3"] {
        assert!(store.load(&b, key).await.unwrap().is_none(), "{key} swept");
    }
    let out = idem(url, &["sweep"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, "swept 0 expired records\n", "{out:?}");

    // stats again: what the commands did.
    let out = idem(url, &["stats"]).await;
    assert_eq!(
        stats_row(&out.stdout, &a),
        Some(vec![0, 3, 1, 4, 0]),
        "{out:?}"
    );
    assert_eq!(
        stats_row(&out.stdout, &b),
        Some(vec![0, 0, 1, 1, 0]),
        "{out:?}"
    );

    // A result kept 1 ms under a key kept an hour: a tombstone in stats and inspect, whose
    // result a sweep drops.
    let c = server::unique("CLI_C");
    let kept: String = Call::new(c.clone(), "gone")
        .ttl(HOUR)
        .result_ttl(Duration::from_millis(1))
        .run(&store, async { Ok::<_, IdemError>("receipt-9".to_owned()) })
        .await
        .unwrap();
    assert_eq!(kept, "receipt-9");
    // Not an assertion on time: only so the result's 1 ms is over by every clock.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let out = idem(url, &["stats"]).await;
    assert_eq!(
        stats_row(&out.stdout, &c),
        Some(vec![0, 1, 0, 1, 1]),
        "{out:?}"
    );
    assert!(
        out.stdout.contains("TOMBSTONES: succeeded records"),
        "{out:?}"
    );
    let out = idem(url, &["inspect", &c, "gone"]).await;
    let line = out.stdout.lines().find(|l| l.starts_with("result kept"));
    assert!(
        line.is_some_and(
            |l| l.ends_with("(passed: a tombstone, repeats refused as result expired)")
        ),
        "{out:?}"
    );
    let out = idem(url, &["sweep"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let out = idem(url, &["inspect", &c, "gone", "--show-result"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.contains("result kept  no: dropped")
            && out
                .stdout
                .contains("(no result: it was dropped when its result ttl passed)")
            && !out.stdout.contains("receipt-9"),
        "{out:?}"
    );
}
