use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

use idem::sqlx::{Sqlite, Transaction};

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", tx = "txn")]
async fn pay(tx: &mut Transaction<'_, Sqlite>, req: &PayReq) -> Result<Receipt, PayError> {
    let _ = tx;
    Ok(Receipt { id: req.user_id })
}

fn main() {}
