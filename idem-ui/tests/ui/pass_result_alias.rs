// A return type that is an alias of `Result` under another name: the type checker finds its `Ok`
// and `Err` types.
use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

pub type ShopResult<T> = Result<T, PayError>;

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite")]
async fn pay(req: &PayReq) -> ShopResult<Receipt> {
    Ok(Receipt { id: req.user_id })
}

mod shop {
    pub type Outcome<T, E> = ::core::result::Result<T, E>;
}

#[idempotent(biz = "REFUND", key = "req.order_no", store = "sqlite")]
async fn refund(req: &PayReq) -> shop::Outcome<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

// In tx mode too.
#[idempotent(biz = "PAY_TX", key = "req.order_no", tx = "tx")]
async fn pay_in_tx(
    tx: &mut idem::SqliteTx,
    req: &PayReq,
) -> ShopResult<Receipt> {
    let _ = tx;
    Ok(Receipt { id: req.user_id })
}

fn main() {
    let _ = pay;
    let _ = refund;
    let _ = pay_in_tx;
}
