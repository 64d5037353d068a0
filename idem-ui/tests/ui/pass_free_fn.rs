use idem::{IdemError, idempotent};

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

use std::sync::atomic::{AtomicU64, Ordering};

static RUNS: AtomicU64 = AtomicU64::new(0);

/// Doc comments and other attributes are kept.
#[idempotent(biz = "PAY", key = "req.order_no", store = "ui_memory")]
#[inline(never)]
pub async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    if req.user_id == 0 {
        // `return` and `?` in the body keep working.
        return Err(PayError(IdemError::PayloadMismatch));
    }
    let id: u64 = "41"
        .parse::<u64>()
        .map_err(|_| PayError(IdemError::PayloadMismatch))?;
    Ok(Receipt { id: id + 1 })
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    idem::register_store("ui_memory", idem::MemoryStore::new());
    let req = PayReq {
        order_no: "A-1".into(),
        user_id: 7,
    };
    let first = pay(&req).await.unwrap();
    let repeat = pay(&req).await.unwrap();
    assert_eq!(first, Receipt { id: 42 });
    assert_eq!(repeat, first, "a repeat replays the first result");
    assert_eq!(RUNS.load(Ordering::SeqCst), 1, "the body ran once");
}
