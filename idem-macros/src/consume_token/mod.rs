//! `#[consume_token]`: parse (`args.rs`) → check against the fn (`check.rs`) → generate (`expand.rs`),
//! with a fallback on error (`common::body::fn_attribute`): a bad attribute emits the fn as written
//! plus only the real errors.
//!
//! Everything but the option list is a shared part: the `token` and `subject` expressions go through
//! the key scanner, `store` is `common::store_arg` with the token stores' traits, the signature and
//! `From<IdemError>` checks and the body's wrapping are `#[idempotent]`'s own.

use proc_macro2::TokenStream;

mod args;
mod check;
mod expand;

use args::ConsumeTokenArgs;

use crate::common::body;

/// `#[consume_token(args)] item`.
pub(crate) fn consume_token(args: TokenStream, item: TokenStream) -> TokenStream {
    body::fn_attribute(
        "#[consume_token]",
        args,
        item,
        |args: &mut ConsumeTokenArgs| &mut args.errors,
        |args, item_fn| {
            let spec = check::check(args, item_fn)?;
            Ok(expand::expand(item_fn, &spec))
        },
    )
}
