//! Code generation for `#[idempotent]`: keep the fn's attributes, visibility and signature, replace the
//! body by claim → run the original body → mark, through `<idem>::__private`.

use proc_macro2::{Delimiter, Group, Literal, Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, ItemFn};

use super::args::StoreSpec;
use super::check::Spec;
use crate::common::body;
use crate::common::diag::{self, located_at};

/// The expansion of a checked `#[idempotent]` fn.
pub(crate) fn expand(item: &ItemFn, spec: &Spec) -> TokenStream {
    let private = private_path(spec);
    let stmts = &item.block.stmts;

    // The bound checks are calls of their own, spanned at the user's types: an Ok type that cannot be
    // stored or an error type without `From<IdemError>` is reported at that type, with the runtime's
    // `#[diagnostic::on_unimplemented]` message. A type the signature does not spell out (the `Err` of
    // `anyhow::Result<T>`, both of `ShopResult<T>`) is named through the return type, and reported there.
    let ret_ty = &spec.ret.ret_ty;
    let ret_span = ret_ty.span();
    let (ok_ty, ok_span) = match &spec.ret.ok_ty {
        Some(ok_ty) => (quote!(#ok_ty), ok_ty.span()),
        None => (result_part(ret_ty, &private, "Ok"), ret_span),
    };
    let (err_ty, err_span) = match &spec.ret.err_ty {
        Some(err_ty) => (quote!(#err_ty), err_ty.span()),
        None => (result_part(ret_ty, &private, "Err"), ret_span),
    };
    let ok_check = {
        let private = located_at(private.clone(), ok_span);
        let name = body::binding("__idem_ok");
        quote_spanned!(ok_span=> let #name = <#ok_ty as #private::Storable>::proof();)
    };
    let err_check = {
        let private = located_at(private.clone(), err_span);
        let name = body::binding("__idem_err");
        quote_spanned!(err_span=> let #name = <#err_ty as #private::CarriesIdemError>::proof();)
    };
    // The checks return proofs (encoder/decoder, error conversion) that the engine calls take
    // instead of bounds of their own, so a bad type is reported once, at the type. Types named
    // through the return type are left to inference here: the engine calls are spanned elsewhere, and
    // the same projection at another span would repeat its error.
    let alias = spec.ret.ok_ty.is_none();
    let (ok_arg, err_arg) = match (&spec.ret.ok_ty, &spec.ret.err_ty) {
        (Some(ok), Some(err)) => (quote!(#ok), quote!(#err)),
        (Some(ok), None) => (quote!(#ok), quote!(_)),
        (None, _) => (quote!(_), quote!(_)),
    };

    let call = call(spec, &private);
    let (use_as_store, store_arg) = match &spec.store {
        Some(store) => store_arg(store, &private),
        None => (TokenStream::new(), TokenStream::new()),
    };
    let fake_return = body::fake_return(&quote!(#ret_ty), ret_span);
    // The user's body, as the engine takes it: an async block that yields `Result<T, E>`. For an
    // alias, the body yields the declared type and `IsResult::into_result` (the identity) makes it a
    // `Result`, so a return type that is no `Result` fails there, once, and nowhere else.
    let user_body = if alias {
        let into_result = over_tokens(ret_ty, &private, "into_result", quote!(__idem_out));
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
    };

    let body = match &spec.tx {
        None => {
            // What the engine call itself reports (outside the checks above) is shown at the return
            // type, not at the attribute.
            let run = engine_call(
                return_type_anchor(spec),
                &private,
                quote!(run::<#ok_arg, #err_arg, _>),
                quote!(#store_arg, __idem_call, __idem_ok, __idem_err, #user_body),
            );
            quote!(#run)
        }
        Some(tx) => {
            // Every use of the connection is spanned at the `tx = "…"` literal, so a parameter that is
            // not a transaction is reported there.
            let span = tx.span();
            let check_tx = {
                let private = located_at(private.clone(), span);
                quote_spanned!(span=> #private::JoinableTx::joinable(&*#tx);)
            };
            let conn = quote_spanned!(span=> &mut *#tx);
            let claim = engine_call(
                span,
                &private,
                quote!(tx_claim::<#ok_arg, _>),
                quote!(__idem_call, __idem_ok, #conn),
            );
            let finish = engine_call(
                span,
                &private,
                quote!(tx_finish::<#ok_arg, #err_arg, _>),
                quote!(__idem_guard, #conn, __idem_ok, __idem_err, __idem_out),
            );
            quote! {
                #check_tx
                // Claim, body and mark run in the call's span (outcome, attempt), like a lease-mode
                // call: the runtime reports every mode the same way.
                let __idem_span = #private::call_span(&__idem_call);
                #private::in_span(__idem_span, async {
                    // The claim row is written inside the caller's transaction: it commits or rolls
                    // back with the business writes. A repeat that finds a stored result returns it.
                    let __idem_guard = match #claim {
                        ::core::result::Result::Ok(#private::TxClaim::Run(__idem_guard)) => __idem_guard,
                        ::core::result::Result::Ok(#private::TxClaim::Replay(__idem_value)) => {
                            return ::core::result::Result::Ok(__idem_value);
                        }
                        ::core::result::Result::Err(__idem_error) => {
                            return ::core::result::Result::Err(__idem_err.from_idem(__idem_error));
                        }
                    };
                    // The original body, in a non-`move` async block: it borrows `tx` and the other
                    // parameters, so `tx` can be borrowed again below to mark the record. It runs as
                    // the holder of the claim (`idem::current_claim()`).
                    let __idem_out = #private::tx_body(&__idem_guard, #user_body).await;
                    #finish
                })
                .await
            }
        }
    };

    // An alias the type checker resolves: the engine's `Result` becomes the declared type through
    // `IsResult::from_result`, whose path covers exactly the return type's tokens, so a return type
    // that is no `Result` is reported once, with the projections above.
    let body = if alias {
        let from_result = over_tokens(ret_ty, &private, "from_result", quote!(__idem_result));
        quote! {
            let __idem_result = async { #body }.await;
            #from_result
        }
    } else {
        body
    };

    body::rewrap(
        item,
        TokenStream::new(),
        quote! {
            #use_as_store
            #ok_check
            #err_check
            let __idem_call = #call;
            #body
        },
    )
}

/// `<private>::<function>(<args>).await`, with the path, the parentheses and `.await` all at `anchor`.
///
/// An `async fn`'s bounds are checked again where its future is built and where it is awaited; those
/// errors carry the span of the call expression and of `.await`. Putting every token of them on one
/// user token shows such an error there, instead of on the whole attribute.
fn engine_call(
    anchor: Span,
    private: &TokenStream,
    function: TokenStream,
    args: TokenStream,
) -> TokenStream {
    let path = diag::respan(quote!(#private::#function), anchor);
    let mut args = Group::new(Delimiter::Parenthesis, args);
    args.set_span(anchor);
    let await_ = quote_spanned!(anchor=> .await);
    quote!(#path #args #await_)
}

/// The first token of the return type (`Result` in `-> Result<T, E>`).
fn return_type_anchor(spec: &Spec) -> Span {
    spec.ret
        .ret_ty
        .to_token_stream()
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |token| token.span())
}

/// `::idem::__private`, or `<crate = "…">::__private`.
fn private_path(spec: &Spec) -> TokenStream {
    match &spec.krate {
        Some(path) => quote!(#path::__private),
        None => quote!(::idem::__private),
    }
}

/// `Call::new(biz, &key).ttl(..).lease(..)` plus the optional parts.
fn call(spec: &Spec, private: &TokenStream) -> TokenStream {
    let biz = &spec.biz;
    let key = &spec.key;
    let ttl = Literal::u64_suffixed(spec.ttl_ms);
    let lease = Literal::u64_suffixed(spec.lease_ms);
    // The key keeps its own spans and `Call::new` takes the key's: a misspelled field or a key type
    // without `IdemKey` is reported inside the attribute, where the key was written.
    let key_span = key.span();
    let new = located_at(private.clone(), key_span);
    let key = borrow_tuple(key);
    let mut call = quote_spanned! {key_span=>
        #new::Call::new(#biz, &(#key))
    };
    call.extend(quote! {
        .ttl(::core::time::Duration::from_millis(#ttl))
        .lease(::core::time::Duration::from_millis(#lease))
    });
    if let Some(fingerprint) = &spec.fingerprint {
        // Spanned at the fingerprint: a value that is not `Serialize` is reported where it was written.
        let span = fingerprint.span();
        let fingerprint = borrow_tuple(fingerprint);
        call.extend(quote_spanned!(span=> .fingerprint(&(#fingerprint))));
    }
    if let Some((wait_ms, span)) = &spec.wait {
        let wait = Literal::u64_suffixed(*wait_ms);
        call.extend(quote_spanned!(*span=> .wait(::core::time::Duration::from_millis(#wait))));
    }
    if let Some((beat_ms, span)) = &spec.heartbeat {
        let beat = Literal::u64_suffixed(*beat_ms);
        call.extend(quote_spanned!(*span=> .heartbeat(::core::time::Duration::from_millis(#beat))));
    }
    call
}

/// A composite key `(req.user_id, req.client_req_id)` as a tuple of references, `(&(..), &(..))`:
/// building the tuple by value would move the fields out of borrowed parameters. Other expressions are
/// kept as written (they are borrowed whole).
fn borrow_tuple(expr: &Expr) -> TokenStream {
    let Expr::Tuple(tuple) = expr else {
        return expr.to_token_stream();
    };
    let elems = tuple.elems.iter().map(|elem| match elem {
        Expr::Tuple(_) => borrow_tuple(elem),
        _ => quote_spanned!(elem.span()=> &(#elem)),
    });
    // `(a,)`: a one-element tuple keeps its comma.
    quote_spanned!(expr.span()=> (#(#elems,)*))
}

/// The `StoreArg`, and the import its method call needs.
fn store_arg(store: &StoreSpec, private: &TokenStream) -> (TokenStream, TokenStream) {
    match store {
        StoreSpec::Named(name) => (TokenStream::new(), quote!(#private::StoreArg::Named(#name))),
        StoreSpec::Given(expr) => {
            // Method syntax on `&(expr)`: `AsStore` matches a store, an `Arc` of one or a
            // `dyn Store` at once; `AsStoreRef` one auto-ref later matches a reference to a store,
            // and for anything else fails with `AsStore`'s message rather than "no method found".
            // Spanned at the expression so a value that is not a store is reported there.
            let span = expr.span();
            let as_store = quote_spanned!(span=> (&(#expr)).as_idem_store());
            (
                quote!(use #private::{AsStore as _, AsStoreRef as _};),
                quote!(#private::StoreArg::Given(#as_store)),
            )
        }
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
