use idem::{IdemError, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize)]
pub struct PayReq {
    pub order_no: String,
    pub user_id: u64,
}

#[derive(Serialize, Deserialize)]
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

#[idempotent(biz = "PAY ORDER", key = "req.order_no", store = "sqlite")]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(
    biz = "PAY_FOR_AN_ORDER_PLACED_FROM_THE_MOBILE_APP",
    key = "req.order_no",
    store = "sqlite"
)]
async fn pay_mobile(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "", key = "req.order_no", store = "sqlite")]
async fn pay_nameless(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

fn main() {}
