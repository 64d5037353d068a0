//! Parsing of `#[state_transition(…)]`'s options.
//!
//! The option list itself (unknown, duplicate and value-less options, missing commas) is read by
//! `common::options`; this file turns each value into what the transition needs. Whether a state
//! exists and a move is declared is checked against the machine, by the code the derive generates.

use proc_macro2::{Span, TokenStream};
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::{Expr, Ident, LitStr, Path, Token};

use crate::common::diag::Errors;
use crate::common::expr_arg::{
    ExprArg, as_lit_str, expr_arg, ident_value, path_value, peel_expr, string_lit,
};
use crate::common::options::{self, Form, OptionSet, Options, Value, opt};
use crate::state_machine::is_sql_ident;

/// A complete attribute, shown whenever a required option is missing.
pub(super) const EXAMPLE: &str = r#"#[state_transition(from = "WAIT_PAY", to = "PAID")]"#;

/// The options of `#[state_transition]`, in the order messages list them.
const OPTIONS: OptionSet = OptionSet {
    macro_name: "#[state_transition]",
    options: &[
        opt("from", Form::Value, r#"from = "WAIT_PAY""#),
        opt("to", Form::Value, r#"to = "PAID""#),
        opt("machine", Form::Value, "machine = OrderStatus"),
        opt("key", Form::Value, r#"key = "req.order_no""#),
        opt("set", Form::List, r#"set(trade_no = "cb.trade_no")"#),
        opt("now", Form::Value, r#"now = "paid_at""#),
        opt("match", Form::List, "match(trade_no)"),
        opt("version", Form::Value, r#"version = "seen_version""#),
        opt("tx", Form::Value, r#"tx = "tx""#),
        opt("store", Form::Value, r#"store = "sqlite""#),
        opt("crate", Form::Value, r#"crate = "::idem""#),
    ],
};

/// A state name as written, spanned at its literal.
#[derive(Clone)]
pub(super) struct StateName {
    pub(super) name: String,
    pub(super) lit: LitStr,
}

/// One `set(col = expr)` column.
pub(super) struct SetColumn {
    pub(super) column: Ident,
    pub(super) value: ExprArg,
}

/// Everything `#[state_transition(…)]` was given, plus every error found while parsing it.
pub(super) struct Args {
    pub(super) from: Vec<StateName>,
    pub(super) to: Option<StateName>,
    pub(super) machine: Option<Path>,
    pub(super) key: Option<ExprArg>,
    pub(super) set: Vec<SetColumn>,
    /// `now = "paid_at"`: the column set to the database's current time.
    pub(super) now: Option<String>,
    pub(super) matches: Vec<Ident>,
    pub(super) version: Option<ExprArg>,
    /// The transaction parameter, spanned where it was named.
    pub(super) tx: Option<Ident>,
    pub(super) store: Option<LitStr>,
    pub(super) krate: Option<Path>,
    /// Which options were written, also those refused.
    pub(super) options: Options,
    pub(super) errors: Errors,
}

impl Parse for Args {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut options = options::parse(input, &OPTIONS)?;
        let errors = std::mem::take(&mut options.errors);
        let given = std::mem::take(&mut options.given);
        let mut args = Args {
            from: Vec::new(),
            to: None,
            machine: None,
            key: None,
            set: Vec::new(),
            now: None,
            matches: Vec::new(),
            version: None,
            tx: None,
            store: None,
            krate: None,
            options,
            errors,
        };
        for given in given {
            let errors = &mut args.errors;
            let name = given.name;
            let example = OPTIONS
                .options
                .iter()
                .find(|def| def.name == name)
                .map_or("", |def| def.example);
            match given.value {
                Value::List(tokens) if name == "set" => set(tokens, &mut args.set, errors),
                Value::List(tokens) => matches(tokens, &mut args.matches, errors),
                Value::Flag => {}
                Value::Expr(value) => match name {
                    "from" => from(value, &mut args.from, errors),
                    "to" => args.to = state_name(name, &value, errors),
                    "machine" => {
                        args.machine = path(&value, errors, "the `#[derive(StateMachine)]` enum")
                    }
                    "crate" => {
                        args.krate = path(&value, errors, "the path at which idem is reachable")
                    }
                    "key" => args.key = expr_arg(name, example, value, errors),
                    "version" => args.version = expr_arg(name, example, value, errors),
                    "now" => args.now = column(name, &value, errors),
                    "tx" => args.tx = tx(&value, errors),
                    _ => args.store = string_lit(name, example, &value, errors),
                },
            }
        }
        Ok(args)
    }
}

/// `from = "A"` or `from = ["A", "B"]`.
fn from(value: Expr, states: &mut Vec<StateName>, errors: &mut Errors) {
    match value {
        Expr::Array(array) => {
            if array.elems.is_empty() {
                errors.spanned(&array, "`from = []` lists no state; name at least one");
            }
            for elem in array.elems {
                states.extend(state_name("from", &peel_expr(elem), errors));
            }
        }
        single => states.extend(state_name("from", &single, errors)),
    }
}

/// A stored state name, in quotes.
fn state_name(option: &str, value: &Expr, errors: &mut Errors) -> Option<StateName> {
    let Some(lit) = as_lit_str(value) else {
        errors.spanned(
            value,
            format!(
                "`{option}` takes the stored name of a state in quotes, e.g. `{option} = \"PAID\"`"
            ),
        );
        return None;
    };
    Some(StateName {
        name: lit.value(),
        lit: lit.clone(),
    })
}

/// `machine = OrderStatus`, `crate = "::idem"`.
fn path(value: &Expr, errors: &mut Errors, what: &str) -> Option<Path> {
    let path = path_value(value);
    if path.is_none() {
        errors.spanned(
            value,
            format!(
                "expected a path: {what}, e.g. `machine = OrderStatus` or `crate = \"::idem\"`"
            ),
        );
    }
    path
}

/// `tx = "tx"` (or `tx = tx`): the name of the transaction parameter.
fn tx(value: &Expr, errors: &mut Errors) -> Option<Ident> {
    let ident = ident_value(value);
    if ident.is_none() {
        errors.spanned(
            value,
            "`tx` takes the name of the transaction parameter, e.g. `tx = \"tx\"` for \
             `tx: &mut idem::SqliteTx` (or `idem::MySqlTx`, `idem::PgTx`, an `idem::sqlx` transaction)",
        );
    }
    ident
}

/// `now = "paid_at"` (or `now = paid_at`): a SQL column.
fn column(option: &str, value: &Expr, errors: &mut Errors) -> Option<String> {
    let (name, span) = match (as_lit_str(value), ident_value(value)) {
        (Some(lit), _) => (lit.value(), lit.span()),
        (None, Some(ident)) => (ident.to_string(), ident.span()),
        (None, None) => {
            errors.spanned(
                value,
                format!("`{option}` takes a column name, e.g. `{option} = \"paid_at\"`"),
            );
            return None;
        }
    };
    check_column(&name, span, option, errors).then_some(name)
}

/// `set(col = expr, …)`.
fn set(tokens: TokenStream, columns: &mut Vec<SetColumn>, errors: &mut Errors) {
    let parser = Punctuated::<(Ident, Expr), Token![,]>::parse_terminated_with;
    let one = |input: ParseStream| {
        let column = <Ident as syn::ext::IdentExt>::parse_any(input)?;
        input.parse::<Token![=]>()?;
        Ok((column, input.parse()?))
    };
    let parsed = (|input: ParseStream| parser(input, one)).parse2(tokens);
    let pairs = match parsed {
        Ok(pairs) => pairs,
        Err(error) => {
            errors.push(syn::Error::new(
                error.span(),
                format!("{error}; write `set(column = \"expression\", …)`, e.g. `set(trade_no = \"cb.trade_no\")`"),
            ));
            return;
        }
    };
    for (column, value) in pairs {
        let name = column.to_string();
        if !check_column(&name, column.span(), "set", errors) {
            continue;
        }
        let role = format!("set({name} = …)");
        let example = format!("set({name} = \"req.{name}\")");
        if let Some(value) = expr_arg(&role, &example, value, errors) {
            columns.push(SetColumn { column, value });
        }
    }
}

/// `match(col, …)`.
fn matches(tokens: TokenStream, columns: &mut Vec<Ident>, errors: &mut Errors) {
    let parser = Punctuated::<Ident, Token![,]>::parse_terminated_with;
    match (|input: ParseStream| parser(input, <Ident as syn::ext::IdentExt>::parse_any))
        .parse2(tokens)
    {
        Ok(names) => columns.extend(names),
        Err(error) => errors.push(syn::Error::new(
            error.span(),
            format!("{error}; write the `set` columns to compare, e.g. `match(trade_no)`"),
        )),
    }
}

/// Whether `name` can be written into SQL unquoted; else an error at `span`.
pub(super) fn check_column(name: &str, span: Span, option: &str, errors: &mut Errors) -> bool {
    let ok = is_sql_ident(name);
    if !ok {
        errors.at(
            span,
            format!(
                "`{name}` in `{option}` is not a SQL column name idem can write unquoted; use \
                 `[A-Za-z_][A-Za-z0-9_]*`"
            ),
        );
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn parse(tokens: TokenStream) -> (Args, Vec<String>) {
        let mut args: Args = syn::parse2(tokens).expect("errors are recorded, not returned");
        let errors = std::mem::take(&mut args.errors);
        let messages = match errors.finish() {
            Ok(()) => Vec::new(),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        };
        (args, messages)
    }

    #[test]
    fn parses_every_option() {
        let (args, errors) = parse(quote!(
            machine = crate::OrderStatus,
            from = ["WAIT_PAY", "PAY_FAILED"],
            to = "PAID",
            key = "cb.order_no",
            set(trade_no = "cb.trade_no", amount = cb.amount),
            now = paid_at,
            match(trade_no),
            version = "v",
            tx = "conn",
            crate = "::idem"
        ));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(args.from.len(), 2);
        assert_eq!(args.to.unwrap().name, "PAID");
        assert_eq!(args.set.len(), 2);
        assert!(args.set[1].value.lit.is_none());
        assert_eq!(args.now.unwrap(), "paid_at");
        assert_eq!(args.tx.unwrap(), "conn");
    }

    #[test]
    fn a_misspelled_option_is_not_also_missing() {
        let (args, errors) = parse(quote!(fro = "WAIT_PAY", to = "PAID"));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0]
                .starts_with("unknown option `fro` in `#[state_transition]`; did you mean `from`?")
        );
        assert!(args.options.missing(&["from", "to"]).is_empty());
    }

    #[test]
    fn recovers_from_a_missing_comma() {
        let (args, errors) = parse(quote!(from = "WAIT_PAY" to = "PAID", key = "id"));
        assert_eq!(
            errors,
            ["expected `,` between the options of `#[state_transition]`"]
        );
        assert!(args.key.is_some());
    }

    #[test]
    fn refuses_bad_values() {
        let (_, errors) = parse(quote!(
            from = [],
            to = PAID,
            now = "paid at",
            set(trade_no),
            tx = "a b"
        ));
        assert_eq!(errors.len(), 5, "{errors:#?}");
        assert!(errors[0].starts_with("`from = []` lists no state"));
        assert!(errors[1].starts_with("`to` takes the stored name of a state in quotes"));
        assert!(errors[2].starts_with("`paid at` in `now` is not a SQL column name"));
        assert!(errors[3].contains("write `set(column = \"expression\", …)`"));
        assert!(errors[4].starts_with("`tx` takes the name of the transaction parameter"));
    }
}
