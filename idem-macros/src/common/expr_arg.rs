//! Options whose value is a Rust expression, given in a string (`key = "req.order_no"`) or bare
//! (`key = req.order_no`), and the small helpers every option parser uses.

use proc_macro2::{TokenStream, TokenTree};
use quote::ToTokens;
use syn::parse::ParseStream;
use syn::{Expr, ExprLit, Lit, LitStr, Token};

use crate::common::diag::Errors;

/// A Rust expression given in a string (`key = "req.order_no"`) or bare (`key = req.order_no`).
pub(crate) struct ExprArg {
    /// The expression; when it came from a string, every token carries the literal's span.
    pub(crate) expr: Expr,
    /// The literal it was parsed from, if any.
    pub(crate) lit: Option<LitStr>,
}

impl ExprArg {
    /// Tokens to span an error about the whole argument at.
    pub(crate) fn error_tokens(&self) -> TokenStream {
        match &self.lit {
            Some(lit) => lit.to_token_stream(),
            None => self.expr.to_token_stream(),
        }
    }
}

/// Skips the rest of a broken option, up to (not including) the next top-level `,`.
pub(crate) fn skip_to_comma(input: ParseStream) {
    while !input.is_empty() && !input.peek(Token![,]) {
        if input.parse::<TokenTree>().is_err() {
            break;
        }
    }
}

/// The string literal `value` is, if it is one.
pub(crate) fn as_lit_str(value: &Expr) -> Option<&LitStr> {
    match value {
        Expr::Lit(ExprLit {
            attrs,
            lit: Lit::Str(lit),
        }) if attrs.is_empty() => Some(lit),
        _ => None,
    }
}

/// `key` / `fingerprint`: a string holding an expression, or a bare expression.
/// `opt` names the option and `example` shows it written (`key = "req.order_no"`), for messages.
pub(crate) fn expr_arg(
    opt: &str,
    example: &str,
    value: Expr,
    errors: &mut Errors,
) -> Option<ExprArg> {
    let Some(lit) = as_lit_str(&value).cloned() else {
        return Some(ExprArg {
            expr: value,
            lit: None,
        });
    };
    if lit.value().trim().is_empty() {
        errors.at(
            lit.span(),
            format!(
                "`{}` is empty; write an expression over the parameters, e.g. `{}`",
                opt, example
            ),
        );
        return None;
    }
    // The expression's tokens all carry the literal's span, so rustc's own errors about it (a misspelled
    // field, a type without `IdemKey`) point into the attribute.
    match lit.parse::<Expr>() {
        Ok(expr) => Some(ExprArg {
            expr,
            lit: Some(lit),
        }),
        Err(error) => {
            errors.at(
                lit.span(),
                format!(
                    "`{}` is not a Rust expression ({error}); write e.g. `{}`",
                    opt, example
                ),
            );
            None
        }
    }
}
