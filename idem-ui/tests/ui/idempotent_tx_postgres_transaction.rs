// A Postgres sqlx transaction or connection does not carry the store: refused, and the fix names
// `idem::PgTx`.
use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx")]
async fn pay(
    tx: &mut idem::sqlx::Transaction<'_, idem::sqlx::Postgres>,
    req: &PayReq,
) -> Result<Receipt, PayError> {
    let _ = tx;
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = "req.order_no", tx = "conn")]
async fn pay_on_connection(
    conn: &mut idem::sqlx::PgConnection,
    req: &PayReq,
) -> Result<Receipt, PayError> {
    let _ = conn;
    Ok(Receipt { id: req.user_id })
}

fn main() {}
