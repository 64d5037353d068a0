//! Parsing of `#[state_transition(…)]`'s options.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Path, Token};

use crate::common::diag::{self, Errors};
use crate::state_machine::is_sql_ident;

pub(super) const OPTIONS: [&str; 12] = [
    "from", "to", "machine", "key", "set", "now", "match", "version", "tx", "store", "crate", "",
];
pub(super) const EXAMPLE: &str = r#"#[state_transition(from = "WAIT_PAY", to = "PAID")]"#;

pub(super) fn option_names() -> impl Iterator<Item = &'static str> {
    OPTIONS.into_iter().filter(|name| !name.is_empty())
}

/// A state name as written, spanned at its literal.
#[derive(Clone)]
pub(super) struct StateName {
    pub(super) name: String,
    pub(super) lit: LitStr,
}

/// An expression given quoted (`key = "req.order_no"`) or bare.
#[derive(Clone)]
pub(super) struct ExprArg {
    pub(super) expr: Expr,
    pub(super) span: Span,
}

/// One `set(col = expr)` column.
pub(super) struct SetColumn {
    pub(super) column: Ident,
    pub(super) value: ExprArg,
}

#[derive(Default)]
pub(super) struct Args {
    pub(super) from: Vec<StateName>,
    pub(super) to: Option<StateName>,
    pub(super) machine: Option<Path>,
    pub(super) key: Option<ExprArg>,
    pub(super) set: Vec<SetColumn>,
    pub(super) now: Option<LitStr>,
    pub(super) matches: Vec<Ident>,
    pub(super) version: Option<ExprArg>,
    pub(super) tx: Option<LitStr>,
    pub(super) store: Option<LitStr>,
    pub(super) krate: Option<Path>,
    pub(super) seen: Vec<String>,
    pub(super) errors: Errors,
}

impl Parse for Args {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            if let Err(error) = parse_one(input, &mut args) {
                args.errors.push(error);
                while !input.is_empty() && !input.peek(Token![,]) {
                    input.parse::<proc_macro2::TokenTree>()?;
                }
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

pub(super) fn parse_one(input: ParseStream, args: &mut Args) -> syn::Result<()> {
    let name = <Ident as syn::ext::IdentExt>::parse_any(input)?;
    let key = name.to_string();
    if !option_names().any(|option| option == key) {
        let did_you_mean = diag::did_you_mean_clause(&key, option_names());
        args.errors.at(
            name.span(),
            format!(
                "unknown option `{key}` in `#[state_transition]`{did_you_mean} the options are {}",
                diag::backticked(option_names())
            ),
        );
        while !input.is_empty() && !input.peek(Token![,]) {
            input.parse::<proc_macro2::TokenTree>()?;
        }
        return Ok(());
    }
    if args.seen.contains(&key) {
        args.errors.at(
            name.span(),
            format!("duplicate option `{key}`; each option may be given once, remove this one"),
        );
    }
    args.seen.push(key.clone());
    match key.as_str() {
        "set" => {
            let content;
            syn::parenthesized!(content in input);
            let columns =
                Punctuated::<(Ident, Expr), Token![,]>::parse_terminated_with(&content, |input| {
                    let column: Ident = input.parse()?;
                    input.parse::<Token![=]>()?;
                    Ok((column, input.parse()?))
                })?;
            for (column, value) in columns {
                check_column(&column.to_string(), column.span(), "set", &mut args.errors);
                let value = expr_arg(value)?;
                args.set.push(SetColumn { column, value });
            }
        }
        "match" => {
            let content;
            syn::parenthesized!(content in input);
            let columns = Punctuated::<Ident, Token![,]>::parse_terminated_with(
                &content,
                <Ident as syn::ext::IdentExt>::parse_any,
            )?;
            args.matches.extend(columns);
        }
        _ => {
            if !input.peek(Token![=]) {
                return Err(syn::Error::new(
                    name.span(),
                    format!("`{key}` needs a value, e.g. `{EXAMPLE}`"),
                ));
            }
            input.parse::<Token![=]>()?;
            let value: Expr = input.parse()?;
            match key.as_str() {
                "from" => match &value {
                    Expr::Array(array) => {
                        for elem in &array.elems {
                            args.from.push(state_name(elem)?);
                        }
                        if array.elems.is_empty() {
                            args.errors
                                .spanned(array, "`from = []` lists no state; name at least one");
                        }
                    }
                    _ => args.from.push(state_name(&value)?),
                },
                "to" => args.to = Some(state_name(&value)?),
                "machine" => args.machine = Some(path_arg(&value)?),
                "crate" => args.krate = Some(path_arg(&value)?),
                "key" => args.key = Some(expr_arg(value)?),
                "version" => args.version = Some(expr_arg(value)?),
                "now" => {
                    let lit = lit_str(&value, "now = \"paid_at\"")?;
                    check_column(&lit.value(), lit.span(), "now", &mut args.errors);
                    args.now = Some(lit);
                }
                "tx" => args.tx = Some(lit_str(&value, "tx = \"tx\"")?),
                "store" => args.store = Some(lit_str(&value, "store = \"sqlite\"")?),
                _ => unreachable!("every option is handled"),
            }
        }
    }
    Ok(())
}

pub(super) fn check_column(name: &str, span: Span, option: &str, errors: &mut Errors) {
    if !is_sql_ident(name) {
        errors.at(
            span,
            format!(
                "`{name}` in `{option}` is not a SQL column name idem can write unquoted; use \
                 `[A-Za-z_][A-Za-z0-9_]*`"
            ),
        );
    }
}

pub(super) fn lit_str(value: &Expr, example: &str) -> syn::Result<LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(lit.clone()),
        other => Err(syn::Error::new_spanned(
            other,
            format!("expected a string literal, e.g. `{example}`"),
        )),
    }
}

pub(super) fn state_name(value: &Expr) -> syn::Result<StateName> {
    let lit = lit_str(value, r#"from = "WAIT_PAY""#)?;
    let name = lit.value();
    if !is_sql_ident(&name) || syn::parse_str::<Ident>(&name).is_err() {
        return Err(syn::Error::new_spanned(
            &lit,
            format!(
                "`{name}` is not a state name; state names are stored words such as `WAIT_PAY`"
            ),
        ));
    }
    Ok(StateName { name, lit })
}

pub(super) fn path_arg(value: &Expr) -> syn::Result<Path> {
    match value {
        Expr::Path(path) if path.qself.is_none() => Ok(path.path.clone()),
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => lit.parse(),
        other => Err(syn::Error::new_spanned(
            other,
            "expected a path, e.g. `machine = OrderStatus`",
        )),
    }
}

pub(super) fn expr_arg(value: Expr) -> syn::Result<ExprArg> {
    match &value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(ExprArg {
            expr: lit.parse()?,
            span: lit.span(),
        }),
        _ => Ok(ExprArg {
            span: value.span(),
            expr: value,
        }),
    }
}
