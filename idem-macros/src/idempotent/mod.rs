//! `#[idempotent]`: parse (`args.rs`) → check against the fn (`check.rs`) → generate (`expand.rs`),
//! with a fallback on error (`common::body::fn_attribute`).
//!
//! On any error the user's item is emitted as written (its parameters marked used), followed by the
//! errors (as tokio-macros does): the fn still exists for callers and for rust-analyzer, so only the
//! real errors show.

use proc_macro2::TokenStream;

mod args;
mod check;
mod expand;
#[cfg(test)]
mod tests;

use args::IdempotentArgs;

use crate::common::body;

/// `#[idempotent(args)] item`.
pub(crate) fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    body::fn_attribute(
        "#[idempotent]",
        args,
        item,
        |args: &mut IdempotentArgs| &mut args.errors,
        |args, item_fn| {
            let spec = check::check(args, item_fn)?;
            Ok(expand::expand(item_fn, &spec))
        },
    )
}
