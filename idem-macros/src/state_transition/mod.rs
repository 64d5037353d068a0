//! `#[state_transition(from = "WAIT_PAY", to = "PAID", …)]`: parse the options (`args.rs`), check
//! them against the fn (`check.rs`), generate the new body (`expand.rs`) and the SQL it documents
//! (`docs.rs`).
//!
//! What only the machine knows (its states, transitions, key and version columns) is checked against
//! the machine's own description: the expansion calls the macro `#[derive(StateMachine)]` put next to
//! the enum, named like it, which hands the transition's tokens to the hidden [`check_transition!`]
//! (`machine_check.rs`); each mistake is reported at the user's literal. The SQL is built by a
//! `const fn` of the runtime from the machine's consts.
//!
//! [`check_transition!`]: crate::check_transition

mod args;
mod check;
mod docs;
mod expand;
mod machine_check;

use proc_macro2::TokenStream;
use quote::quote;
use syn::ItemFn;

use args::Args;
pub(crate) use machine_check::check_transition;

/// `#[state_transition(args)] item`: on error the fn (its body kept) plus every error.
pub(crate) fn attribute(args: TokenStream, item: TokenStream) -> TokenStream {
    let args: Args = match syn::parse2(args) {
        Ok(args) => args,
        Err(error) => {
            let errors = error.into_compile_error();
            return quote!(#item #errors);
        }
    };
    let item_fn: ItemFn = match syn::parse2(item.clone()) {
        Ok(item_fn) => item_fn,
        Err(error) => {
            let mut errors = args.errors;
            errors.push(syn::Error::new(
                error.span(),
                "`#[state_transition]` goes on an `async fn` with a body that returns \
                 `Result<idem::Transition<T, Machine>, E>`",
            ));
            let errors = errors.finish().expect_err("an error was just recorded");
            let errors = errors.into_compile_error();
            return quote!(#item #errors);
        }
    };
    let krate = args.krate.clone();
    match check::check(args, &item_fn) {
        Ok(spec) => expand::expand(&item_fn, &spec),
        Err(error) => {
            let errors = error.into_compile_error();
            let item = expand::fallback(&item_fn, krate.as_ref());
            quote!(#item #errors)
        }
    }
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
            // The machine comes from the return type, and checks the transition through its macro.
            "S ! { (:: idem :: __macros :: check_transition) transition { from = [\"WAIT_PAY\"] ; to = \"PAID\" ; key = order_no ; } }",
            "static __IDEM_TRANSITION : :: idem :: __private :: TransitionSpec < < S as :: idem :: __private :: IsMachine > :: Machine > = :: idem :: __private :: TransitionSpec :: new (\"PAID\" , & [\"WAIT_PAY\"] ,",
            "let _ = (& mut * tx as & mut dyn :: idem :: __private :: TransitionConn) ;",
            "let __idem_key = & (order_no) ;",
            "let __idem_values = :: idem :: __private :: TransitionValues :: new (__idem_key as & dyn :: idem :: __private :: ToSqlValue , & []) ;",
            ". start ((& mut * tx as & mut dyn :: idem :: __private :: TransitionConn) , __idem_values , :: core :: option :: Option :: None)",
            "let __idem_out : :: core :: result :: Result < u8 , E > = async {",
            "__idem_call . finish (__idem_guard , (& mut * tx as & mut dyn :: idem :: __private :: TransitionConn) , __idem_err , __idem_out) . await",
            "__idem_call . run (async {",
            "UPDATE \\\"{table}\\\" SET \\\"{status}\\\" = ?, \\\"{version}\\\" = \\\"{version}\\\" + 1 WHERE \\\"{key}\\\" = ? AND \\\"{status}\\\" = ?",
        ] {
            assert!(out.contains(expected), "missing `{expected}` in\n{out}");
        }
        assert!(!out.contains(". begin ("), "{out}");
    }

    /// The docs render the statements by hand (the macro cannot see the machine's table); this
    /// pins that rendering to what `idem::state_machine::TransitionSql` builds and runs.
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
            // The doc string's text up to its end (an unescaped `"`), unescaped.
            let end = text.find("\n").unwrap_or(text.len());
            let mut line = String::new();
            let mut chars = text[..end].chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => line.extend(chars.next()),
                    '"' => break,
                    c => line.push(c),
                }
            }
            line.replace("{table}", "orders")
                .replace("{status}", "status")
                .replace("{key}", "order_no")
                .replace("{version}", "version")
        };
        let built = idem_runtime::state_machine::TransitionSql::build::<Orders>(
            &idem_runtime::state_machine::TransitionShape {
                set: &["trade_no"],
                now: Some("paid_at"),
                matches: &["trade_no"],
                from_count: 2,
                versioned: true,
            },
        );
        assert_eq!(
            documented("UPDATE \\\"{table}"),
            built.sqlite.update.as_str()
        );
        assert_eq!(
            documented("SELECT \\\"{status}"),
            built.sqlite.read.as_str()
        );
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
            "crate :: OrderStatus ! {",
            "TransitionSpec < < crate :: OrderStatus as :: idem :: __private :: IsMachine > :: Machine >",
            "__idem_call . begin (:: idem :: __private :: StoreArg :: Named (\"sqlite\")) . await",
            "set : & [\"trade_no\"] , now : :: core :: option :: Option :: Some (\"paid_at\") , matches : & [\"trade_no\"] , from_count : 2usize , versioned : true",
            "let __idem_key = & (cb . order_no) ; let __idem_set0 = & (cb . trade_no) ;",
            "TransitionValues :: new (__idem_key as & dyn :: idem :: __private :: ToSqlValue , & [__idem_set0 as & dyn :: idem :: __private :: ToSqlValue]) ;",
            ". start ((& mut * __idem_tx as & mut dyn :: idem :: __private :: TransitionConn) , __idem_values , :: core :: option :: Option :: Some (__idem_version))",
            "let __idem_version : i64 = v ;",
            "__idem_call . end (__idem_tx , __idem_err , __idem_result) . await",
            "idem::state_machine::TransitionSql::build::<crate::OrderStatus>(&idem::state_machine::TransitionShape { set: &[\\\"trade_no\\\"], now: Some(\\\"paid_at\\\"), matches: &[\\\"trade_no\\\"], from_count: 2, versioned: true })",
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
        // unknown `fro` (not also "missing `from`"), `from` equal to `to` is not judged without `from`
        assert_eq!(out.matches("compile_error").count(), 1, "{out}");
        // The fn with its body, awaited and wrapped, its parameters used: no error or warning of its own.
        for expected in [
            "async fn pay (tx : & mut Tx < '_ > , order_no : & str) -> Result < Transition < u8 , S > , E > { let _ = & tx ; let _ = & order_no ; match async {",
            "Ok (1) } . await { :: core :: result :: Result :: Ok (value) => { :: core :: result :: Result :: Ok (:: idem :: Transition :: Applied (value)) }",
        ] {
            assert!(out.contains(expected), "missing `{expected}` in\n{out}");
        }
        assert!(
            !out.contains("IsMachine") && !out.contains("unreachable !"),
            "{out}"
        );
    }
}
