//! Batch claims: `Store::claim_batch` decides each key as a claim of its own would (every row of
//! the decision table in one batch), each claim it makes is finished on its own, and `idem::batch::Batch`
//! runs each key's business once under batches released at once, with keys repeated inside a batch
//! and across batches, audited in the independent effects table.

use idem::{
    batch::Batch,
    store::{BatchClaim, BatchItem, MAX_BATCH},
};

use super::*;

fn items<'a>(keys: &[(&'a str, Option<&'a str>)]) -> Vec<BatchItem<'a>> {
    keys.iter()
        .map(|&(key, fingerprint)| BatchItem { key, fingerprint })
        .collect()
}

fn batch<'a>(biz: &'a str, items: &'a [BatchItem<'a>]) -> BatchClaim<'a> {
    BatchClaim {
        biz,
        items,
        lease: secs(30),
        ttl: TTL,
    }
}

/// One record in each state of the decision table, then one batch that claims them all (and a new
/// key): each outcome is the one a claim of its own gives. Then the claims it made are finished
/// one by one, each changing only its own record.
pub async fn a_batch_claim_decides_each_key_as_a_claim_would(s: Subject) {
    let (store, clock, biz) = (s.store, s.clock, biz("batch_table"));
    let with_fp = |key, fp, lease| {
        let mut r = req(&biz, key, lease);
        r.fingerprint = Some(fp);
        r
    };
    // done: a success; stuck: its lease will end; failed: a failure; short: a success whose ttl
    // will pass; gone: a success whose result ttl will pass.
    let (done, _) = acquire(&*store, &with_fp("done", "f1", secs(30))).await;
    store
        .complete(&biz, "done", &done, b"R1", TTL)
        .await
        .unwrap();
    let (stuck, _) = acquire(&*store, &req(&biz, "stuck", secs(2))).await;
    let (failed, _) = acquire(&*store, &req(&biz, "failed", secs(30))).await;
    store.fail(&biz, "failed", &failed).await.unwrap();
    let mut short = req(&biz, "short", secs(2));
    short.ttl = secs(3);
    let (s_claim, _) = acquire(&*store, &short).await;
    store
        .complete(&biz, "short", &s_claim, b"S", secs(3))
        .await
        .unwrap();
    let (g_claim, _) = acquire(&*store, &with_fp("gone", "f1", secs(30))).await;
    store
        .complete_keeping(&biz, "gone", &g_claim, b"G", TTL, secs(2))
        .await
        .unwrap();
    clock.advance(secs(10));
    // live: a claim whose lease runs.
    acquire(&*store, &with_fp("live", "f1", secs(30))).await;

    let asked = items(&[
        ("new", None),
        ("done", Some("f1")),
        ("live", Some("f1")),
        ("failed", None),
        ("stuck", None),
        ("short", None),
        ("gone", Some("f1")),
        ("mismatch_done", Some("f2")),
        ("mismatch_live", Some("f2")),
    ]);
    // The last two name records made now under other payloads.
    let (m_done, _) = acquire(&*store, &with_fp("mismatch_done", "f1", secs(30))).await;
    store
        .complete(&biz, "mismatch_done", &m_done, b"M", TTL)
        .await
        .unwrap();
    acquire(&*store, &with_fp("mismatch_live", "f1", secs(30))).await;

    let outcomes = store.claim_batch(&batch(&biz, &asked)).await.unwrap();
    assert_eq!(outcomes.len(), asked.len());
    let acquired = |i: usize, how: Acquired, attempt: u32| match &outcomes[i] {
        ClaimOutcome::Acquired { claim, how: got } if *got == how && claim.attempt == attempt => {
            *claim
        }
        other => panic!(
            "{}: expected {how:?} at attempt {attempt}, got {other:?}",
            asked[i].key
        ),
    };
    let new = acquired(0, Acquired::Fresh, 1);
    assert!(
        matches!(&outcomes[1], ClaimOutcome::Replay { snapshot } if snapshot == b"R1"),
        "{:?}",
        outcomes[1]
    );
    assert!(
        matches!(outcomes[2], ClaimOutcome::InProgress { retry_after } if retry_after > secs(20)),
        "{:?}",
        outcomes[2]
    );
    let retried = acquired(3, Acquired::RetryAfterFailure, 2);
    let taken = acquired(4, Acquired::TakeOver, 2);
    assert!(taken.fence > stuck.fence, "a takeover raises the fence");
    let reborn = acquired(5, Acquired::Fresh, 1);
    assert!(reborn.fence > s_claim.fence, "a new life raises the fence");
    assert!(
        matches!(outcomes[6], ClaimOutcome::ResultGone),
        "{:?}",
        outcomes[6]
    );
    assert!(
        matches!(outcomes[7], ClaimOutcome::Mismatch),
        "{:?}",
        outcomes[7]
    );
    assert!(
        matches!(outcomes[8], ClaimOutcome::Mismatch),
        "{:?}",
        outcomes[8]
    );

    // Each claim is finished on its own: the failed one frees only its key.
    store.complete(&biz, "new", &new, b"N", TTL).await.unwrap();
    store.fail(&biz, "failed", &retried).await.unwrap();
    assert!(matches!(
        store.claim(&req(&biz, "stuck", secs(30))).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    assert!(matches!(
        store.claim(&req(&biz, "short", secs(30))).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    assert!(matches!(
        store.claim(&req(&biz, "new", secs(30))).await.unwrap(),
        ClaimOutcome::Replay { snapshot } if snapshot == b"N"
    ));
    let (third, how) = acquire(&*store, &req(&biz, "failed", secs(30))).await;
    assert_eq!((third.attempt, how), (3, Acquired::RetryAfterFailure));
    // The late holder of "stuck" was fenced out by the batch's takeover.
    assert!(matches!(
        store.complete(&biz, "stuck", &stuck, b"late", TTL).await,
        Err(IdemError::LeaseLost { .. })
    ));
    store
        .complete(&biz, "stuck", &taken, b"T", TTL)
        .await
        .unwrap();
    let rec = store.load(&biz, "stuck").await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.snapshot.as_deref()),
        (Status::Succeeded, Some(&b"T"[..]))
    );
}

/// New keys in one batch are all claimed; the same batch again finds them in progress, and once
/// they are marked, replays every result; a batch names each key once, holds at most `MAX_BATCH`,
/// and an empty one claims nothing.
pub async fn a_batch_of_new_keys_is_claimed_then_replayed(s: Subject) {
    let (store, biz) = (s.store, biz("batch_new"));
    let keys: Vec<String> = (0..40).map(|i| format!("k{i:02}")).collect();
    let asked: Vec<BatchItem<'_>> = keys
        .iter()
        .map(|k| BatchItem {
            key: k,
            fingerprint: Some("fp"),
        })
        .collect();
    let first = store.claim_batch(&batch(&biz, &asked)).await.unwrap();
    let claims: Vec<Claim> = first
        .iter()
        .map(|o| match o {
            ClaimOutcome::Acquired {
                claim,
                how: Acquired::Fresh,
            } if claim.attempt == 1 => *claim,
            other => panic!("expected a fresh claim, got {other:?}"),
        })
        .collect();
    let again = store.claim_batch(&batch(&biz, &asked)).await.unwrap();
    assert!(
        again
            .iter()
            .all(|o| matches!(o, ClaimOutcome::InProgress { .. })),
        "{again:?}"
    );
    for (key, claim) in keys.iter().zip(&claims) {
        store
            .complete(&biz, key, claim, key.as_bytes(), TTL)
            .await
            .unwrap();
    }
    let replays = store.claim_batch(&batch(&biz, &asked)).await.unwrap();
    for (key, outcome) in keys.iter().zip(&replays) {
        assert!(
            matches!(outcome, ClaimOutcome::Replay { snapshot } if snapshot == key.as_bytes()),
            "{key}: {outcome:?}"
        );
    }
    // Half new, half done: one batch, each decided.
    let mixed_keys: Vec<String> = (20..60).map(|i| format!("k{i:02}")).collect();
    let mixed: Vec<BatchItem<'_>> = mixed_keys
        .iter()
        .map(|k| BatchItem {
            key: k,
            fingerprint: Some("fp"),
        })
        .collect();
    let outcomes = store.claim_batch(&batch(&biz, &mixed)).await.unwrap();
    for (i, outcome) in outcomes.iter().enumerate() {
        match (i < 20, outcome) {
            (true, ClaimOutcome::Replay { .. }) | (false, ClaimOutcome::Acquired { .. }) => {}
            (_, other) => panic!("{}: {other:?}", mixed_keys[i]),
        }
    }

    let twice = items(&[("a", None), ("b", None), ("a", None)]);
    let refused = store.claim_batch(&batch(&biz, &twice)).await;
    assert!(
        matches!(&refused, Err(IdemError::InvalidOptions { reason }) if reason.contains("twice")),
        "{refused:?}"
    );
    assert!(
        store.load(&biz, "a").await.unwrap().is_none(),
        "nothing claimed"
    );
    let many: Vec<String> = (0..=MAX_BATCH).map(|i| format!("m{i}")).collect();
    let too_many: Vec<BatchItem<'_>> = many
        .iter()
        .map(|k| BatchItem {
            key: k,
            fingerprint: None,
        })
        .collect();
    assert!(matches!(
        store.claim_batch(&batch(&biz, &too_many)).await,
        Err(IdemError::InvalidOptions { .. })
    ));
    assert!(
        store.load(&biz, "m0").await.unwrap().is_none(),
        "nothing claimed"
    );
    assert!(
        store
            .claim_batch(&batch(&biz, &[]))
            .await
            .unwrap()
            .is_empty()
    );
}

/// Through `idem::batch::Batch`: a body that fails frees only its own key (the others are marked done),
/// a key repeated in the batch claims when it runs and replays the first's answer, and a call the
/// store refuses (a bad key) fails alone.
pub async fn a_batch_marks_each_key_on_its_own(s: Subject) {
    let (store, fx, biz) = (s.store, Effects::new().await, biz("batch_marks"));
    let keys = ["a", "b", "c", "a", ""];
    let claimed = Batch::new(keys.iter().map(|k| call(&biz, k)))
        .claim(&*store)
        .await;
    assert_eq!(claimed.len(), keys.len());
    assert!(claimed[0].runs_body() && claimed[1].runs_body());
    assert!(
        claimed[3].outcome().is_none() && claimed[3].runs_body(),
        "the repeat claims when it runs: {:?}",
        claimed[3].outcome()
    );
    let mut answers = Vec::new();
    for (claimed, key) in claimed.into_iter().zip(keys) {
        let (fx, biz) = (fx.clone(), biz.clone());
        let answer = claimed
            .run(async move {
                if key == "b" {
                    return Err(PayError::Declined);
                }
                pay(&fx, &biz, key, 1).await
            })
            .await;
        answers.push(answer);
    }
    let first_a = answers[0].as_ref().expect("a runs").clone();
    assert!(matches!(answers[1], Err(PayError::Declined)));
    assert!(answers[2].is_ok());
    assert_eq!(
        answers[3].as_ref().ok(),
        Some(&first_a),
        "the repeat, run after the first, replays its answer"
    );
    assert!(
        matches!(
            answers[4],
            Err(PayError::Idem(IdemError::InvalidKey { .. }))
        ),
        "{:?}",
        answers[4]
    );
    let b = store.load(&biz, "b").await.unwrap().unwrap();
    assert_eq!(b.status, Status::Failed);
    for key in ["a", "c"] {
        let rec = store.load(&biz, key).await.unwrap().unwrap();
        assert_eq!(rec.status, Status::Succeeded, "{key}");
    }
    // The next batch: a replays, b retries and runs.
    let claimed = Batch::new(["a", "b"].iter().map(|k| call(&biz, k)))
        .claim(&*store)
        .await;
    let mut next = Vec::new();
    for (claimed, key) in claimed.into_iter().zip(["a", "b"]) {
        next.push(claimed.run(pay(&fx, &biz, key, 1)).await.unwrap());
    }
    assert_eq!(next[0], first_a, "a replays its first answer");
    for (key, runs) in [("a", 1), ("b", 1), ("c", 1)] {
        assert_eq!(fx.count(&biz, key).await, runs, "{key}");
    }
    // A claim acquired and released is taken over at once.
    let claimed = Batch::new([call(&biz, "d")]).claim(&*store).await;
    let [d] = <[_; 1]>::try_from(claimed).unwrap();
    assert!(d.runs_body());
    d.release().await.unwrap();
    let rec = store.load(&biz, "d").await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Processing);
    call(&biz, "d")
        .run(&*store, pay(&fx, &biz, "d", 1))
        .await
        .unwrap();
    assert_eq!(fx.count(&biz, "d").await, 1);
}

/// `batches` batches of `size` calls released at once by a barrier, their keys drawn from a pool
/// of `size` keys so that each key is in several batches and some are twice in one; each batch
/// runs what it claimed, then claims again what was in progress, until every call has its answer.
/// Every key's business ran exactly once (the effects table), and every call got that answer.
pub async fn batches_run_each_key_once_under_a_barrier(s: Subject) {
    let (batches, size) = (8usize, 24usize);
    let (store, fx, biz) = (s.store, Effects::new().await, biz("batch_storm"));
    let barrier = Arc::new(Barrier::new(batches));
    let mut tasks = Vec::new();
    for b in 0..batches {
        let (store, fx, biz, barrier) = (store.clone(), fx.clone(), biz.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            // Batch b takes keys b, b+1, … (wrapping), and repeats its first key at its end.
            let mut keys: Vec<usize> = (0..size).map(|i| (b * 5 + i) % size).collect();
            keys.push(keys[0]);
            let mut answers: Vec<Option<Receipt>> = vec![None; keys.len()];
            barrier.wait().await;
            for _round in 0..400 {
                let pending: Vec<usize> =
                    (0..keys.len()).filter(|&i| answers[i].is_none()).collect();
                if pending.is_empty() {
                    return (keys, answers);
                }
                let claimed = Batch::new(
                    pending
                        .iter()
                        .map(|&i| call(&biz, &format!("order-{}", keys[i])).fingerprint(&keys[i])),
                )
                .claim(&*store)
                .await;
                for (claimed, &i) in claimed.into_iter().zip(&pending) {
                    let key = format!("order-{}", keys[i]);
                    match claimed.run(pay(&fx, &biz, &key, keys[i] as u64)).await {
                        Ok(receipt) => answers[i] = Some(receipt),
                        Err(PayError::Idem(IdemError::InProgress { .. })) => {}
                        Err(e) => panic!("{key}: {e:?}"),
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            panic!("batch {b}: calls still in progress after 400 rounds");
        }));
    }
    let mut first: Vec<Option<Receipt>> = vec![None; size];
    for task in tasks {
        let (keys, answers) = task.await.unwrap();
        for (k, answer) in keys.into_iter().zip(answers) {
            let answer = answer.expect("every call answered");
            match &first[k] {
                None => first[k] = Some(answer),
                Some(seen) => {
                    assert_eq!(seen, &answer, "order-{k}: every call gets the first answer")
                }
            }
        }
    }
    assert_eq!(
        fx.totals(&biz).await,
        (size as i64, size as i64),
        "each key's business ran exactly once"
    );
}

/// `Store::complete_batch`: each mark under its own fence, in one batch; a record another attempt
/// took over is `LeaseLost` and the others are marked all the same; marking again succeeds; a
/// result ttl is kept per mark.
pub async fn a_batch_of_marks_marks_each_under_its_own_fence(s: Subject) {
    use idem::store::BatchMark;
    let (store, clock, biz) = (s.store, s.clock, biz("batch_marks_fence"));
    let (lost, _) = acquire(&*store, &req(&biz, "lost", secs(2))).await;
    clock.advance(secs(5));
    let (taken, how) = acquire(&*store, &req(&biz, "lost", secs(30))).await;
    assert_eq!(how, Acquired::TakeOver);
    let mut claims = Vec::new();
    for key in ["a", "b", "c"] {
        claims.push(acquire(&*store, &req(&biz, key, secs(30))).await.0);
    }
    let mark = |key, claim, snapshot, result_ttl| BatchMark {
        key,
        claim,
        snapshot,
        result_ttl,
    };
    let marks = [
        mark("a", claims[0], &b"A"[..], None),
        mark("lost", lost, &b"late"[..], None),
        mark("b", claims[1], &b"B"[..], Some(secs(60))),
        mark("c", claims[2], &b""[..], None),
    ];
    let answers = store.complete_batch(&biz, &marks, TTL).await.unwrap();
    assert_eq!(answers.len(), 4);
    assert!(
        answers[0].is_ok() && answers[2].is_ok() && answers[3].is_ok(),
        "{answers:?}"
    );
    assert!(
        matches!(answers[1], Err(IdemError::LeaseLost { attempt: 1 })),
        "{:?}",
        answers[1]
    );
    for (key, snapshot) in [("a", &b"A"[..]), ("b", b"B"), ("c", b"")] {
        let rec = store.load(&biz, key).await.unwrap().unwrap();
        assert_eq!(
            (rec.status, rec.snapshot.as_deref()),
            (Status::Succeeded, Some(snapshot)),
            "{key}"
        );
        assert_eq!(rec.result_until_ms.is_some(), key == "b", "{key}: {rec:?}");
    }
    let rec = store.load(&biz, "lost").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.fence), (Status::Processing, taken.fence));
    // Sent again (a reply lost): each counts as held and changes nothing.
    let again = store.complete_batch(&biz, &marks[..1], TTL).await.unwrap();
    assert!(again[0].is_ok());
    assert!(matches!(
        store.claim(&req(&biz, "a", secs(30))).await.unwrap(),
        ClaimOutcome::Replay { snapshot } if snapshot == b"A"
    ));
    let twice = [marks[0], marks[0]];
    assert!(matches!(
        store.complete_batch(&biz, &twice, TTL).await,
        Err(IdemError::InvalidOptions { .. })
    ));
    assert!(
        store
            .complete_batch(&biz, &[], TTL)
            .await
            .unwrap()
            .is_empty()
    );
}
