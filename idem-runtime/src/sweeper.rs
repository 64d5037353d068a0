//! Deleting expired records in small batches.

use std::sync::Arc;
use std::time::Duration;

use crate::{IdemError, IntoSharedStore, Store, TokenStore};

/// Sweeps expired records from a store: one pass deletes batches of at most `batch` rows until a
/// batch comes back short, so no statement holds locks for long. A record is expired when its TTL
/// has passed and no lease is live: a claim in progress is never swept.
///
/// ```no_run
/// # use idem_runtime as idem;
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// let store = idem::SqliteStore::open("idem.db").await?;
/// let sweeper = idem::Sweeper::new(store.clone(), 500);
/// let _task = sweeper.spawn(std::time::Duration::from_secs(60))?;
/// # Ok(()) }
/// ```
///
/// [`Sweeper::with_tokens`] sweeps expired one-time tokens in the same passes.
#[derive(Clone)]
pub struct Sweeper {
    store: Arc<dyn Store>,
    tokens: Option<Arc<dyn TokenStore>>,
    batch: usize,
}

impl Sweeper {
    /// A sweeper of `store` (what [`crate::register_store`] takes: a store, an `Arc` of one, or an
    /// `Arc<dyn Store>`), deleting `batch` rows per statement (500 is a good start).
    pub fn new(store: impl IntoSharedStore, batch: usize) -> Self {
        Sweeper {
            store: store.into_shared(),
            tokens: None,
            batch: batch.max(1),
        }
    }

    /// The same sweeper, also deleting expired tokens of `tokens` (a spent token is kept until it
    /// expires, so a second submit is told "used"; after that it is only garbage).
    pub fn with_tokens(mut self, tokens: impl TokenStore) -> Self {
        self.tokens = Some(Arc::new(tokens));
        self
    }

    /// One full pass; returns the number of records (and tokens) deleted.
    ///
    /// # Errors
    /// The store's error; records deleted before it stay deleted.
    pub async fn sweep_once(&self) -> Result<u64, IdemError> {
        let mut total = 0;
        loop {
            let n = self.store.sweep_expired(self.batch).await?;
            crate::metrics::swept(self.store.backend(), "records", n);
            total += n;
            if n < self.batch as u64 {
                break;
            }
            tokio::task::yield_now().await;
        }
        if let Some(tokens) = &self.tokens {
            loop {
                let n = tokens.sweep_expired(self.batch).await?;
                crate::metrics::swept(tokens.backend(), "tokens", n);
                total += n;
                if n < self.batch as u64 {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        Ok(total)
    }

    /// Spawns a task that sweeps every `every` (1 ms ..= [`crate::MAX_DURATION`]) until the
    /// handle is aborted.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a period outside that range (a zero period would sweep
    /// in a busy loop); nothing is spawned.
    pub fn spawn(self, every: Duration) -> Result<tokio::task::JoinHandle<()>, IdemError> {
        crate::duration::check(
            "the sweeper's period",
            every,
            Duration::from_millis(1),
            "shorter than 1 ms: the sweeper would spin",
        )?;
        Ok(tokio::spawn(async move {
            loop {
                if let Err(e) = self.sweep_once().await {
                    tracing::warn!(error = %e, "sweeping expired idempotency records failed");
                }
                tokio::time::sleep(every).await;
            }
        }))
    }
}
