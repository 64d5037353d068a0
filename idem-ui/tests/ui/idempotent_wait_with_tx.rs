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

#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx", on_in_progress = "wait(5s)")]
async fn pay(tx: &mut SqliteTx, req: &PayReq) -> Result<Receipt, PayError> {
    let _ = (tx, req);
    Ok(Receipt)
}

fn main() {}
