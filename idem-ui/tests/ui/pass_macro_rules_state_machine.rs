// A machine and its transitions declared through `macro_rules!` wrappers: every option value arrives
// as a fragment (`literal`, `expr`, `ident`, `path`, `ty`) and means what it means written by hand.
use idem::{IdemError, StateMachine, Transition, state_transition};

macro_rules! machine {
    ($name:ident, $table:literal, $key:literal, $first:ident => $second:ident) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
        #[state_machine(table = $table, key = $key, version = "version")]
        pub enum $name {
            #[state(to($second))]
            $first,
            #[state(terminal, name = "DONE")]
            $second,
        }
    };
}

machine!(OrderStatus, "orders", "order_no", WaitPay => Paid);

macro_rules! transition {
    (
        $name:ident, $machine:path, $ty:ty, $from:literal, $to:literal, $key:expr,
        $column:ident = $value:expr, $version:expr, $store:literal
    ) => {
        #[state_transition(
            machine = $machine,
            from = [$from],
            to = $to,
            key = $key,
            set($column = $value),
            version = $version,
            store = $store,
        )]
        pub async fn $name(req: &(String, String), seen: i64) -> Result<Transition<(), $ty>, IdemError> {
            Ok(())
        }
    };
}

// Expressions in strings: the caller's bare `req` could not reach the wrapper's parameter
// (`macro_rules!` hygiene), a string is read at the attribute.
transition!(pay, OrderStatus, OrderStatus, "WAIT_PAY", "DONE", "req.0", trade_no = "req.1", "seen", "sqlite");

// The machine from the return type written as a `ty` fragment, a key parameter, a transaction.
macro_rules! short {
    ($name:ident, $ty:ty, $tx:ident, $from:literal, $to:literal) => {
        #[state_transition(from = $from, to = $to, tx = $tx)]
        pub async fn $name(
            $tx: &mut idem::sqlx::Transaction<'_, idem::sqlx::Sqlite>,
            order_no: &str,
        ) -> Result<Transition<u8, $ty>, IdemError> {
            Ok(1)
        }
    };
}

short!(pay_short, OrderStatus, conn, "WAIT_PAY", "DONE");

fn main() {
    let _ = (pay, pay_short);
    let _ = <OrderStatus as StateMachine>::TABLE;
}
