//! State transitions: stateful business (orders, refunds) made idempotent by the transition itself.
//!
//! `UPDATE t SET status = 'PAID' WHERE key = ? AND status = 'WAIT_PAY'` changes one row the first time
//! and none on a repeat: the row's state is the idempotency record. A machine is declared once with
//! `#[derive(idem::StateMachine)]`; `#[state_transition(from = "WAIT_PAY", to = "PAID")]` generates the
//! conditional update and tells the caller what happened with a [`Transition`].

use std::fmt;

mod run;
mod sql;
mod sqlx_impls;

// Where a transition runs is the statement surface every SQL store's transaction offers
// (`sql/conn.rs`, `sql/value.rs`) and the store's transaction (`store/tx.rs`); they are named here,
// where users meet them.
pub use crate::sql::conn::{StateRow, TransitionConn};
pub use crate::sql::value::{SqlValue, ToSqlValue};
pub use crate::store::tx::TransitionTx;
pub use run::{
    Done, TransitionCall, TransitionGuard, TransitionSpec, TransitionStep, TransitionValues,
};
pub use sql::{Dialect, DialectSql, SqlText, TransitionShape, TransitionSql};

/// A state machine stored in one column of one table, declared with `#[derive(idem::StateMachine)]`.
///
/// The derive fills every item; implementing it by hand is possible but gets no compile-time checks.
pub trait StateMachine: Copy + Eq + fmt::Debug + Send + Sync + 'static {
    /// The enum's name, for messages.
    const NAME: &'static str;
    /// The table holding the rows (`orders`, or `schema.orders`).
    const TABLE: &'static str;
    /// The column that identifies a row (`order_no`).
    const KEY_COLUMN: &'static str;
    /// The column holding the stored state name (`status`).
    const STATUS_COLUMN: &'static str;
    /// The optimistic-lock column, when the machine declares one (`version`).
    const VERSION_COLUMN: Option<&'static str>;
    /// Every stored state name, in declaration order.
    const STATES: &'static [&'static str];
    /// The stored names of the terminal states: no transition leaves them.
    const TERMINAL: &'static [&'static str];
    /// The declared transitions, `(from, to)` by stored name.
    const EDGES: &'static [(&'static str, &'static str)];

    /// The stored name of this state (`"WAIT_PAY"`).
    fn as_str(self) -> &'static str;

    /// The state stored as `name`, if there is one.
    fn parse(name: &str) -> Option<Self>;

    /// Whether `self → to` is a declared transition.
    fn can_move_to(self, to: Self) -> bool {
        let (from, to) = (self.as_str(), to.as_str());
        Self::EDGES.iter().any(|&(f, t)| f == from && t == to)
    }

    /// Whether no transition leaves this state.
    fn is_terminal(self) -> bool {
        Self::TERMINAL.contains(&self.as_str())
    }
}

/// `"X".parse::<Machine>()` for a name that is no state of the machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{name}` is no state of `{machine}`")]
pub struct UnknownState {
    machine: &'static str,
    name: String,
}

impl UnknownState {
    /// The error for `name` parsed as a state of `machine`.
    pub fn new(machine: &'static str, name: &str) -> Self {
        UnknownState {
            machine,
            name: name.to_owned(),
        }
    }
}

/// What a `#[state_transition]` fn did.
///
/// The fn is declared returning `Result<Transition<T, S>, E>`; its body returns `Result<T, E>` and runs
/// only for [`Transition::Applied`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a transition that was not applied usually needs an answer to the caller"]
pub enum Transition<T, S> {
    /// The row moved (one row updated); the body ran in the same transaction and returned this.
    Applied(T),
    /// The row is already in the target state with matching `match` columns: a repeat of a transition
    /// that was applied before. The body did not run; answer the caller with success.
    AlreadyApplied,
    /// The row is in a state the transition does not start from (or it is the target state with other
    /// `match` values): nothing changed.
    Rejected {
        /// The row's state.
        current: S,
    },
    /// The row is in a `from` state but its version is not the expected one: someone else changed it
    /// since it was read. Nothing changed; re-read and decide again.
    VersionConflict {
        /// The row's state.
        current: S,
        /// The row's version.
        version: i64,
    },
    /// No row has this key.
    NotFound,
}

impl<T, S> Transition<T, S> {
    /// Whether the body ran now.
    pub fn is_applied(&self) -> bool {
        matches!(self, Transition::Applied(_))
    }

    /// Whether the caller may answer success: applied now or before.
    pub fn is_success(&self) -> bool {
        matches!(self, Transition::Applied(_) | Transition::AlreadyApplied)
    }

    /// The body's value, when it ran.
    pub fn applied(self) -> Option<T> {
        match self {
            Transition::Applied(value) => Some(value),
            _ => None,
        }
    }
}
