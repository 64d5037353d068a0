//! Graceful drain: waiting, at shutdown, for the handlers the layer runs on tasks of their own.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use super::service::BoxFuture;

/// How many handler tasks of a layer are running.
#[derive(Debug, Default)]
pub(crate) struct Inflight {
    running: AtomicUsize,
    idle: Notify,
}

/// Held by one handler task; its drop (the task finished, panicked or was cancelled) counts it out.
pub(crate) struct Running(Arc<Inflight>);

impl Inflight {
    pub(crate) fn start(self: &Arc<Self>) -> Running {
        self.running.fetch_add(1, Ordering::SeqCst);
        Running(Arc::clone(self))
    }

    /// Runs a layer's `work` on a task of its own, counted while it runs: a client that goes away
    /// (a gateway or a deadline gave up) does not cancel the handler, so its response is stored
    /// and the retry replays it. A panic in it is resumed in the caller; a task the runtime
    /// dropped at shutdown answers `shutting_down()`.
    pub(crate) fn on_own_task<T: Send + 'static>(
        self: &Arc<Self>,
        work: impl Future<Output = T> + Send + 'static,
        shutting_down: fn() -> T,
    ) -> BoxFuture<T> {
        let running = self.start();
        let task = tokio::spawn(async move {
            let _running = running;
            work.await
        });
        Box::pin(async move {
            match task.await {
                Ok(answer) => answer,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => shutting_down(),
            }
        })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Waits for the handlers an [`IdempotencyLayer`](crate::http::IdempotencyLayer) is running, so a deploy
/// does not end the process between a handler's effect and the mark that records it.
///
/// The layer runs each handler on a task of its own (a client that goes away does not cancel
/// it), so a server's graceful shutdown, which waits for its connections, may return while
/// handlers still run. Wait for them after it:
///
/// ```ignore
/// // (axum's `serve` needs its `tokio` feature, which a service has and this crate does not.)
/// let drain = layer.drain();
/// axum::serve(listener, app.layer(layer))
///     .with_graceful_shutdown(async { let _ = tokio::signal::ctrl_c().await; })
///     .await?;
/// if let Err(left) = drain.wait(std::time::Duration::from_secs(30)).await {
///     tracing::warn!(left, "handlers still running at shutdown; their leases will expire");
/// }
/// ```
#[derive(Debug, Clone)]
pub struct Drain(pub(crate) Arc<Inflight>);

impl Drain {
    /// How many handlers are running now.
    pub fn running(&self) -> usize {
        self.0.running.load(Ordering::SeqCst)
    }

    /// Waits until no handler runs, or `deadline` (0 ..= [`crate::MAX_DURATION`], clamped)
    /// has passed.
    ///
    /// # Errors
    /// The number of handlers still running at the deadline.
    pub async fn wait(&self, deadline: Duration) -> Result<(), usize> {
        let until = tokio::time::Instant::now() + deadline.min(crate::MAX_DURATION);
        loop {
            let idle = self.0.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.running() == 0 {
                return Ok(());
            }
            if tokio::time::timeout_at(until, idle).await.is_err() {
                return match self.running() {
                    0 => Ok(()),
                    left => Err(left),
                };
            }
        }
    }
}
