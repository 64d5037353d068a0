//! The `store` option of the macros that reach a store at run time (`#[idempotent]`'s record stores,
//! `#[consume_token]`'s token stores): a name registered at start-up in quotes, or an expression
//! yielding a store. Parsing, the check against the parameters, and the argument the generated code
//! passes, for every kind of store in one place.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, LitStr};

use super::diag::Errors;
use super::expr_arg::as_lit_str;

/// Where a macro's store comes from.
pub(crate) enum StoreSpec {
    /// `store = "sqlite"`: a store registered under that name at start-up.
    Named(LitStr),
    /// `store = self.store`: an expression that yields a store.
    Given(Expr),
}

/// One kind of store: how messages name it, and what the generated code calls to take it.
pub(crate) struct StoreKind {
    /// "store", "token store".
    pub(crate) what: &'static str,
    /// A registered name, for examples: `sqlite`.
    pub(crate) example_name: &'static str,
    /// Expressions yielding one, for examples: `self.store`, `STORE`.
    pub(crate) example_exprs: [&'static str; 2],
    /// The runtime's argument enum, with `Named(&'static str)` and `Given(&dyn …)`: `StoreArg`.
    pub(crate) arg: &'static str,
    /// The check trait taking a store, an `Arc` of one or a `dyn` one, and its method: `AsStore`.
    pub(crate) as_trait: &'static str,
    /// The check trait taking a reference to one (one auto-ref later): `AsStoreRef`.
    pub(crate) as_ref_trait: &'static str,
    /// The method both traits have: `as_idem_store`.
    pub(crate) method: &'static str,
}

/// The stores of `#[idempotent]`: record stores.
pub(crate) const RECORD_STORES: StoreKind = StoreKind {
    what: "store",
    example_name: "sqlite",
    example_exprs: ["self.store", "STORE"],
    arg: "StoreArg",
    as_trait: "AsStore",
    as_ref_trait: "AsStoreRef",
    method: "as_idem_store",
};

/// `store = …`: a registered name (a non-empty string) or an expression yielding a store.
pub(crate) fn store(value: Expr, kind: &StoreKind, errors: &mut Errors) -> Option<StoreSpec> {
    // `as_lit_str` looks through the group of a `$store:literal`: a name, not an expression.
    match as_lit_str(&value) {
        Some(lit) if lit.value().trim().is_empty() => {
            errors.at(
                lit.span(),
                format!(
                    "`store` is empty; name a {what} registered at start-up, e.g. `store = \"{name}\"`, \
                     or pass an expression, e.g. `store = {expr}`",
                    what = kind.what,
                    name = kind.example_name,
                    expr = kind.example_exprs[0],
                ),
            );
            None
        }
        Some(lit) => Some(StoreSpec::Named(lit.clone())),
        None => Some(StoreSpec::Given(value)),
    }
}

/// `store = sqlite` (bare) where `store = "sqlite"` was meant: a lowercase name that is no parameter.
pub(crate) fn check_store_expr(
    expr: &Expr,
    params: &[String],
    kind: &StoreKind,
    errors: &mut Errors,
) {
    let Expr::Path(path) = expr else { return };
    let Some(ident) = path.path.get_ident() else {
        return;
    };
    let name = ident.to_string();
    if path.qself.is_some()
        || params.contains(&name)
        || !name.starts_with(|c: char| c.is_lowercase())
    {
        return;
    }
    let [expr, constant] = kind.example_exprs;
    errors.at(
        ident.span(),
        format!(
            "`store = {name}` names no parameter; to use the {what} registered as `{name}`, write \
             `store = \"{name}\"`; to pass a {what}, give an expression such as `store = {expr}` or \
             `store = {constant}`",
            what = kind.what,
        ),
    );
}

/// The item that tells `idem::preflight()` this attribute (`by`, e.g. `#[idempotent] pay`) uses
/// the store registered as `name` (a token store when `tokens`): collected at link time.
pub(crate) fn store_use(
    name: &LitStr,
    tokens: bool,
    by: &str,
    private: &TokenStream,
) -> TokenStream {
    quote! {
        #private::inventory::submit! {
            #private::StoreUse {
                name: #name,
                tokens: #tokens,
                by: #by,
                at: ::core::concat!(::core::file!(), ":", ::core::line!()),
            }
        }
    }
}

/// The store argument of the runtime call (`<private>::StoreArg::Named("sqlite")`), and the items
/// it needs: for a name, its [`store_use`] for preflight; for a given store, the import its method
/// call needs.
pub(crate) fn store_arg(
    store: &StoreSpec,
    kind: &StoreKind,
    by: &str,
    private: &TokenStream,
) -> (TokenStream, TokenStream) {
    let arg = format_ident!("{}", kind.arg);
    match store {
        StoreSpec::Named(name) => (
            store_use(name, kind.arg == "TokenStoreArg", by, private),
            quote!(#private::#arg::Named(#name)),
        ),
        StoreSpec::Given(expr) => {
            // Method syntax on `&(expr)`: `AsStore` matches a store, an `Arc` of one or a
            // `dyn Store` at once; `AsStoreRef` one auto-ref later matches a reference to a store,
            // and for anything else fails with `AsStore`'s message rather than "no method found".
            // Spanned at the expression so a value that is not a store is reported there.
            let span = expr.span();
            let method = syn::Ident::new(kind.method, span);
            let as_store = quote_spanned!(span=> (&(#expr)).#method());
            let (as_trait, as_ref_trait) = (
                format_ident!("{}", kind.as_trait),
                format_ident!("{}", kind.as_ref_trait),
            );
            (
                quote!(use #private::{#as_trait as _, #as_ref_trait as _};),
                quote!(#private::#arg::Given(#as_store)),
            )
        }
    }
}
