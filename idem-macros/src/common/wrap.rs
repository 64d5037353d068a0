//! Wrapping the body of a fn that returns `Result` in one runtime call: the fn's error type proved
//! to carry idem's errors, the body as the async block the runtime takes (its type pinned by a
//! fake return), an alias of `Result` resolved by the type checker, and the call itself, spanned so
//! that what rustc reports about it lands on the user's token.

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Path, Stmt};

use super::body;
use super::diag::{self, located_at};
use super::signature::ResultShape;

/// `<root>::__private`, the root as [`crate_root`] finds it.
pub(crate) fn private_path(krate: Option<&Path>) -> TokenStream {
    let root = crate_root(krate);
    quote!(#root::__private)
}

/// The path of idem in the user's crate: the `crate = "…"` path when given, else the name the
/// user's Cargo.toml gives the `idemkit` package (`foo = { package = "idemkit" }` makes it
/// `::foo`), else `::idem`, the library's own name. The manifest is read by `proc-macro-crate`;
/// when it cannot tell (no manifest, the package not among the dependencies: a re-export through
/// another crate, which is what `crate = "…"` is for) the library's name is the guess.
pub(crate) fn crate_root(krate: Option<&Path>) -> TokenStream {
    use proc_macro_crate::{FoundCrate, crate_name};
    if let Some(path) = krate {
        return quote!(#path);
    }
    match crate_name(PACKAGE) {
        // A dependency named after the package is the library under its own name; so is the
        // package itself (its examples and tests reach the library by that name too).
        Ok(FoundCrate::Name(name)) if name != PACKAGE.replace('-', "_") => {
            let ident = proc_macro2::Ident::new(&name, Span::call_site());
            quote!(::#ident)
        }
        _ => quote!(::idem),
    }
}

/// The facade's package name on crates.io (its library is `idem`).
const PACKAGE: &str = "idemkit";

/// `<private>::<function>(<args>).await`, with the path, the parentheses and `.await` all at `anchor`.
///
/// An `async fn`'s bounds are checked again where its future is built and where it is awaited; those
/// errors carry the span of the call expression and of `.await`. Putting every token of them on one
/// user token shows such an error there, instead of on the whole attribute.
pub(crate) fn engine_call(
    anchor: Span,
    private: &TokenStream,
    function: TokenStream,
    args: TokenStream,
) -> TokenStream {
    let call = engine_fn_call(anchor, private, function, args);
    let await_ = quote_spanned!(anchor=> .await);
    quote!(#call #await_)
}

/// `<private>::<function>(<args>)`, with the path and the parentheses at `anchor` (see
/// [`engine_call`]), for an engine call that is not awaited.
pub(crate) fn engine_fn_call(
    anchor: Span,
    private: &TokenStream,
    function: TokenStream,
    args: TokenStream,
) -> TokenStream {
    let path = diag::respan(quote!(#private::#function), anchor);
    let mut args = Group::new(Delimiter::Parenthesis, args);
    args.set_span(anchor);
    quote!(#path #args)
}

/// The first token of the return type (`Result` in `-> Result<T, E>`).
pub(crate) fn return_type_anchor(ret: &ResultShape) -> Span {
    ret.ret_ty
        .to_token_stream()
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |token| token.span())
}

/// Whether the `Ok` type is left to the type checker (`ShopResult<T>`, an alias of `Result`).
pub(crate) fn is_alias(ret: &ResultShape) -> bool {
    ret.ok_ty.is_none()
}

/// The `Ok` type, as written or named through the return type, and the span to report it at.
pub(crate) fn ok_type(ret: &ResultShape, private: &TokenStream) -> (TokenStream, Span) {
    match &ret.ok_ty {
        Some(ok_ty) => (quote!(#ok_ty), ok_ty.span()),
        None => (result_part(&ret.ret_ty, private, "Ok"), ret.ret_ty.span()),
    }
}

/// The error type, as written or named through the return type, and the span to report it at.
pub(crate) fn err_type(ret: &ResultShape, private: &TokenStream) -> (TokenStream, Span) {
    match &ret.err_ty {
        Some(err_ty) => (quote!(#err_ty), err_ty.span()),
        None => (result_part(&ret.ret_ty, private, "Err"), ret.ret_ty.span()),
    }
}

/// `let __idem_err = <E as CarriesIdemError>::proof();`, spanned at the user's error type: an error
/// type without `From<IdemError>` is reported there, once, with the runtime's
/// `#[diagnostic::on_unimplemented]` message. A type the signature does not spell out (the `Err` of
/// `anyhow::Result<T>`) is named through the return type, and reported there. The runtime calls
/// take the proof instead of a bound of their own, so they repeat no error.
pub(crate) fn err_check(ret: &ResultShape, private: &TokenStream) -> TokenStream {
    let (err_ty, err_span) = err_type(ret, private);
    let private = located_at(private.clone(), err_span);
    let name = body::binding("__idem_err");
    quote_spanned!(err_span=> let #name = <#err_ty as #private::CarriesIdemError>::proof();)
}

/// The `Ok` and error types as the runtime call's type arguments. Types named through the return
/// type are left to inference: the runtime call is spanned elsewhere, and the same projection at
/// another span would repeat its error.
pub(crate) fn type_args(ret: &ResultShape) -> (TokenStream, TokenStream) {
    match (&ret.ok_ty, &ret.err_ty) {
        (Some(ok), Some(err)) => (quote!(#ok), quote!(#err)),
        (Some(ok), None) => (quote!(#ok), quote!(_)),
        (None, _) => (quote!(_), quote!(_)),
    }
}

/// The user's body, as the runtime takes it: an async block that yields `Result<T, E>`, not `move`
/// (it borrows the parameters, as the fn's body did). For an alias, the body yields the declared
/// type and `IsResult::into_result` (the identity) makes it a `Result`, so a return type that is no
/// `Result` fails there, once, and nowhere else.
pub(crate) fn user_body(ret: &ResultShape, private: &TokenStream, stmts: &[Stmt]) -> TokenStream {
    let ret_ty = &ret.ret_ty;
    let fake_return = body::fake_return(&quote!(#ret_ty), ret_ty.span());
    if is_alias(ret) {
        let into_result = over_tokens(ret_ty, private, "into_result", quote!(__idem_out));
        quote! {
            async {
                let __idem_out = async {
                    #fake_return
                    #(#stmts)*
                }
                .await;
                #into_result
            }
        }
    } else {
        quote! {
            async {
                #fake_return
                #(#stmts)*
            }
        }
    }
}

/// `body` (statements ending in the runtime's `Result`) as the declared return type. For an alias
/// the type checker resolves, through `IsResult::from_result`, whose path covers exactly the return
/// type's tokens, so a return type that is no `Result` is reported once, with the projections.
pub(crate) fn declared(ret: &ResultShape, private: &TokenStream, body: TokenStream) -> TokenStream {
    if !is_alias(ret) {
        return body;
    }
    let from_result = over_tokens(&ret.ret_ty, private, "from_result", quote!(__idem_result));
    quote! {
        let __idem_result = async { #body }.await;
        #from_result
    }
}

/// `<Ret as IsResult>::item(arg)`, its first token at the return type's first token and its last at
/// the return type's last: rustc reports an unmet bound of this call at the same place as one of the
/// projections `<Ret as IsResult>::Ok`, and then only once.
fn over_tokens(
    ret_ty: &syn::Type,
    private: &TokenStream,
    item: &str,
    arg: TokenStream,
) -> TokenStream {
    let tokens = ret_ty.to_token_stream();
    let first = tokens.clone().into_iter().next().map(|t| t.span());
    let last = tokens.into_iter().last().map(|t| t.span());
    let (Some(first), Some(last)) = (first, last) else {
        let item = syn::Ident::new(item, Span::call_site());
        return quote!(<#ret_ty as #private::IsResult>::#item(#arg));
    };
    let private = located_at(private.clone(), last);
    let item = syn::Ident::new(item, last);
    let open = quote_spanned!(first=> <);
    let mut args = Group::new(Delimiter::Parenthesis, arg);
    args.set_span(last);
    let rest = quote_spanned!(last=> as #private::IsResult>::#item);
    quote!(#open #ret_ty #rest #args)
}

/// `<Ret as IsResult>::Ok`: a part of the return type the signature does not spell out, found by the
/// type checker; a return type that is no `Result` is reported once, at the return type, with the
/// runtime's message.
fn result_part(ret_ty: &syn::Type, private: &TokenStream, part: &str) -> TokenStream {
    let span = ret_ty.span();
    let private = located_at(private.clone(), span);
    let part = syn::Ident::new(part, span);
    quote_spanned!(span=> <#ret_ty as #private::IsResult>::#part)
}
