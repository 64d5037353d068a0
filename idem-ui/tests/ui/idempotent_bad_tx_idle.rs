use idem::idempotent;
use idem::SqliteTx;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Receipt;

pub struct PayReq {
    pub order_no: String,
}

#[derive(Debug)]
pub struct PayError;

impl From<idem::IdemError> for PayError {
    fn from(_: idem::IdemError) -> Self {
        PayError
    }
}

// `tx_idle` bounds how long the call's transaction may sit idle while it holds the claim: a
// duration of at least 1 ms and at most 24 days (Postgres takes about 24.8 at most), or "off".
#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx", tx_idle = "0s")]
async fn pay(tx: &mut SqliteTx, req: &PayReq) -> Result<Receipt, PayError> {
    let _ = (tx, req);
    Ok(Receipt)
}

#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx", tx_idle = "25d")]
async fn pay_later(tx: &mut SqliteTx, req: &PayReq) -> Result<Receipt, PayError> {
    let _ = (tx, req);
    Ok(Receipt)
}

#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx", tx_idle = "never")]
async fn pay_never(tx: &mut SqliteTx, req: &PayReq) -> Result<Receipt, PayError> {
    let _ = (tx, req);
    Ok(Receipt)
}

fn main() {}
