// `#[state_transition]` takes its machine from the fn's return type, `Transition<T, Machine>`, and
// checks the transition through the macro the derive puts next to the enum under the enum's name:
// wherever the enum can be named, the transition works. `machine = …` still overrides.
use idem::sqlx::{Sqlite, Transaction};
use idem::{IdemError, StateMachine, Transition, state_transition};

// Two machines in one module: each transition names its own in its return type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(table = "orders", key = "order_no")]
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

#[state_transition(from = "WAIT_PAY", to = "PAID")]
pub async fn pay(
    tx: &mut Transaction<'_, Sqlite>,
    order_no: &str,
) -> Result<Transition<(), OrderStatus>, IdemError> {
    Ok(())
}

#[state_transition(from = "PENDING", to = "DONE")]
pub async fn refund(
    tx: &mut Transaction<'_, Sqlite>,
    refund_no: &str,
) -> Result<Transition<(), RefundStatus>, IdemError> {
    Ok(())
}

// A machine declared in another module, imported with `use`.
mod tickets {
    use idem::StateMachine;

    #[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
    #[state_machine(table = "tickets", key = "ticket_no")]
    pub enum TicketStatus {
        #[state(to(Closed))]
        Open,
        #[state(terminal)]
        Closed,
    }
}

mod support_desk {
    use super::tickets::TicketStatus;
    use idem::sqlx::{Sqlite, Transaction};
    use idem::{IdemError, Transition, state_transition};

    #[state_transition(from = "OPEN", to = "CLOSED")]
    pub async fn close(
        tx: &mut Transaction<'_, Sqlite>,
        ticket_no: &str,
    ) -> Result<Transition<(), TicketStatus>, IdemError> {
        Ok(())
    }

    // Named by path instead of imported.
    #[state_transition(from = "OPEN", to = "CLOSED", store = "sqlite")]
    pub async fn close_alone(
        ticket_no: &str,
    ) -> Result<Transition<(), crate::tickets::TicketStatus>, IdemError> {
        Ok(())
    }
}

// A machine in a private module, re-exported elsewhere with `pub use`, and used through the
// re-export.
mod deep {
    pub mod machines {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, idem::StateMachine)]
        #[state_machine(table = "parcels", key = "parcel_no")]
        pub enum ParcelStatus {
            #[state(to(Shipped))]
            Packed,
            #[state(terminal)]
            Shipped,
        }
    }
}
pub use deep::machines::ParcelStatus;

mod shipping {
    use idem::{IdemError, Transition, state_transition};

    #[state_transition(from = "PACKED", to = "SHIPPED", store = "sqlite")]
    pub async fn ship(parcel_no: &str) -> Result<Transition<(), crate::ParcelStatus>, IdemError> {
        Ok(())
    }
}

// A transition above the machine it uses, and `machine = …` naming it explicitly.
#[state_transition(machine = LaterStatus, from = "A", to = "B", store = "sqlite")]
pub async fn later(later_no: &str) -> Result<Transition<(), LaterStatus>, IdemError> {
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(table = "laters", key = "later_no")]
pub enum LaterStatus {
    #[state(to(B))]
    A,
    #[state(terminal)]
    B,
}

fn main() {
    // A machine declared inside a fn body, with its transition beside it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
    #[state_machine(table = "jobs", key = "job_no")]
    enum JobStatus {
        #[state(to(Done))]
        Queued,
        #[state(terminal)]
        Done,
    }

    #[state_transition(from = "QUEUED", to = "DONE", store = "sqlite")]
    async fn finish(job_no: &str) -> Result<Transition<(), JobStatus>, IdemError> {
        Ok(())
    }

    let _ = (pay, refund, later, finish);
    let _ = (support_desk::close, support_desk::close_alone, shipping::ship);
}
