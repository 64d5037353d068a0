use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

use std::sync::{Arc, LazyLock};

static STORE: LazyLock<idem::MemoryStore> = LazyLock::new(idem::MemoryStore::new);

#[idempotent(biz = "PAY", key = "req.order_no", store = *STORE)]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = "req.order_no", store = store)]
async fn pay_with(store: &Arc<dyn idem::Store>, req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let req = PayReq {
        order_no: "A-1".into(),
        user_id: 7,
    };
    assert_eq!(pay(&req).await.unwrap(), Receipt { id: 7 });
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    assert_eq!(pay_with(&store, &req).await.unwrap(), Receipt { id: 7 });
}
