// The fn `recover` calls must exist, be async, return `Result<Option<T>, _>` with the fn's own
// `T`, and have an error the fn's error converts from.
use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

fn find_now(order_no: &str) -> Result<Option<Receipt>, PayError> {
    let _ = order_no;
    Ok(None)
}

async fn find_other(order_no: &str) -> Result<Option<String>, PayError> {
    Ok(Some(order_no.to_owned()))
}

async fn find_plain(order_no: &str) -> Result<Receipt, PayError> {
    let _ = order_no;
    Ok(Receipt { id: 1 })
}

pub struct GatewayDown;

async fn find_elsewhere(order_no: &str) -> Result<Option<Receipt>, GatewayDown> {
    let _ = order_no;
    Err(GatewayDown)
}

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", recover = "find_paymnt(&req.order_no)")]
async fn missing(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", recover = "find_now(&req.order_no)")]
async fn not_async(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", recover = "find_other(&req.order_no)")]
async fn other_type(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", recover = "find_plain(&req.order_no)")]
async fn no_option(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(
    biz = "PAY",
    key = "req.order_no",
    store = "sqlite",
    recover = "find_elsewhere(&req.order_no)"
)]
async fn other_error(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

fn main() {}
