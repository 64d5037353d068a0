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

pub struct User {
    pub id: u64,
}

#[idempotent(biz = "PAY", key = "reqq.order_no", store = "sqlite")]
async fn pay(req: &PayReq, user: &User) -> Result<Receipt, PayError> {
    Ok(Receipt {
        id: req.user_id + user.id,
    })
}

#[idempotent(biz = "PAY", key = (usr.id, req.order_no), store = "sqlite")]
async fn pay_bare(req: &PayReq, user: &User) -> Result<Receipt, PayError> {
    Ok(Receipt {
        id: req.user_id + user.id,
    })
}

fn main() {}
