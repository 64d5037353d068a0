//! Option values: Rust expressions given in a string (`key = "req.order_no"`) or bare
//! (`key = req.order_no`), string literals, paths and names, and the small helpers every option parser
//! uses.
//!
//! Every value is looked at through the invisible (None-delimited) groups `macro_rules!` puts around a
//! fragment (`$biz:literal`, `$key:expr`, `$store:path`, …), so an attribute written by a wrapper
//! macro means what the same attribute written by hand means.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::parse::ParseStream;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Path, Token};

use super::diag::{self, Errors};

/// A Rust expression given in a string (`key = "req.order_no"`) or bare (`key = req.order_no`).
#[derive(Clone)]
pub(crate) struct ExprArg {
    /// The expression; when it came from a string, every token carries the literal's span.
    pub(crate) expr: Expr,
    /// The literal it was parsed from, if any.
    pub(crate) lit: Option<LitStr>,
}

impl ExprArg {
    /// A bare expression (a parameter the macro picked, say).
    pub(crate) fn bare(expr: Expr) -> Self {
        ExprArg { expr, lit: None }
    }

    /// Tokens to span an error about the whole argument at.
    pub(crate) fn error_tokens(&self) -> TokenStream {
        match &self.lit {
            Some(lit) => lit.to_token_stream(),
            None => self.expr.to_token_stream(),
        }
    }

    /// The span of the argument as written (the literal, or the expression's first token).
    pub(crate) fn span(&self) -> Span {
        match &self.lit {
            Some(lit) => lit.span(),
            None => self.expr.span(),
        }
    }

    /// The expression as it goes into the expansion: as written when bare; from a string, at the
    /// literal but resolved at the macro call (see [`diag::inside_literal`]).
    pub(crate) fn emitted(&self) -> Expr {
        let Some(lit) = &self.lit else {
            return self.expr.clone();
        };
        let tokens = diag::inside_literal(self.expr.to_token_stream(), lit.span());
        syn::parse2(tokens).unwrap_or_else(|_| self.expr.clone())
    }
}

/// `expr` without the invisible groups around `macro_rules!` fragments.
pub(crate) fn peel_expr(expr: Expr) -> Expr {
    match expr {
        Expr::Group(group) => peel_expr(*group.expr),
        other => other,
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
        Expr::Group(group) => as_lit_str(&group.expr),
        Expr::Lit(ExprLit {
            attrs,
            lit: Lit::Str(lit),
        }) if attrs.is_empty() => Some(lit),
        _ => None,
    }
}

/// `value` as a string literal, or an error saying the option takes one (`example` shows it).
pub(crate) fn string_lit(
    name: &str,
    example: &str,
    value: &Expr,
    errors: &mut Errors,
) -> Option<LitStr> {
    let lit = as_lit_str(value).cloned();
    if lit.is_none() {
        errors.spanned(
            value,
            format!("`{name}` takes a string literal, e.g. `{example}`"),
        );
    }
    lit
}

/// A path given bare (`machine = orders::OrderStatus`) or in a string (`crate = "::idem"`).
pub(crate) fn path_value(value: &Expr) -> Option<Path> {
    match value {
        Expr::Group(group) => path_value(&group.expr),
        Expr::Path(path) if path.qself.is_none() && path.attrs.is_empty() => {
            Some(path.path.clone())
        }
        _ => as_lit_str(value).and_then(|lit| lit.parse_with(Path::parse_mod_style).ok()),
    }
}

/// `crate = "::idem"` (or a bare path): where generated code finds idem.
pub(crate) fn crate_path(value: &Expr, errors: &mut Errors) -> Option<Path> {
    let path = path_value(value);
    if path.is_none() {
        errors.spanned(
            value,
            "`crate` takes the path at which idem is reachable, e.g. `crate = \"::idem\"` or `crate = \"my_app::idem\"`",
        );
    }
    path
}

/// A name given bare (`tx = tx`) or in a string (`tx = "tx"`). From a string, the ident carries the
/// literal's span, so errors about it land on the literal.
pub(crate) fn ident_value(value: &Expr) -> Option<Ident> {
    match path_value(value) {
        Some(path) if path.leading_colon.is_none() => path.get_ident().cloned(),
        _ => None,
    }
}

/// `key` / `fingerprint` / `set(col = …)` / `version`: a string holding an expression, or a bare
/// expression. `name` names the option and `example` shows it written (`key = "req.order_no"`).
pub(crate) fn expr_arg(
    name: &str,
    example: &str,
    value: Expr,
    errors: &mut Errors,
) -> Option<ExprArg> {
    let value = peel_expr(value);
    let Some(lit) = as_lit_str(&value).cloned() else {
        return Some(ExprArg::bare(value));
    };
    if lit.value().trim().is_empty() {
        errors.at(
            lit.span(),
            format!("`{name}` is empty; write an expression over the parameters, e.g. `{example}`"),
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
                format!("`{name}` is not a Rust expression ({error}); write e.g. `{example}`"),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::{Delimiter, Group};
    use quote::quote;

    /// `tokens` as `macro_rules!` passes a fragment on: inside an invisible group.
    fn fragment(tokens: TokenStream) -> Expr {
        let group = Group::new(Delimiter::None, tokens);
        syn::parse2(quote!(#group)).expect("an expression")
    }

    #[test]
    fn reads_values_through_invisible_groups() {
        assert_eq!(as_lit_str(&fragment(quote!("PAY"))).unwrap().value(), "PAY");
        let path = path_value(&fragment(quote!(crate::orders::OrderStatus))).unwrap();
        assert_eq!(diag::path_to_string(&path), "crate::orders::OrderStatus");
        assert_eq!(ident_value(&fragment(quote!("tx"))).unwrap(), "tx");
        assert!(ident_value(&fragment(quote!(::tx))).is_none());

        let mut errors = Errors::default();
        let key = expr_arg("key", "key = \"id\"", fragment(quote!("id")), &mut errors).unwrap();
        assert!(key.lit.is_some());
        let key = key.expr;
        assert_eq!(quote!(#key).to_string(), "id");
        let key = expr_arg("key", "", fragment(quote!((a, b))), &mut errors).unwrap();
        assert!(matches!(key.expr, Expr::Tuple(_)));
        assert!(errors.finish().is_ok());
    }
}
