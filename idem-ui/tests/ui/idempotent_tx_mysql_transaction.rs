// A MySQL sqlx transaction or connection does not carry the store either: refused, and the fix
// names the MySQL transaction (`idem::MySqlTx`), not only SQLite's.
use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx")]
async fn pay(
    tx: &mut idem::sqlx::Transaction<'_, idem::sqlx::MySql>,
    req: &PayReq,
) -> Result<Receipt, PayError> {
    let _ = tx;
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = "req.order_no", tx = "conn")]
async fn pay_on_connection(
    conn: &mut idem::sqlx::MySqlConnection,
    req: &PayReq,
) -> Result<Receipt, PayError> {
    let _ = conn;
    Ok(Receipt { id: req.user_id })
}

fn main() {}
