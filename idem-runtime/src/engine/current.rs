//! The claim a running body holds, for bodies that pass their fence on (the fencing-token pattern).

use std::future::Future;

use crate::store::Claim;

tokio::task_local! {
    static CURRENT: Claim;
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
/// # async fn demo(store: &idem_runtime::MemoryStore) -> Result<(), idem_runtime::IdemError> {
/// use idem_runtime::{Call, current_claim};
///
/// let receipt: Result<u64, idem_runtime::IdemError> = Call::new("SHIP", "order-7")
///     .run(store, async {
///         let claim = current_claim().expect("inside an idempotent body");
///         // e.g. UPDATE shipments SET …, fence = $fence WHERE order_no = $1 AND fence < $fence
///         Ok(claim.fence.get())
///     })
///     .await;
/// # receipt.map(|_| ()) }
/// ```
pub fn current_claim() -> Option<Claim> {
    CURRENT.try_with(|claim| *claim).ok()
}

/// Runs `body` as the holder of `claim`.
pub(crate) async fn scope<F: Future>(claim: Claim, body: F) -> F::Output {
    CURRENT.scope(claim, body).await
}
