// The order machine the `#[state_transition]` UI tests share: `include!("support/orders.rs");`
// (each test is a crate of its own; including the text keeps the machine in the test's own module,
// next to the transitions, as most users declare it).

#[derive(Debug, Clone, Copy, PartialEq, Eq, idem::StateMachine)]
#[state_machine(table = "orders", key = "order_no", status = "status")]
pub enum OrderStatus {
    #[state(to(Paid, Closed))]
    WaitPay,
    #[state(to(Refunding))]
    Paid,
    #[state(name = "REFUND_PENDING", to(Refunded))]
    Refunding,
    #[state(terminal)]
    Refunded,
    #[state(terminal)]
    Closed,
}
