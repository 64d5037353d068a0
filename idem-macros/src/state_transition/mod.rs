//! `#[state_transition(from = "WAIT_PAY", to = "PAID", …)]`: parse, check against the fn, generate.
//!
//! What only the machine knows (its table, columns, states and edges) is checked by the generated code at
//! compile time: state names through the machine's hidden `States` consts (rustc's "similar name" help
//! for a typo) and edges, terminal states, the key column and the version column through `const`
//! assertions whose panic messages name the states and the fix. The SQL is built by a `const fn` of the
//! runtime from the machine's consts.

mod args;
mod check;
mod docs;
mod expand;

use proc_macro2::TokenStream;
use quote::quote;
use syn::ItemFn;

use args::Args;
use check::check;
use expand::{expand, fallback};

/// `#[state_transition(args)] item`: on error the fn as written plus every error.
pub(crate) fn attribute(args: TokenStream, item: TokenStream) -> TokenStream {
    match try_attribute(args, item.clone()) {
        Ok(expanded) => expanded,
        Err(error) => {
            let errors = error.into_compile_error();
            let item = fallback(item);
            quote!(#item #errors)
        }
    }
}

fn try_attribute(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let args: Args = syn::parse2(args.clone())?;
    let item_fn: ItemFn = syn::parse2(item.clone()).map_err(|error| {
        syn::Error::new(
            error.span(),
            "`#[state_transition]` goes on an `async fn` with a body that returns \
             `Result<idem::Transition<T, Machine>, E>`",
        )
    })?;
    let spec = check(args, &item_fn)?;
    Ok(expand(&item_fn, &spec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn expand(args: TokenStream, item: TokenStream) -> String {
        attribute(args, item).to_string()
    }

    #[test]
    fn expands_the_short_form_in_the_callers_transaction() {
        let out = expand(
            quote!(from = "WAIT_PAY", to = "PAID"),
            quote! {
                async fn pay(tx: &mut Tx<'_>, order_no: &str) -> Result<Transition<u8, S>, E> {
                    Ok(1)
                }
            },
        );
        assert!(!out.contains("compile_error"), "{out}");
        for expected in [
            "type __IdemM = __IdemMachine ;",
            "let () = << __IdemM as :: idem :: __private :: Machine > :: States > :: WAIT_PAY ;",
            ":: idem :: __private :: has_edge",
            ":: idem :: __private :: str_eq (< __IdemM as :: idem :: StateMachine > :: KEY_COLUMN , \"order_no\")",
            ":: idem :: __private :: transition_conn (& mut * tx)",
            ". bind (\"PAID\") . bind (& (order_no)) . bind (\"WAIT_PAY\") . execute",
            "let __idem_out : :: core :: result :: Result < u8 , E > = async {",
            "UPDATE {table} SET {status} = ? WHERE {key} = ? AND {status} = ?",
        ] {
            assert!(out.contains(expected), "missing `{expected}` in\n{out}");
        }
        assert!(!out.contains("transition_begin"), "{out}");
    }

    /// The docs render the statements by hand (the macro cannot see the machine's table); this
    /// pins that rendering to what `idem::TransitionSql` builds and runs.
    #[test]
    fn the_documented_sql_is_the_sql_that_runs() {
        use idem_runtime::StateMachine;

        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        struct Orders;
        impl StateMachine for Orders {
            const NAME: &'static str = "Orders";
            const TABLE: &'static str = "orders";
            const KEY_COLUMN: &'static str = "order_no";
            const STATUS_COLUMN: &'static str = "status";
            const VERSION_COLUMN: Option<&'static str> = Some("version");
            const STATES: &'static [&'static str] = &["WAIT_PAY", "PAY_FAILED", "PAID"];
            const TERMINAL: &'static [&'static str] = &[];
            const EDGES: &'static [(&'static str, &'static str)] = &[];
            fn as_str(self) -> &'static str {
                "PAID"
            }
            fn parse(_: &str) -> Option<Self> {
                None
            }
        }

        let out = expand(
            quote!(
                from = ["WAIT_PAY", "PAY_FAILED"],
                to = "PAID",
                set(trade_no = "trade_no"),
                now = "paid_at",
                match(trade_no),
                version = "v"
            ),
            quote! {
                async fn pay(tx: &mut Tx<'_>, order_no: &str, trade_no: &str, v: i64)
                    -> Result<Transition<(), S>, E> { Ok(()) }
            },
        );
        let documented = |start: &str| {
            let at = out
                .find(start)
                .unwrap_or_else(|| panic!("no `{start}` in the docs:\n{out}"));
            let text = &out[at..];
            text[..text.find('"').expect("the doc string ends")]
                .replace("{table}", "orders")
                .replace("{status}", "status")
                .replace("{key}", "order_no")
                .replace("{version}", "version")
        };
        let built = idem_runtime::TransitionSql::build::<Orders>(
            &idem_runtime::__private::TransitionShape {
                set: &["trade_no"],
                now: Some("paid_at"),
                matches: &["trade_no"],
                from_count: 2,
                versioned: true,
            },
        );
        assert_eq!(documented("UPDATE {table}"), built.sqlite.update.as_str());
        assert_eq!(documented("SELECT {status}"), built.sqlite.read.as_str());
    }

    #[test]
    fn expands_every_option_in_a_transaction_of_its_own() {
        let out = expand(
            quote!(
                machine = crate::OrderStatus,
                from = ["WAIT_PAY", "PAY_FAILED"],
                to = "PAID",
                key = "cb.order_no",
                set(trade_no = "cb.trade_no"),
                now = "paid_at",
                match(trade_no),
                version = "v",
                store = "sqlite"
            ),
            quote! {
                async fn pay(cb: &Cb, v: i64) -> Result<Transition<(), S>, E> { Ok(()) }
            },
        );
        assert!(!out.contains("compile_error"), "{out}");
        for expected in [
            "type __IdemM = crate :: OrderStatus ;",
            ":: idem :: __private :: transition_begin (\"sqlite\")",
            "set : & [\"trade_no\"] , now : :: core :: option :: Option :: Some (\"paid_at\") , matches : & [\"trade_no\"] , from_count : 2usize , versioned : true",
            ". bind (\"PAID\") . bind (& (cb . trade_no)) . bind (& (cb . order_no)) . bind (\"WAIT_PAY\") . bind (\"PAY_FAILED\") . bind (__idem_version)",
            "let __idem_version : i64 = v ;",
            "UPDATE {table} SET {status} = ?, trade_no = ?, paid_at = CURRENT_TIMESTAMP, {version} = {version} + 1 WHERE {key} = ? AND {status} IN (?, ?) AND {version} = ?",
            "transition_commit (__idem_tx)",
        ] {
            assert!(out.contains(expected), "missing `{expected}` in\n{out}");
        }
    }

    #[test]
    fn a_bad_attribute_keeps_the_fn_callable() {
        let out = expand(
            quote!(fro = "WAIT_PAY", to = "WAIT_PAY"),
            quote! {
                async fn pay(tx: &mut Tx<'_>, order_no: &str) -> Result<Transition<u8, S>, E> {
                    Ok(1)
                }
            },
        );
        // unknown `fro`, missing `from`
        assert_eq!(out.matches("compile_error").count(), 2, "{out}");
        assert!(out.contains("async fn pay (tx : & mut Tx < '_ > , order_no : & str) -> Result < Transition < u8 , S > , E >"), "{out}");
        assert!(!out.contains("__IdemM "), "{out}");
    }
}
