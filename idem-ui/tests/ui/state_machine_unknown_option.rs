// The derive's options are read by the parser every idem macro shares: an unknown option gets
// "did you mean" and the list, a flag given a value and a missing comma are named at their token.
use idem::StateMachine;

#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(tabel = "orders", key = "order_no")]
pub enum OrderStatus {
    #[state(to(Paid), nme = "WAITING")]
    WaitPay,
    #[state(terminal = true)]
    Paid,
    #[state(name = "CLOSED" terminal)]
    Closed,
}

fn main() {}
