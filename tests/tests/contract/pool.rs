//! What a server store owes the pool it shares with the application: the connections it keeps
//! warm between its own statements go back to the pool, so the application's queries on the same
//! pool are never kept waiting for them (idem-runtime's `sql/warm.rs`).

use idem::{Call, IdemError, Store};

/// `store` runs on `pool`, a pool of two connections whose acquire timeout is a few seconds.
/// Calls in turn reuse one connection, which the store keeps (checked out of the pool); then the
/// application takes both of the pool's connections at once, which it can only
/// do once the store gave the warm one back; then the store's next call still runs.
pub async fn warm_connections_go_back_to_the_pool<DB: idem::sqlx::Database>(
    pool: &idem::sqlx::Pool<DB>,
    store: &dyn Store,
) {
    assert_eq!(pool.options().get_max_connections(), 2);
    let biz = super::biz("warm");
    for i in 0..10u32 {
        let done: Result<u32, IdemError> = Call::new(biz.clone(), &i)
            .run(store, async move { Ok(i) })
            .await;
        assert_eq!(done.unwrap(), i);
    }
    assert_eq!(
        pool.size() as usize - pool.num_idle(),
        1,
        "ten calls in turn reused one connection, and the store keeps it (checked out, warm)"
    );
    // The pool's acquire timeout ends a wait for a connection the store never gives back.
    let first = pool.acquire().await.expect("the pool's second connection");
    let second = pool
        .acquire()
        .await
        .expect("the warm connection, given back to the pool");
    drop((first, second));
    let done: Result<u32, IdemError> = Call::new(biz, "after").run(store, async { Ok(7) }).await;
    assert_eq!(done.unwrap(), 7);
}
