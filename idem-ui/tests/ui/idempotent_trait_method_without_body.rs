use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

pub trait Payments {
    #[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite")]
    async fn pay(&self, req: &PayReq) -> Result<Receipt, PayError>;
}

fn main() {}
