use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

impl PayReq {
    pub async fn order_no(&self) -> String {
        self.order_no.clone()
    }
}

#[idempotent(biz = "PAY", key = req.order_no().await, store = "sqlite")]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

fn main() {}
