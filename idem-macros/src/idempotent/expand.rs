//! Code generation for `#[idempotent]`: keep the fn's attributes, visibility and signature, replace the
//! body by claim → run the original body → mark, through `<idem>::__private`.

use proc_macro2::{Literal, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, Ident, ItemFn};

use super::check::Spec;
use crate::common::body;
use crate::common::diag::{located_at, respan};
use crate::common::signature::ResultShape;
use crate::common::store_arg::{self, RECORD_STORES};
use crate::common::wrap;

/// The expansion of a checked `#[idempotent]` fn.
pub(crate) fn expand(item: &ItemFn, spec: &Spec) -> TokenStream {
    let private = wrap::private_path(spec.krate.as_ref());
    let ret = &spec.ret;

    // The bound checks are calls of their own, spanned at the user's types: an Ok type that cannot be
    // stored or an error type without `From<IdemError>` is reported at that type (see `wrap`). The
    // checks return proofs (encoder/decoder, error conversion) that the engine calls take instead of
    // bounds of their own, so a bad type is reported once, at the type.
    let ok_check = ok_check(ret, &private);
    let err_check = wrap::err_check(ret, &private);
    let (ok_arg, err_arg) = wrap::type_args(ret);

    let call = call(spec, &private);
    let (use_as_store, store_arg) = match &spec.store {
        Some(store) => {
            let by = format!("#[idempotent] {}", item.sig.ident);
            store_arg::store_arg(store, &RECORD_STORES, &by, &private)
        }
        None => (TokenStream::new(), TokenStream::new()),
    };
    let run = Run {
        private: &private,
        ok_arg: &ok_arg,
        err_arg: &err_arg,
        user_body: wrap::user_body(ret, &private, &item.block.stmts),
    };

    let body = match &spec.tx {
        None => lease_body(spec, &run, &store_arg),
        Some(tx) => tx_body(tx, &run),
    };

    let body = wrap::declared(ret, &private, body);

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

/// What every way of running the body shares: the runtime's path, the engine calls' type
/// arguments, and the user's body as a future.
struct Run<'a> {
    private: &'a TokenStream,
    ok_arg: &'a TokenStream,
    err_arg: &'a TokenStream,
    user_body: TokenStream,
}

/// `let __idem_ok = <Ok as Storable>::proof();`, spanned at the Ok type.
fn ok_check(ret: &ResultShape, private: &TokenStream) -> TokenStream {
    let (ok_ty, ok_span) = wrap::ok_type(ret, private);
    let private = located_at(private.clone(), ok_span);
    let name = body::binding("__idem_ok");
    quote_spanned!(ok_span=> let #name = <#ok_ty as #private::Storable>::proof();)
}

/// Lease mode: the claim first, then the body only when the claim says to run it (with the
/// recover fn asked first on a takeover, when there is one).
fn lease_body(spec: &Spec, run: &Run<'_>, store_arg: &TokenStream) -> TokenStream {
    let Run {
        private,
        ok_arg,
        err_arg,
        user_body,
    } = run;
    // What the engine call itself reports (outside the checks above) is shown at the return
    // type, not at the attribute.
    let anchor = wrap::return_type_anchor(&spec.ret);
    // The claim first, at once where the store answers at once: a replay or a refusal is
    // the answer, and the call's future is made only to run the body.
    let now = wrap::engine_fn_call(
        anchor,
        private,
        quote!(run_now::<#ok_arg, #err_arg>),
        quote!(#store_arg, &__idem_call, __idem_ok, __idem_err),
    );
    let (before, run) = match &spec.recover {
        None => {
            let run = wrap::engine_call(
                anchor,
                private,
                quote!(run_prepared::<#ok_arg, #err_arg, _>),
                quote!(__idem_prepared, __idem_call, __idem_ok, __idem_err, #user_body),
            );
            (TokenStream::new(), run)
        }
        Some(recover) => recovering(recover, run),
    };
    let run = quote! {
        match #now {
            #private::Now::Answered(__idem_answer) => __idem_answer,
            #private::Now::Run(__idem_prepared) => #run,
        }
    };
    if before.is_empty() {
        run
    } else {
        quote!({ #before #run })
    }
}

/// With a recover fn: the closure that asks it (`let __idem_recover = …;`), and the engine call
/// that takes the closure.
fn recovering(recover: &Expr, run: &Run<'_>) -> (TokenStream, TokenStream) {
    let Run {
        private,
        ok_arg,
        err_arg,
        user_body,
    } = run;
    // Spanned at the recover expression: a fn that is not async, returns another
    // type or another error is reported where `recover` was written. The call is
    // made only when the closure is, on a takeover.
    let span = recover.span();
    let check = {
        let private = located_at((*private).clone(), span);
        // The fn's types are named at `recover` too, so a mismatch is reported
        // once, there, and not again at the return type they were written in.
        let ok_arg = respan((*ok_arg).clone(), span);
        let err_arg = respan((*err_arg).clone(), span);
        quote_spanned!(span=>
            <#err_arg as #private::FromRecoverError<_>>::converted(
                <_ as #private::Recovers<#ok_arg>>::recover(#recover)
            )
        )
    };
    // Anchored at `recover` as well: rustc reports an unmet bound of the recover
    // fn again where the engine call takes the closure; at the same place it is
    // one error, not two.
    let run = wrap::engine_call(
        span,
        private,
        quote!(run_recovering::<#ok_arg, #err_arg, _, _, _>),
        quote!(__idem_prepared, __idem_call, __idem_ok, __idem_err, __idem_recover, #user_body),
    );
    let recover_fn = quote_spanned!(span=> let __idem_recover = || #check;);
    (recover_fn, run)
}

/// Transaction mode: claim, body and mark in the caller's transaction `tx`.
fn tx_body(tx: &Ident, run: &Run<'_>) -> TokenStream {
    let Run {
        private,
        ok_arg,
        err_arg,
        user_body,
    } = run;
    // The parameter is checked once, by `JoinableTx`, spanned at the `tx = "…"` literal
    // (`check` has refused one that is not taken by `&mut`). Every use of the connection is
    // spanned there too: the engine calls' `IdemTx` bounds then fail, for a type that is no
    // transaction, with the predicate the check failed with, at the same span, and rustc
    // reports them as the check's one error (see `JoinableTx`).
    let span = tx.span();
    let check_tx = {
        let private = located_at((*private).clone(), span);
        quote_spanned!(span=> #private::JoinableTx::joinable(&*#tx);)
    };
    let conn = quote_spanned!(span=> &mut *#tx);
    // The original body runs in a closure the engine hands the transaction to: its parameter
    // is the function's own `tx` (the same `&mut`, under the same name), so the body reads as
    // written, and the engine has the transaction back to mark the record when the body is
    // done. The closure takes the other parameters with it (the body is their last use). It
    // runs as the holder of the claim (`idem::steps::current_claim()`).
    let run = wrap::engine_call(
        span,
        private,
        quote!(run_tx::<#ok_arg, #err_arg, _, _, _, _>),
        quote! {
            __idem_call,
            __idem_ok,
            __idem_err,
            #conn,
            move |#tx| async move {
                let __idem_out = #user_body.await;
                (::core::option::Option::Some(#tx), __idem_out)
            }
        },
    );
    // Claim, body and mark run in the call's span (outcome, attempt), like a lease-mode
    // call: the runtime reports every mode the same way. The claim row is written inside
    // the caller's transaction: it commits or rolls back with the business writes, and a
    // repeat that finds a stored result returns it.
    quote! {
        #check_tx
        (#run).1
    }
}

/// `Call::new(biz, &key).ttl(..).lease(..)` plus the optional parts, marked checked.
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
    match &spec.heartbeat {
        Some((Some(beat_ms), span)) => {
            let beat = Literal::u64_suffixed(*beat_ms);
            call.extend(
                quote_spanned!(*span=> .heartbeat(::core::time::Duration::from_millis(#beat))),
            );
        }
        Some((None, span)) => call.extend(quote_spanned!(*span=> .no_heartbeat())),
        None => {}
    }
    if let Some((kept_ms, span)) = &spec.result_ttl {
        let kept = Literal::u64_suffixed(*kept_ms);
        call.extend(
            quote_spanned!(*span=> .result_ttl(::core::time::Duration::from_millis(#kept))),
        );
    }
    if let Some((timeout_ms, span)) = &spec.store_timeout {
        let timeout = Literal::u64_suffixed(*timeout_ms);
        call.extend(
            quote_spanned!(*span=> .store_timeout(::core::time::Duration::from_millis(#timeout))),
        );
    }
    match &spec.tx_idle {
        Some((Some(idle_ms), span)) => {
            let idle = Literal::u64_suffixed(*idle_ms);
            call.extend(
                quote_spanned!(*span=> .tx_idle_timeout(::core::time::Duration::from_millis(#idle))),
            );
        }
        Some((None, span)) => call.extend(quote_spanned!(*span=> .no_tx_idle_timeout())),
        None => {}
    }
    // Every duration above is a literal this macro checked: the call skips checking them again.
    quote!(#private::checked(#call))
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
