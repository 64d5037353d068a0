// DynamoDB cannot wrap a body in a transaction idem joins (a DynamoDB transaction is one request of
// at most 100 writes, not a session the body's own writes run in): a `tx` naming the store is
// refused at the option, and the message says to drop `tx`, as for Redis.
use idem::{DynamoStore, idempotent};

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

#[idempotent(biz = "PAY", key = "req.order_no", tx = "store")]
async fn pay(store: &mut DynamoStore, req: &PayReq) -> Result<Receipt, PayError> {
    let _ = store;
    Ok(Receipt { id: req.user_id })
}

fn main() {}
