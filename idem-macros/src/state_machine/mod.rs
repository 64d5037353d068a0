//! `#[derive(StateMachine)]`: parse the enum and its `#[state_machine]` / `#[state]` attributes, check
//! them, and generate the `idem::StateMachine` impl, `Display`/`FromStr`, the sqlx impls (through the
//! runtime, so the user's crate needs no sqlx features) and the hidden items `#[state_transition]`
//! checks names against.

mod check;
mod expand;

use proc_macro2::TokenStream;
use syn::{DeriveInput, Ident, Path};

use check::check;
pub(crate) use check::is_sql_ident;
use expand::expand;

/// A checked machine.
pub(super) struct Machine {
    pub(super) ident: Ident,
    pub(super) table: String,
    pub(super) key: String,
    pub(super) status: String,
    pub(super) version: Option<String>,
    pub(super) krate: Option<Path>,
    pub(super) states: Vec<State>,
}

pub(super) struct State {
    pub(super) variant: Ident,
    pub(super) name: String,
    pub(super) to: Vec<Ident>,
    pub(super) terminal: bool,
}

/// `#[derive(StateMachine)]`: on error, only the errors (a derive never re-emits the item).
pub(crate) fn derive(input: TokenStream) -> TokenStream {
    match syn::parse2::<DeriveInput>(input).and_then(|input| check(&input)) {
        Ok(machine) => expand(&machine),
        Err(error) => error.into_compile_error(),
    }
}

#[cfg(test)]
mod tests {
    use super::check::{is_sql_ident, screaming_snake};

    #[test]
    fn stored_names_default_to_screaming_snake_case() {
        assert_eq!(screaming_snake("WaitPay"), "WAIT_PAY");
        assert_eq!(screaming_snake("Paid"), "PAID");
        assert_eq!(screaming_snake("HTTPError"), "HTTP_ERROR");
        assert_eq!(screaming_snake("Step2Done"), "STEP2_DONE");
        assert!(is_sql_ident("order_no") && !is_sql_ident("order-no") && !is_sql_ident("1a"));
    }
}
