//! Unit tests of `#[idempotent]`: the option parser (`args`), the checks against the fn (`check`) and
//! the expansion with its fallback (`expand`).

mod args;
mod check;
mod expand;
