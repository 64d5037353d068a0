//! The one-time token contract: every token backend runs these cases (`token_suite!`).
//!
//! The winner of a race records its business in an independent SQLite table (`Effects`), so
//! "consumed once" is proven by what the business did, not by what the store says.

use std::sync::Arc;
use std::time::Duration;

use idem::{IdemError, TestClock, TokenStore};
use tokio::sync::Barrier;

use super::{Effects, biz};

/// A token backend under test, on the clock the test drives.
pub struct Tokens {
    pub tokens: Arc<dyn TokenStore>,
    pub clock: TestClock,
}

const TTL: Duration = Duration::from_secs(60);

fn is_used(r: &Result<(), IdemError>) -> bool {
    matches!(r, Err(IdemError::TokenUsed))
}

fn invalid_because(r: &Result<(), IdemError>, why: &str) -> bool {
    matches!(r, Err(IdemError::TokenInvalid { reason }) if reason.contains(why))
}

/// `n` consumers of `token` released at once; the winners record their business in `fx`.
/// Returns (winners, refused as used).
async fn race(t: &Tokens, token: &str, n: usize, fx: &Effects, biz: &str) -> (usize, usize) {
    let barrier = Arc::new(Barrier::new(n));
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let (tokens, barrier, token) = (t.tokens.clone(), barrier.clone(), token.to_owned());
        let (fx, biz) = (fx.clone(), biz.to_owned());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let r = tokens.consume(&token, None).await;
            if r.is_ok() {
                fx.record(&biz, &format!("consumer-{i}")).await;
            }
            r
        }));
    }
    let (mut won, mut used) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(()) => won += 1,
            r if is_used(&r) => used += 1,
            Err(e) => panic!("a consumer got {e:?}"),
        }
    }
    (won, used)
}

pub async fn an_issued_token_is_consumed_once(t: Tokens) {
    let token = t.tokens.issue(TTL, None).await.unwrap();
    assert_eq!(token.len(), 48);
    t.tokens.consume(&token, None).await.unwrap();
    assert!(is_used(&t.tokens.consume(&token, None).await));
    assert_ne!(
        token,
        t.tokens.issue(TTL, None).await.unwrap(),
        "tokens repeat"
    );
}

pub async fn of_a_thousand_concurrent_consumers_one_wins(t: Tokens) {
    let (fx, biz) = (Effects::new().await, biz("tok_race"));
    let token = t.tokens.issue(TTL, None).await.unwrap();
    let (won, used) = race(&t, &token, 1000, &fx, &biz).await;
    assert_eq!((won, used), (1, 999));
    assert_eq!(fx.totals(&biz).await, (1, 1), "the business ran once");
}

pub async fn a_restored_token_is_consumed_exactly_once_more(t: Tokens) {
    let (fx, biz) = (Effects::new().await, biz("tok_restore"));
    let token = t.tokens.issue(TTL, None).await.unwrap();
    t.tokens.consume(&token, None).await.unwrap();
    t.tokens.restore(&token, None).await.unwrap();
    let (won, used) = race(&t, &token, 200, &fx, &biz).await;
    assert_eq!((won, used), (1, 199));
    assert_eq!(fx.totals(&biz).await.1, 1);

    // Two restores racing for one spent token: one puts it back, the other finds nothing to do.
    let (a, b) = tokio::join!(
        t.tokens.restore(&token, None),
        t.tokens.restore(&token, None)
    );
    assert_eq!(
        [&a, &b].iter().filter(|r| r.is_ok()).count(),
        1,
        "{a:?} {b:?}"
    );
    assert!(invalid_because(
        if a.is_ok() { &b } else { &a },
        "not spent"
    ));
    t.tokens.consume(&token, None).await.unwrap();
    assert!(is_used(&t.tokens.consume(&token, None).await));
}

pub async fn restoring_an_unspent_token_is_refused(t: Tokens) {
    let token = t.tokens.issue(TTL, None).await.unwrap();
    assert!(invalid_because(
        &t.tokens.restore(&token, None).await,
        "not spent"
    ));
    t.tokens.consume(&token, None).await.unwrap();
}

pub async fn unknown_malformed_and_oversized_tokens_are_invalid(t: Tokens) {
    let issued = t.tokens.issue(TTL, None).await.unwrap();
    let unknown: String = issued.chars().rev().collect();
    assert!(invalid_because(
        &t.tokens.consume(&unknown, None).await,
        "unknown"
    ));
    assert!(invalid_because(
        &t.tokens.restore(&unknown, None).await,
        "unknown"
    ));
    for bad in [
        "",
        "not a token",
        &issued[..40],
        &issued.to_uppercase(),
        "../../etc/passwd",
    ] {
        assert!(
            invalid_because(&t.tokens.consume(bad, None).await, "malformed"),
            "{bad:?}"
        );
    }
    let oversized = "a".repeat(10_000);
    assert!(invalid_because(
        &t.tokens.consume(&oversized, None).await,
        "longer"
    ));
    // None of that touched the real one.
    t.tokens.consume(&issued, None).await.unwrap();
}

pub async fn another_subjects_token_is_invalid_and_stays_usable(t: Tokens) {
    let token = t.tokens.issue(TTL, Some("user-1")).await.unwrap();
    assert!(invalid_because(
        &t.tokens.consume(&token, Some("user-2")).await,
        "another subject"
    ));
    assert!(invalid_because(
        &t.tokens.consume(&token, None).await,
        "another subject"
    ));
    t.tokens.consume(&token, Some("user-1")).await.unwrap();
    assert!(invalid_because(
        &t.tokens.restore(&token, Some("user-2")).await,
        "another subject"
    ));
    assert!(is_used(&t.tokens.consume(&token, Some("user-1")).await));
    t.tokens.restore(&token, Some("user-1")).await.unwrap();
    t.tokens.consume(&token, Some("user-1")).await.unwrap();
}

pub async fn bad_subjects_are_refused_at_issue(t: Tokens) {
    for bad in [
        "u".repeat(idem::tokens::MAX_SUBJECT_LEN + 1),
        "a\0b".to_owned(),
    ] {
        let r = t.tokens.issue(TTL, Some(&bad)).await;
        assert!(matches!(r, Err(IdemError::TokenInvalid { .. })), "{r:?}");
    }
    let long = "é".repeat(idem::tokens::MAX_SUBJECT_LEN / 2);
    let token = t.tokens.issue(TTL, Some(&long)).await.unwrap();
    t.tokens.consume(&token, Some(&long)).await.unwrap();
}

pub async fn a_token_expires_whether_spent_or_not(t: Tokens) {
    let fresh = t.tokens.issue(TTL, None).await.unwrap();
    let spent = t.tokens.issue(TTL, None).await.unwrap();
    t.tokens.consume(&spent, None).await.unwrap();
    t.clock.advance(Duration::from_secs(59));
    assert!(
        is_used(&t.tokens.consume(&spent, None).await),
        "spent stays used until it expires"
    );
    t.clock.advance(Duration::from_secs(2));
    let r = t.tokens.consume(&fresh, None).await;
    assert!(
        invalid_because(&r, "expired") || invalid_because(&r, "unknown"),
        "{r:?}"
    );
    let r = t.tokens.restore(&spent, None).await;
    assert!(
        invalid_because(&r, "expired") || invalid_because(&r, "unknown"),
        "{r:?}"
    );
    t.tokens.sweep_expired(1000).await.unwrap();
    let r = t.tokens.consume(&fresh, None).await;
    assert!(
        invalid_because(&r, "expired") || invalid_because(&r, "unknown"),
        "a sweep never revives a token: {r:?}"
    );
}

/// A token's ttl at its limits: under 1 ms and over `idem::MAX_DURATION` refused before anything
/// is issued; 1 ms and the maximum itself issue a token that is spent once (no overflow, no wrap:
/// `Duration::MAX` once panicked in the memory store and wrapped on the others).
pub async fn token_ttls_at_the_limits(t: Tokens) {
    let max = idem::MAX_DURATION;
    for ttl in [
        Duration::ZERO,
        Duration::from_nanos(1),
        max + Duration::from_nanos(1),
        Duration::MAX,
    ] {
        let r = t.tokens.issue(ttl, None).await;
        assert!(
            matches!(r, Err(IdemError::InvalidOptions { .. })),
            "ttl {ttl:?}: {r:?}"
        );
    }
    for ttl in [Duration::from_millis(1), Duration::from_secs(60), max] {
        let token = t.tokens.issue(ttl, None).await.unwrap();
        if ttl > Duration::from_millis(1) {
            t.tokens.consume(&token, None).await.unwrap();
            assert!(
                is_used(&t.tokens.consume(&token, None).await),
                "ttl {ttl:?}"
            );
        }
    }
    // A token issued for the maximum outlives a year on the test clock and a sweep.
    let token = t.tokens.issue(max, None).await.unwrap();
    t.clock.advance(Duration::from_secs(366 * 24 * 3600));
    t.tokens.sweep_expired(100).await.unwrap();
    t.tokens.consume(&token, None).await.unwrap();
}

#[macro_export]
macro_rules! token_suite {
    ($make:path) => {
        $crate::token_suite!(@cases $make;
            an_issued_token_is_consumed_once,
            of_a_thousand_concurrent_consumers_one_wins,
            a_restored_token_is_consumed_exactly_once_more,
            restoring_an_unspent_token_is_refused,
            unknown_malformed_and_oversized_tokens_are_invalid,
            another_subjects_token_is_invalid_and_stays_usable,
            bad_subjects_are_refused_at_issue,
            a_token_expires_whether_spent_or_not,
            token_ttls_at_the_limits,
        );
    };
    (@cases $make:path; $($case:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            let clock = idem::TestClock::new();
            if let Some(tokens) = $make(clock.clone()).await {
                contract::tokens::$case(contract::tokens::Tokens { tokens, clock }).await;
            }
        }
    )*};
}
