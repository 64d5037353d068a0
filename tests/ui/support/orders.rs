// The order machine the `#[state_transition]` UI tests share: `include!("support/orders.rs");`.
// Included as text, not as a `mod`: the derive puts the `__IdemMachine` alias that a transition
// without `machine = …` resolves into the module of the enum, and a glob import of another module
// does not carry it, so the enum must be declared in the test's own module.

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
