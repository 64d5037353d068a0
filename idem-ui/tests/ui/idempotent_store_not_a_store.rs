use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

pub struct Config {
    pub store_url: String,
}

#[idempotent(biz = "PAY", key = "req.order_no", store = config.store_url)]
async fn pay(config: &Config, req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

fn main() {}
