use idem::{IdemError, idempotent};

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

#[idempotent(
    biz = "PAY",
    key = "req.order_no",
    store = "ui_fp",
    fingerprint = "req"
)]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = req.order_no, store = "ui_fp", fingerprint = (req.order_no, amount))]
async fn pay_amount(req: &PayReq, amount: u64) -> Result<Receipt, PayError> {
    Ok(Receipt {
        id: req.user_id + amount,
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    idem::register_store("ui_fp", idem::MemoryStore::new());
    let req = PayReq {
        order_no: "A-1".into(),
        user_id: 7,
    };
    pay(&req).await.unwrap();
    let other = PayReq {
        order_no: "A-1".into(),
        user_id: 8,
    };
    let refused = pay(&other).await.unwrap_err();
    assert!(
        matches!(refused.0, IdemError::PayloadMismatch),
        "{refused:?}"
    );
    drop(pay_amount(&req, 1));
}
