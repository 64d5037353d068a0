// A two-state order machine (`WAIT_PAY` → `PAID`) for `#[state_transition]` UI tests:
// `include!("support/orders_minimal.rs");` (as text, like `orders.rs`).

#[derive(Debug, Clone, Copy, PartialEq, Eq, idem::StateMachine)]
#[state_machine(table = "orders", key = "order_no")]
pub enum OrderStatus {
    #[state(to(Paid))]
    WaitPay,
    #[state(terminal)]
    Paid,
}
