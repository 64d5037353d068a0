//! The claim a running body holds, for bodies that pass their fence on (the fencing-token pattern),
//! and the call it belongs to, for its recovery points (steps.rs).

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

use super::step_log::Steps;
use crate::store::Claim;

tokio::task_local! {
    static CURRENT: Current;
}

/// What a running body's task knows of its call.
#[derive(Clone)]
pub(crate) struct Current {
    pub(crate) claim: Claim,
    pub(crate) call: Arc<CallScope>,
}

/// The call a body runs for: its record's identity, and in lease mode the log of its steps,
/// shared with the holder that saves them.
pub(crate) struct CallScope {
    pub(crate) biz: Cow<'static, str>,
    pub(crate) key: String,
    /// `None` in transaction mode: a step's result would be saved in the transaction a crash
    /// rolls back, so steps run as plain code there.
    pub(crate) steps: Option<Steps>,
}

impl CallScope {
    pub(crate) fn new(biz: Cow<'static, str>, key: String, steps: Option<Steps>) -> Self {
        CallScope { biz, key, steps }
    }
}

/// The running body's call, if this task runs one.
pub(crate) fn current() -> Option<Current> {
    CURRENT.try_with(Clone::clone).ok()
}

/// The claim held by the idempotent call whose body is running on this task: its attempt and its
/// fencing token. `None` outside a body (and in a task the body spawned: spawned tasks do not
/// inherit it; pass the value along).
///
/// A body that writes to another system can pass the fence with its write; that system keeps the
/// highest fence it has seen per key and refuses writes that carry a smaller one. Then a body that
/// stalled past its lease (a GC pause, a frozen VM) and wakes up after another attempt took over
/// cannot overwrite the newer attempt's work there either:
///
/// ```
/// # use idem_runtime as idem;
/// # async fn demo(store: &idem_runtime::MemoryStore) -> Result<(), idem_runtime::IdemError> {
/// use idem::{Call, steps::current_claim};
///
/// let receipt: Result<u64, idem::IdemError> = Call::new("SHIP", "order-7")
///     .run(store, async {
///         let claim = current_claim().expect("inside an idempotent body");
///         // e.g. UPDATE shipments SET …, fence = $fence WHERE order_no = $1 AND fence < $fence
///         Ok(claim.fence.get())
///     })
///     .await;
/// # receipt.map(|_| ()) }
/// ```
pub fn current_claim() -> Option<Claim> {
    CURRENT.try_with(|current| current.claim).ok()
}

/// Runs `body` as the holder of `claim` for `call`.
pub(crate) async fn scope<F: Future>(claim: Claim, call: Arc<CallScope>, body: F) -> F::Output {
    CURRENT.scope(Current { claim, call }, body).await
}
