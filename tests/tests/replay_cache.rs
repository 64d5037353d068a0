//! `CachedStore` in front of a real server (MariaDB, `IDEM_MYSQL_URL`): a storm of duplicates runs
//! each key's business once (counted in an independent table), the repeats of a key this process
//! marked cost the server no statement (its own `Questions` counter), and a repeat in another
//! process (a store without the cache) still gets the stored answer.

#[path = "contract/server.rs"]
mod server;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use idem::cache::{CachedStore, ReplayCache};
use idem::{Call, IdemError, MySqlStore};
use tokio::sync::Barrier;

async fn questions(pool: &idem::sqlx::MySqlPool) -> u64 {
    let (_, n): (String, String) = idem::sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
        .fetch_one(pool)
        .await
        .unwrap();
    n.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_repeats_cost_no_statement_and_run_nothing_again() {
    let url = server::mysql_url();
    let Some(store) = server::reach("MariaDB", &url, MySqlStore::connect(&url)).await else {
        return;
    };
    let table = server::unique("idemt_cache");
    let store = store.with_table(&table).unwrap();
    store.migrate().await.unwrap();
    let plain = store.clone();
    let cached = Arc::new(CachedStore::new(store, ReplayCache::new(1 << 20).unwrap()));
    let effects: Arc<Vec<AtomicU32>> = Arc::new((0..8).map(|_| AtomicU32::new(0)).collect());

    // 8 keys, 64 callers released at once: each key's business runs once.
    let barrier = Arc::new(Barrier::new(64));
    let tasks: Vec<_> = (0..64u32)
        .map(|i| {
            let (cached, effects, barrier) = (cached.clone(), effects.clone(), barrier.clone());
            tokio::spawn(async move {
                let k = (i % 8) as usize;
                barrier.wait().await;
                loop {
                    let done: Result<usize, IdemError> = Call::new("CACHE", &format!("k-{k}"))
                        .run(&*cached, async {
                            effects[k].fetch_add(1, Ordering::SeqCst);
                            Ok(k * 10)
                        })
                        .await;
                    match done {
                        Ok(v) => return assert_eq!(v, k * 10),
                        Err(IdemError::InProgress { .. }) => {
                            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let runs: Vec<u32> = effects.iter().map(|e| e.load(Ordering::SeqCst)).collect();
    assert_eq!(runs, vec![1; 8], "each key's business ran once");

    // Repeats of keys this process marked: answered from memory, no statement reaches the server.
    let probe = idem::sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap();
    let hits = cached.hits();
    let before = questions(&probe).await;
    for k in 0..8 {
        for _ in 0..25 {
            let v: Result<usize, IdemError> = Call::new("CACHE", &format!("k-{k}"))
                .run(&*cached, async { Ok(999) })
                .await;
            assert_eq!(v.unwrap(), k * 10);
        }
    }
    let spent = questions(&probe).await - before;
    assert_eq!(cached.hits() - hits, 200, "every repeat was a hit");
    // The probe's own two readings, and what another session may send meanwhile.
    assert!(spent <= 10, "200 cached repeats sent {spent} statements");

    // Another process (no cache) replays what the store holds.
    let v: Result<usize, IdemError> = Call::new("CACHE", "k-3")
        .run(&plain, async { Ok(999) })
        .await;
    assert_eq!(v.unwrap(), 30);
    assert_eq!(effects[3].load(Ordering::SeqCst), 1);

    idem::sqlx::query(idem::sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(&probe)
        .await
        .unwrap();
}
