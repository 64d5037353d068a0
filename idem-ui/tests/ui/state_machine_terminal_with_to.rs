use idem::StateMachine;

#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(table = "orders", key = "order_no")]
pub enum OrderStatus {
    #[state(to(Refunded))]
    Paid,
    #[state(terminal, to(Paid))]
    Refunded,
}

fn main() {}
