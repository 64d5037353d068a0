use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

#[idempotent(biz = "PAY", key = "(req.user_id, req.order_no)", store = "sqlite")]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = (tenant, (req.order_no, req.user_id)), store = "sqlite")]
async fn pay_for_tenant(tenant: &str, req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt {
        id: req.user_id + tenant.len() as u64,
    })
}

fn main() {
    let req = PayReq {
        order_no: "A-1".into(),
        user_id: 7,
    };
    drop(pay(&req));
    drop(pay_for_tenant("acme", &req));
}
