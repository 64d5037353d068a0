//! Every attribute of idem used with the facade renamed to `foo` in Cargo.toml and no
//! `crate = "…"`: that this compiles is the proof, and the tests run the generated code.

use foo::{IdemError, StateMachine, Transition, consume_token, idempotent, state_transition};
use serde::{Deserialize, Serialize};

/// What the payment returns and idem stores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The order paid.
    pub order_no: String,
}

/// Pays once per order number; a repeat replays the receipt.
#[idempotent(biz = "PAY", key = "order_no", store = "memory")]
pub async fn pay(order_no: &str) -> Result<Receipt, IdemError> {
    Ok(Receipt {
        order_no: order_no.to_owned(),
    })
}

/// Spends a one-time token before it runs.
#[consume_token(token = "token", store = "tokens")]
pub async fn submit(token: &str) -> Result<u32, IdemError> {
    Ok(1)
}

/// An order's states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(table = "orders", key = "order_no")]
pub enum OrderStatus {
    /// Waiting for the payment.
    #[state(to(Paid))]
    WaitPay,
    /// Paid.
    #[state(terminal)]
    Paid,
}

/// Moves an order from `WAIT_PAY` to `PAID`, once.
#[state_transition(machine = OrderStatus, from = "WAIT_PAY", to = "PAID", store = "sqlite")]
pub async fn mark_paid(order_no: &str) -> Result<Transition<(), OrderStatus>, IdemError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn the_generated_code_runs_under_the_other_name() {
        foo::register_store("memory", Arc::new(foo::MemoryStore::new()));
        let first = pay("A-1").await.unwrap();
        let again = pay("A-1").await.unwrap();
        assert_eq!(first, again);
        assert_eq!(
            foo::metrics::counts_for("PAY").get(foo::metrics::Outcome::Replayed),
            1
        );

        foo::register_tokens("tokens", foo::MemoryTokens::new());
        let tokens = foo::tokens("tokens").unwrap();
        let token = tokens.issue(Duration::from_secs(60), None).await.unwrap();
        assert_eq!(submit(&token).await.unwrap(), 1);
        assert!(matches!(submit(&token).await, Err(IdemError::TokenUsed)));
    }
}
