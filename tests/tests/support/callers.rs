//! What the scale-out tests share (`galera.rs`, `redis_cluster_failover.rs`): callers released
//! together that call keys until each call is answered, trying again where the answer says so,
//! and the checks on what they got, counted in the independent effects table
//! (`contract::Effects`). Include it after `mod contract;`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem::IdemError;
use tokio::sync::Barrier;

use crate::contract::Effects;

/// What the callers saw, for the report.
#[derive(Default)]
pub struct Seen {
    /// Calls answered (each with the first execution's receipt).
    pub answered: AtomicU64,
    /// Answers that said "try again" (in progress past the wait, busy, unavailable) before a
    /// call was answered.
    pub retried: AtomicU64,
    /// The longest call, its tries included (ms).
    pub longest_ms: AtomicU64,
}

impl Seen {
    /// "N retried answers, longest call M ms".
    pub fn report(&self) -> String {
        format!(
            "{} retried answers, longest call {} ms",
            self.retried.load(Ordering::Relaxed),
            self.longest_ms.load(Ordering::Relaxed)
        )
    }
}

/// Calls `attempt(tries so far)` until it answers, trying again (after 50 ms) on an answer that
/// says so, for at most 90 s; the receipt. Any other error fails the test.
pub async fn answered<F, Fut>(seen: &Seen, key: &str, mut attempt: F) -> String
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<String, IdemError>>,
{
    let start = Instant::now();
    let mut tries = 0;
    loop {
        match attempt(tries).await {
            Ok(receipt) => {
                seen.answered.fetch_add(1, Ordering::Relaxed);
                seen.longest_ms
                    .fetch_max(start.elapsed().as_millis() as u64, Ordering::Relaxed);
                return receipt;
            }
            Err(e) if e.is_retryable() => {
                seen.retried.fetch_add(1, Ordering::Relaxed);
                assert!(
                    start.elapsed() < Duration::from_secs(90),
                    "{key}: no answer within 90 s, last {e:?}"
                );
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{key}: {e:?}"),
        }
    }
}

/// Spawns `n` callers, each waiting at `barrier` (which has room for one more: the test's own
/// wait releases them), then running `calls(caller)`: the keys it called and what each answered.
pub fn spawn_callers<F, Fut>(
    n: usize,
    barrier: &Arc<Barrier>,
    calls: F,
) -> Vec<tokio::task::JoinHandle<Vec<(String, String)>>>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Vec<(String, String)>> + Send + 'static,
{
    (0..n)
        .map(|caller| {
            let (barrier, calls) = (barrier.clone(), calls(caller));
            tokio::spawn(async move {
                barrier.wait().await;
                calls.await
            })
        })
        .collect()
}

/// Every caller's answers, once they are all done.
pub async fn all_answers(
    tasks: Vec<tokio::task::JoinHandle<Vec<(String, String)>>>,
) -> Vec<(String, String)> {
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(task.await.unwrap());
    }
    answers
}

/// The keys of `biz` that ran more than once (each must have run at least once), after checking
/// that every caller of a key got the same answer, the first execution's.
pub async fn ran_again(
    fx: &Effects,
    biz: &str,
    keys: &[String],
    answers: &[(String, String)],
) -> Vec<String> {
    let mut first: HashMap<&str, &str> = HashMap::new();
    for (key, receipt) in answers {
        let seen = first.entry(key).or_insert(receipt);
        assert_eq!(
            *seen,
            receipt.as_str(),
            "{key}: every caller gets the first answer"
        );
    }
    let mut again = Vec::new();
    for key in keys {
        let runs = fx.count(biz, key).await;
        assert!(runs >= 1, "{key} never ran");
        if runs > 1 {
            again.push(key.clone());
        }
    }
    again
}
