// `recover` calls a fn with what identifies the action: not a bare name, not with `.await`, not
// without a parameter, not in a transaction.
use idem::{SqliteTx, idempotent};

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

async fn find_payment(order_no: &str) -> Result<Option<Receipt>, PayError> {
    let _ = order_no;
    Ok(None)
}

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", recover = "find_payment")]
async fn bare_name(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(
    biz = "PAY",
    key = "req.order_no",
    store = "sqlite",
    recover = "find_payment(&req.order_no).await"
)]
async fn awaited(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", recover = "find_payment(\"x\")")]
async fn no_parameter(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(
    biz = "PAY",
    key = "req.order_no",
    store = "sqlite",
    recover = "find_payment(&rq.order_no)"
)]
async fn unknown_parameter(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx", recover = "find_payment(&req.order_no)")]
async fn in_tx(tx: &mut SqliteTx, req: &PayReq) -> Result<Receipt, PayError> {
    let _ = tx;
    Ok(Receipt { id: req.user_id })
}

fn main() {}
