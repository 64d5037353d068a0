//! The store's clock, as tests see it: every store reads its own clock (the database's `NOW()`,
//! Redis `TIME`, the memory store's monotonic clock) plus the offset of a [`TestClock`].

// Without `test-util` no store is handed a test clock: the offset is always zero.
#![cfg_attr(not(any(test, feature = "test-util")), allow(dead_code))]

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// Moves a store's clock forward, so tests drive lease and TTL edges without sleeping (feature
/// `test-util`, for tests: production code has no use for it, as with tokio's).
///
/// A store given a test clock (`MemoryStore::with_test_clock`, `SqliteStore::with_test_clock`,
/// and every other backend's) reads its own clock plus this clock's offset, in every decision:
/// claim, takeover, expiry, sweep. [`TestClock::advance`] moves the offset; clones share it, so a
/// test keeps one clone and hands another to the store. The store's real clock keeps running
/// underneath, so keep the steps a test takes far apart (advance past a 10 s lease by 11 s, not by
/// 1 ms).
///
/// ```
/// # use idem_runtime as idem;
/// # #[cfg(feature = "test-util")]
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// use std::time::Duration;
/// use idem::{Call, MemoryStore, TestClock};
///
/// let clock = TestClock::new();
/// let store = MemoryStore::new().with_test_clock(clock.clone());
/// let first: Result<u8, idem::IdemError> =
///     Call::new("PAY", "order-1").ttl(Duration::from_secs(60)).run(&store, async { Ok(1) }).await;
/// clock.advance(Duration::from_secs(61)); // the record's TTL has passed: the next call runs again
/// # let _ = first; Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct TestClock(Arc<AtomicI64>);

impl TestClock {
    /// A clock at offset zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the store's clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    /// How far the clock has been moved in all.
    pub fn offset(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.offset_ms()).unwrap_or(0))
    }

    /// The offset in milliseconds, added to the store's own clock.
    pub(crate) fn offset_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A store's handle on its optional test clock: zero offset in production.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClockOffset(Option<TestClock>);

impl ClockOffset {
    pub(crate) fn new(clock: TestClock) -> Self {
        ClockOffset(Some(clock))
    }

    /// Milliseconds to add to the store's own clock.
    pub(crate) fn ms(&self) -> i64 {
        self.0.as_ref().map_or(0, TestClock::offset_ms)
    }
}
