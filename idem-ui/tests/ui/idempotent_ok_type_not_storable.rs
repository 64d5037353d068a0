use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

pub struct Ticket {
    pub id: u64,
}

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite")]
async fn pay(req: &PayReq) -> Result<Ticket, PayError> {
    Ok(Ticket { id: req.user_id })
}

fn main() {}
