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

#[idempotent(
    biz = "PAY",
    key = "req.order_no",
    store = "sqlite",
    on_in_progress = "wait(5s)"
)]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(
    biz = "PAY",
    key = "req.order_no",
    store = "sqlite",
    ttl = "1d",
    lease = "500ms",
    on_in_progress = "reject"
)]
async fn pay_rejecting(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

fn main() {
    let req = PayReq {
        order_no: "A-1".into(),
        user_id: 7,
    };
    drop(pay(&req));
    drop(pay_rejecting(&req));
}
