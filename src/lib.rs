//! **idem** makes a service function idempotent with one attribute: N executions of the same
//! business action leave the system as one execution did, and every repeat gets the first answer.
//!
//! ```ignore
//! use idem::{idempotent, IdemError};
//!
//! #[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", fingerprint = "req")]
//! async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
//!     // runs at most once per (PAY, order_no); repeats replay the stored Receipt
//! }
//! ```
//!
//! This crate is the one dependency users add: it re-exports the runtime ([`Call`], [`Store`],
//! the stores, [`IdemError`], metrics) and the [`idempotent`] attribute. See the README for the
//! full attribute reference and `DESIGN.md` for the guarantees.
//!
//! Stateful business is made idempotent by its transitions: `#[derive(StateMachine)]` declares a
//! machine stored in one column, and [`state_transition`] turns an `async fn` into a conditional
//! update that moves a row once and returns a [`Transition`].

pub use idem_macros::idempotent;
pub use idem_macros::{StateMachine, state_transition};
pub use idem_runtime::*;

/// What the code the macros generate calls back into the macro crate. Not a public API.
#[doc(hidden)]
pub mod __macros {
    pub use idem_macros::check_transition;
}

/// The sqlx this crate was built with, for `tx = "…"` parameters (`idem::sqlx::Transaction`).
#[cfg(feature = "sqlite")]
pub use idem_runtime::sqlx;
