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

// The attribute is wrong, but `pay` is still emitted as written: `main` compiles against it and
// the only error is the attribute's.
#[idempotent(biz = "PAY", key = "req.order_no", stor = "sqlite")]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

fn main() {
    let req = PayReq {
        order_no: "A-1".into(),
        user_id: 7,
    };
    let pending = pay(&req);
    drop(pending);
}
