//! What every attribute does with the fn it wraps: keep its attributes, signature and body, pin the
//! body's type with a "fake return", and, when the attribute is wrong, emit the fn anyway.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::parse::Parse;
use syn::visit::Visit;
use syn::{Attribute, Item, ItemFn, Signature, TraitItemFn};

use super::diag::Errors;

/// An attribute on a fn, the whole way: parse its arguments, parse the fn, then `expand` (check and
/// generate). On any error the item is emitted as written (its parameters marked used, when it is a
/// fn), followed by every error (as tokio-macros does): the fn still exists for callers and for
/// rust-analyzer, so only the real errors show.
///
/// `errors` reaches the errors the arguments' parser recorded, so that an item that is no fn adds
/// its error to theirs.
pub(crate) fn fn_attribute<A: Parse>(
    macro_name: &str,
    args: TokenStream,
    item: TokenStream,
    errors: fn(&mut A) -> &mut Errors,
    expand: impl FnOnce(A, &ItemFn) -> syn::Result<TokenStream>,
) -> TokenStream {
    let expanded =
        syn::parse2::<A>(args).and_then(|mut args| match syn::parse2::<ItemFn>(item.clone()) {
            Ok(item_fn) => expand(args, &item_fn),
            Err(error) => {
                let errors = errors(&mut args);
                errors.push(not_a_fn(macro_name, item.clone(), error));
                Err(std::mem::take(errors)
                    .finish()
                    .expect_err("an error was just pushed"))
            }
        });
    match expanded {
        Ok(expanded) => expanded,
        Err(error) => {
            let errors = error.into_compile_error();
            let item = match syn::parse2::<ItemFn>(item.clone()) {
                Ok(item_fn) => fallback_fn(&item_fn, None),
                Err(_) => item,
            };
            quote!(#item #errors)
        }
    }
}

/// Why `item` is not something `macro_name` (`#[idempotent]`) can wrap.
fn not_a_fn(macro_name: &str, item: TokenStream, parse_error: syn::Error) -> syn::Error {
    if let Ok(method) = syn::parse2::<TraitItemFn>(item.clone())
        && method.default.is_none()
    {
        return syn::Error::new_spanned(
            &method.sig,
            format!(
                "`{macro_name}` needs a fn body to wrap; put it on the method in the `impl` block, \
                 not on the trait's declaration"
            ),
        );
    }
    if syn::parse2::<Item>(item.clone()).is_ok() {
        let first = item.into_iter().next();
        return syn::Error::new_spanned(
            first,
            format!(
                "`{macro_name}` goes on an `async fn` that returns `Result`; this item is not a fn"
            ),
        );
    }
    // Not valid Rust as syn sees it: say so rather than expand to nothing.
    syn::Error::new(
        parse_error.span(),
        format!("`{macro_name}` could not parse this fn: {parse_error}"),
    )
}

/// A fn's attributes split into outer (`#[…]`, kept on the fn) and inner (`#![…]`, kept at the top of
/// its new body).
pub(crate) fn outer_and_inner(attrs: &[Attribute]) -> (Vec<&Attribute>, Vec<&Attribute>) {
    attrs
        .iter()
        .partition(|attr| matches!(attr.style, syn::AttrStyle::Outer))
}

/// A variable of the generated code, resolved at the macro call whatever span the statement binding it
/// carries: a user's type may come from another hygiene context (a `macro_rules!` fragment), and a
/// binding spanned there would not be found by the uses.
pub(crate) fn binding(name: &str) -> syn::Ident {
    syn::Ident::new(name, Span::call_site())
}

/// A statement that never runs but pins the output of the async block it starts to `ty`, so `?` and
/// `return` in the user's body infer as they did in the fn, and a mismatch is reported at `span`, the
/// user's return type (the trick of tracing's `#[instrument]`).
pub(crate) fn fake_return(ty: &TokenStream, span: Span) -> TokenStream {
    let name = format_ident!(
        "__idem_fake_return",
        span = Span::call_site().located_at(span)
    );
    quote_spanned! {span=>
        #[allow(
            unknown_lints,
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::let_unit_value,
            clippy::let_with_type_underscore,
            clippy::needless_return,
            clippy::unreachable
        )]
        if false {
            let #name: #ty = loop {};
            return #name;
        }
    }
}

/// `let _ = &name;` for every name the parameters bind: the fallback of a bad attribute does not use
/// the parameters the generated code would have used (the transaction, the key), and must not add
/// "unused variable" warnings to the real errors.
pub(crate) fn use_parameters(sig: &Signature) -> TokenStream {
    struct Names(Vec<syn::Ident>);
    impl<'ast> Visit<'ast> for Names {
        fn visit_pat_ident(&mut self, node: &'ast syn::PatIdent) {
            self.0.push(node.ident.clone());
            syn::visit::visit_pat_ident(self, node);
        }
    }
    let mut names = Names(Vec::new());
    let mut receiver = None;
    for input in &sig.inputs {
        match input {
            syn::FnArg::Receiver(this) => receiver = Some(this.self_token),
            syn::FnArg::Typed(typed) => names.visit_pat(&typed.pat),
        }
    }
    let receiver = receiver.map(|this| quote!(let _ = &#this;));
    let names = names.0.iter().map(|name| quote!(let _ = &#name;));
    quote!(#receiver #(#names)*)
}

/// The fn of a bad attribute, for callers and rust-analyzer: as written, with its parameters marked
/// used, and with `body` instead of its statements when given (a body adapted to the signature).
pub(crate) fn fallback_fn(item: &ItemFn, body: Option<TokenStream>) -> TokenStream {
    let used = use_parameters(&item.sig);
    let body = body.unwrap_or_else(|| {
        let stmts = &item.block.stmts;
        quote!(#(#stmts)*)
    });
    rewrap(item, TokenStream::new(), quote!(#used #body))
}

/// The fn with its attributes, visibility and signature kept, `extra_attrs` after its own outer
/// attributes, and `body` after its inner attributes (`#![…]` stay first in the block).
pub(crate) fn rewrap(item: &ItemFn, extra_attrs: TokenStream, body: TokenStream) -> TokenStream {
    let ItemFn {
        attrs, vis, sig, ..
    } = item;
    let (outer_attrs, inner_attrs) = outer_and_inner(attrs);
    quote! {
        #(#outer_attrs)*
        #extra_attrs
        #vis #sig {
            #(#inner_attrs)*
            #body
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_every_parameter_used() {
        let sig: Signature =
            syn::parse_quote!(fn pay(&self, tx: &mut Tx, (a, mut b): (u8, u8), _: u8));
        assert_eq!(
            use_parameters(&sig).to_string(),
            "let _ = & self ; let _ = & tx ; let _ = & a ; let _ = & b ;"
        );
    }

    #[test]
    fn keeps_the_fn_as_written() {
        let item: ItemFn = syn::parse_quote! {
            #[inline]
            pub fn pay(req: &Req) -> u8 { #![allow(unused)] 1 }
        };
        assert_eq!(
            fallback_fn(&item, None).to_string(),
            "# [inline] pub fn pay (req : & Req) -> u8 { # ! [allow (unused)] let _ = & req ; 1 }"
        );
    }
}
