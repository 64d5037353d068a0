//! `Store::list_keys`, on every store that walks its records (a store that cannot answers
//! `NotSupported`, and the case ends there): every record listed, in pages of at most the batch,
//! whatever its status and whatever its key holds (`:`, braces, letters of other scripts, the
//! empty key); nothing of another store, table or prefix (each case's store is its own, so every
//! pair listed is one the case wrote); a cursor handed back in a fresh walk goes on from where it
//! was; batches and cursors a store never takes are refused.

use std::collections::HashSet;

use idem::{
    IdemError, Store,
    store::{KeyPage, MAX_BATCH},
};

use super::{Subject, TTL, acquire, biz, req, secs};

/// The most pages a walk may take before the case calls it endless.
const MAX_PAGES: usize = 10_000;

/// Walks from `after` to the end in pages of `batch`, checking each page: at most `batch` pairs,
/// none twice (a pair may come again on a later page of a store that walks with SCAN).
async fn walk(store: &dyn Store, after: Option<String>, batch: usize) -> Vec<KeyPage> {
    let mut pages = Vec::new();
    let mut after = after;
    for _ in 0..MAX_PAGES {
        let page = store.list_keys(after.as_deref(), batch).await.unwrap();
        assert!(
            page.keys.len() <= batch,
            "a page of {} keys for a batch of {batch}",
            page.keys.len()
        );
        let distinct: HashSet<&(String, String)> = page.keys.iter().collect();
        assert_eq!(distinct.len(), page.keys.len(), "a pair twice in one page");
        after = page.next.clone();
        pages.push(page);
        if after.is_none() {
            return pages;
        }
    }
    panic!("the walk did not end after {MAX_PAGES} pages of {batch}");
}

/// Every pair of `pages`.
fn pairs<'p>(pages: impl IntoIterator<Item = &'p KeyPage>) -> Vec<(String, String)> {
    pages
        .into_iter()
        .flat_map(|p| p.keys.iter().cloned())
        .collect()
}

/// The pairs of a walk, each once, after checking that every one is a pair the case wrote.
fn only_written(
    listed: Vec<(String, String)>,
    written: &HashSet<(String, String)>,
    what: &str,
) -> HashSet<(String, String)> {
    let listed: HashSet<(String, String)> = listed.into_iter().collect();
    let foreign: Vec<_> = listed.difference(written).take(5).collect();
    assert!(
        foreign.is_empty(),
        "{what}: pairs no record of this store has: {foreign:?}"
    );
    listed
}

/// The key of record `i`: plain digits, or with `:`, braces (Redis hashes what a record key has
/// between its first `{` and the `}` after it), letters of other scripts.
fn key(i: usize) -> String {
    match i % 6 {
        0 => format!("k:{i}"),
        1 => format!("{{{i}}}"),
        2 => format!("}}{{{i}:"),
        3 => format!("ключ-{i}"),
        4 => format!("键:{{{i}}}é"),
        _ => i.to_string(),
    }
}

/// 250 records over three business types (one a prefix of another, one not ASCII), a third each
/// finished, failed and in progress, and the empty key where the store takes it; walked in pages
/// of 7 and of 1000, and resumed from a cursor in a fresh walk.
pub async fn list_keys_walks_every_record_in_pages_and_resumes(s: Subject) {
    let store = s.store;
    match store.list_keys(None, 7).await {
        Err(IdemError::NotSupported { .. }) => return,
        first => assert_eq!(first.unwrap().keys, [], "a new store lists nothing"),
    }
    let base = biz("keys");
    let bizes = [base.clone(), format!("{base}:x"), format!("{base}é")];
    let mut written = HashSet::new();
    for i in 0..250 {
        let (b, k) = (&bizes[i % 3], key(i));
        let (claim, _) = acquire(&*store, &req(b, &k, secs(30))).await;
        match i % 7 % 3 {
            0 => store
                .complete(b, &k, &claim, b"{\"Ok\":1}", TTL)
                .await
                .unwrap(),
            1 => store.fail(b, &k, &claim).await.unwrap(),
            _ => {}
        }
        written.insert((b.clone(), k));
    }
    if let Ok(idem::store::ClaimOutcome::Acquired { .. }) =
        store.claim(&req(&bizes[0], "", secs(30))).await
    {
        written.insert((bizes[0].clone(), String::new()));
    }

    let pages = walk(&*store, None, 7).await;
    assert!(pages.len() > 250 / 7, "{} pages of 7", pages.len());
    let listed = only_written(pairs(&pages), &written, "batch 7");
    assert_eq!(listed, written, "batch 7");
    let large = walk(&*store, None, 1000).await;
    let listed = only_written(pairs(&large), &written, "batch 1000");
    assert_eq!(listed, written, "batch 1000");

    // The cursor after the third page, handed back later in a fresh walk (with another batch): it
    // goes on from there, and does not start over.
    let before = only_written(pairs(&pages[..3]), &written, "the first three pages");
    let third = pages[2].next.clone().expect("more than three pages");
    let resumed = walk(&*store, Some(third), 50).await;
    let resumed = only_written(pairs(&resumed), &written, "the resumed walk");
    assert_eq!(
        &before | &resumed,
        written,
        "the first three pages and the walk resumed after them"
    );
    assert!(
        !before.is_empty() && !before.is_subset(&resumed),
        "the resumed walk goes on after the third page, it does not start over"
    );

    for batch in [0, MAX_BATCH + 1] {
        let refused = store.list_keys(None, batch).await;
        assert!(
            matches!(&refused, Err(IdemError::InvalidOptions { reason }) if reason.contains("list_keys")),
            "batch {batch}: {refused:?}"
        );
    }
    for cursor in ["", "not a cursor", "99999:x"] {
        let refused = store.list_keys(Some(cursor), 7).await;
        assert!(
            matches!(&refused, Err(IdemError::InvalidOptions { reason }) if reason.contains("cursor")),
            "cursor {cursor:?}: {refused:?}"
        );
    }
}
