extern crate idem as renamed;

use renamed::{IdemError, idempotent};
use serde::{Deserialize, Serialize};

pub struct PayReq {
    pub order_no: String,
}

#[derive(Serialize, Deserialize)]
pub struct Receipt {
    pub id: u64,
}

pub struct PayError(pub IdemError);

impl From<IdemError> for PayError {
    fn from(error: IdemError) -> Self {
        PayError(error)
    }
}

mod inner {
    use super::*;

    // Generated code names `renamed::__private`, never `::idem`.
    #[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", crate = "renamed")]
    pub async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
        Ok(Receipt {
            id: req.order_no.len() as u64,
        })
    }

    #[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", crate = ::renamed)]
    pub async fn pay_bare_path(req: &PayReq) -> Result<Receipt, PayError> {
        Ok(Receipt {
            id: req.order_no.len() as u64,
        })
    }
}

fn main() {
    let req = PayReq {
        order_no: "A-1".into(),
    };
    drop(inner::pay(&req));
    drop(inner::pay_bare_path(&req));
}
