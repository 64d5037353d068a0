// Every option, `store = "…"` mode, and `machine = …` naming the machine explicitly (by path, also
// from another module) compile.
use idem::{IdemError, StateMachine, Transition, state_transition};

#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(table = "shop.orders", key = "order_no", version = "version")]
pub enum OrderStatus {
    #[state(to(Paid))]
    WaitPay,
    #[state(terminal)]
    Paid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(table = "refunds", key = "refund_no")]
pub enum RefundStatus {
    #[state(to(Done))]
    Pending,
    #[state(terminal)]
    Done,
}

mod elsewhere {
    use idem::{IdemError, Transition, state_transition};

    #[state_transition(machine = super::RefundStatus, from = "PENDING", to = "DONE", store = "sqlite")]
    pub async fn finish(refund_no: &str) -> Result<Transition<u8, super::RefundStatus>, IdemError> {
        Ok(1)
    }
}

#[state_transition(
    machine = OrderStatus,
    from = ["WAIT_PAY"],
    to = "PAID",
    store = "sqlite",
    key = "req.0",
    set(trade_no = "req.1", amount = req.2),
    now = "paid_at",
    match(trade_no),
    version = "seen",
)]
pub async fn pay(req: &(String, String, i64), seen: i64) -> Result<Transition<String, OrderStatus>, IdemError> {
    Ok(req.0.clone())
}

fn main() {
    let _ = pay;
    let _ = elsewhere::finish;
}
