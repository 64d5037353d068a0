// A transition wrapper with a mistake in what its caller passed: the machine's error (checked by the
// machine's own macro, two macros away) still points at the caller's token.
use idem::{IdemError, Transition, state_transition};

include!("support/orders.rs");

macro_rules! transition {
    ($name:ident, $from:literal, $to:literal) => {
        #[state_transition(from = $from, to = $to, store = "sqlite")]
        pub async fn $name(order_no: &str) -> Result<Transition<(), OrderStatus>, IdemError> {
            Ok(())
        }
    };
}

transition!(pay, "WAIT_PAY", "PAYED");
transition!(refund_unpaid, "WAIT_PAY", "REFUNDED");

fn main() {}
