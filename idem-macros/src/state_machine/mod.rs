//! `#[derive(StateMachine)]`: parse the enum and its `#[state_machine]` / `#[state]` attributes
//! (`args.rs`), check them (`check.rs`), and generate the `idem::StateMachine` impl, `Display` /
//! `FromStr`, the sqlx impls and the machine's hidden macro `#[state_transition]` checks against
//! (`expand.rs`, with the machine's description in `description.rs`).

mod args;
mod check;
pub(crate) mod description;
mod expand;

use proc_macro2::TokenStream;
use quote::quote;
use syn::{DeriveInput, Ident, Path};

pub(crate) use check::{is_sql_ident, screaming_snake};

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

/// `#[derive(StateMachine)]`. On error: the errors, and a stub of the impls (a derive never
/// re-emits the item), so code using the machine adds no errors of its own.
pub(crate) fn derive(input: TokenStream) -> TokenStream {
    let input = match syn::parse2::<DeriveInput>(input) {
        Ok(input) => input,
        Err(error) => return error.into_compile_error(),
    };
    let mut args = args::parse(&input);
    match check::check(&input, &mut args) {
        Ok(machine) => expand::expand(&machine),
        Err(error) => {
            let errors = error.into_compile_error();
            // No stub for what is no enum, or a generic one: its one error is about that.
            let stub = (args.states.is_some() && input.generics.params.is_empty())
                .then(|| expand::stub(&input.ident, args.krate.as_ref()));
            quote!(#errors #stub)
        }
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
