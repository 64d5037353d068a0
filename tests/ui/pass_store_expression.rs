use idem::{IdemError, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize)]
pub struct PayReq {
    pub order_no: String,
    pub user_id: u64,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub id: u64,
}

#[derive(Debug)]
pub struct PayError(pub IdemError);

impl From<IdemError> for PayError {
    fn from(error: IdemError) -> Self {
        PayError(error)
    }
}

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
