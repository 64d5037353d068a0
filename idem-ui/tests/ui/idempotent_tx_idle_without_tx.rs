use idem::idempotent;

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

// A lease-mode call holds no transaction: its lease bounds a silent holder.
#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", tx_idle = "5s")]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    let _ = req;
    Ok(Receipt)
}

fn main() {}
