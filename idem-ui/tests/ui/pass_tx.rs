use idem::{IdemError, SqliteTx, idempotent};
use serde::{Deserialize, Serialize};

pub struct PayReq {
    pub order_no: String,
    pub amount: i64,
}

#[derive(Serialize, Deserialize)]
pub struct Receipt {
    pub id: i64,
}

#[derive(Debug)]
pub enum PayError {
    Idem(IdemError),
    Db(idem::sqlx::Error),
}

impl From<IdemError> for PayError {
    fn from(error: IdemError) -> Self {
        PayError::Idem(error)
    }
}

impl From<idem::sqlx::Error> for PayError {
    fn from(error: idem::sqlx::Error) -> Self {
        PayError::Db(error)
    }
}

// Claim, business write and mark in the caller's transaction, which carries its store (no `store`).
#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx")]
pub async fn pay(tx: &mut SqliteTx, req: &PayReq) -> Result<Receipt, PayError> {
    let done = idem::sqlx::query("INSERT INTO payments (order_no, amount) VALUES (?, ?)")
        .bind(&req.order_no)
        .bind(req.amount)
        .execute(&mut **tx)
        .await?;
    Ok(Receipt {
        id: done.last_insert_rowid(),
    })
}

// `tx` may be any parameter, here with a heartbeat-free lease call beside it.
#[idempotent(biz = "PAY", key = "req.order_no", tx = "conn")]
pub async fn pay_on(req: &PayReq, conn: &mut SqliteTx) -> Result<Receipt, PayError> {
    let done = idem::sqlx::query("INSERT INTO payments (order_no, amount) VALUES (?, ?)")
        .bind(&req.order_no)
        .bind(req.amount)
        .execute(&mut **conn)
        .await?;
    Ok(Receipt {
        id: done.last_insert_rowid(),
    })
}

// The transaction's idle bound, given (the lease by default) or off.
#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx", tx_idle = "5s")]
pub async fn pay_bounded(tx: &mut SqliteTx, req: &PayReq) -> Result<Receipt, PayError> {
    let _ = req;
    let _ = tx;
    Ok(Receipt { id: 1 })
}

#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx", tx_idle = "off")]
pub async fn pay_unbounded(tx: &mut SqliteTx, req: &PayReq) -> Result<Receipt, PayError> {
    let _ = req;
    let _ = tx;
    Ok(Receipt { id: 1 })
}

fn main() {}
