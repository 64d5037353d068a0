// Handlers declared through a `macro_rules!` wrapper: every option value arrives as a fragment
// (`literal`, `expr`, `ident`, `path`), wrapped in the invisible group `macro_rules!` puts around it,
// and means what the same value written by hand means.
use idem::{IdemError, idempotent};

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

macro_rules! handler {
    ($name:ident, $biz:literal, $store:literal, $key:expr, $ttl:literal, $krate:path) => {
        #[idempotent(biz = $biz, key = $key, store = $store, ttl = $ttl, crate = $krate)]
        async fn $name(req: &PayReq) -> Result<Receipt, PayError> {
            Ok(Receipt { id: req.user_id })
        }
    };
}

// A literal `biz` and `store` (a registered store's name, not an expression), and a key in a
// string: `$key:expr` = `"req.order_no"` is the expression `req.order_no`.
handler!(pay, "PAY", "memory", "req.order_no", "1d", ::idem);

// A bare key names the parameter the caller named: `macro_rules!` hygiene keeps a parameter the
// wrapper wrote out of reach of the caller's tokens.
macro_rules! handler_bare_key {
    ($name:ident, $req:ident, $key:expr, $lease:literal, $wait:literal) => {
        #[idempotent(biz = "REFUND", key = $key, store = "sqlite", lease = $lease, on_in_progress = $wait)]
        async fn $name($req: &PayReq) -> Result<Receipt, PayError> {
            Ok(Receipt { id: $req.user_id })
        }
    };
}

handler_bare_key!(refund, req, (req.user_id, req.order_no), "10s", "wait(5s)");

// The result and error types as `ty` fragments.
macro_rules! typed {
    ($name:ident, $ok:ty, $err:ty) => {
        #[idempotent(biz = "TYPED", key = "req.order_no", store = "memory")]
        async fn $name(req: &PayReq) -> Result<$ok, $err> {
            Ok(Receipt { id: req.user_id })
        }
    };
}

typed!(pay_typed, Receipt, PayError);

macro_rules! in_tx {
    ($name:ident, $tx:ident, $fingerprint:expr) => {
        #[idempotent(biz = "TX", key = "req.order_no", tx = $tx, fingerprint = $fingerprint)]
        async fn $name(
            $tx: &mut idem::SqliteTx,
            req: &PayReq,
        ) -> Result<Receipt, PayError> {
            Ok(Receipt { id: req.user_id })
        }
    };
}

in_tx!(pay_in_tx, conn, "req");

fn main() {
    let _ = (pay, refund, pay_in_tx, pay_typed);
    let _: fn(IdemError) -> PayError = PayError::from;
}
