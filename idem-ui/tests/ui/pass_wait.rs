use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

#[idempotent(
    biz = "PAY",
    key = "req.order_no",
    store = "sqlite",
    on_in_progress = "wait(5s)"
)]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(
    biz = "PAY",
    key = "req.order_no",
    store = "sqlite",
    ttl = "1d",
    lease = "500ms",
    on_in_progress = "reject"
)]
async fn pay_rejecting(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

// A slow body keeps its claim: the lease is renewed every 10 s while it runs.
#[idempotent(biz = "REPORT", key = "req.order_no", store = "sqlite", lease = "30s", heartbeat = "10s")]
async fn build_report(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

fn main() {
    let req = PayReq {
        order_no: "A-1".into(),
        user_id: 7,
    };
    drop(pay(&req));
    drop(pay_rejecting(&req));
    drop(build_report(&req));
}
