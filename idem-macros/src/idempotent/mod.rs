//! `#[idempotent]`: parse (`args.rs`) → check against the fn (`check.rs`) → generate (`expand.rs`),
//! with a fallback on error.
//!
//! On any error the user's item is emitted as written (its parameters marked used), followed by the
//! errors (as tokio-macros does): the fn still exists for callers and for rust-analyzer, so only the
//! real errors show.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Item, ItemFn, TraitItemFn};

mod args;
mod check;
mod expand;
#[cfg(test)]
mod tests;

use args::IdempotentArgs;

use crate::common::body;

/// `#[idempotent(args)] item`.
pub(crate) fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    match try_idempotent(args, item.clone()) {
        Ok(expanded) => expanded,
        Err(error) => {
            let errors = error.into_compile_error();
            let item = match syn::parse2::<ItemFn>(item.clone()) {
                Ok(item_fn) => body::fallback_fn(&item_fn, None),
                Err(_) => item,
            };
            quote!(#item #errors)
        }
    }
}

fn try_idempotent(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let mut args: IdempotentArgs = syn::parse2(args)?;
    let item_fn = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(item_fn) => item_fn,
        Err(error) => {
            args.errors.push(not_a_fn(item, error));
            return Err(args.errors.finish().expect_err("an error was just pushed"));
        }
    };
    let spec = check::check(args, &item_fn)?;
    Ok(expand::expand(&item_fn, &spec))
}

/// Why `item` is not something `#[idempotent]` can wrap.
fn not_a_fn(item: TokenStream, parse_error: syn::Error) -> syn::Error {
    if let Ok(method) = syn::parse2::<TraitItemFn>(item.clone())
        && method.default.is_none()
    {
        return syn::Error::new_spanned(
            &method.sig,
            "`#[idempotent]` needs a fn body to wrap; put it on the method in the `impl` block, not on \
             the trait's declaration",
        );
    }
    if syn::parse2::<Item>(item.clone()).is_ok() {
        let first = item.into_iter().next();
        return syn::Error::new_spanned(
            first,
            "`#[idempotent]` goes on an `async fn` that returns `Result`; this item is not a fn",
        );
    }
    // Not valid Rust as syn sees it: say so rather than expand to nothing idempotent.
    syn::Error::new(
        parse_error.span(),
        format!("`#[idempotent]` could not parse this fn: {parse_error}"),
    )
}
