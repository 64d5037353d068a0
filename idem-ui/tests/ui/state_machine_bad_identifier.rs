use idem::StateMachine;

#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(table = "orders; DROP TABLE orders", key = "order-no", status = "status")]
pub enum OrderStatus {
    #[state(to(Paid))]
    WaitPay,
    #[state(terminal)]
    Paid,
}

fn main() {}
