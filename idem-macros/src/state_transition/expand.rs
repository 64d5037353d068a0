//! Code generation for `#[state_transition]`: the checks against the machine (handed to the machine's
//! own macro), the SQL (built at compile time from the machine's consts), and the fn's new body,
//! which runs the update and the user's body in one transaction through `<idem>::__private`.
//!
//! Every call into the runtime's transition support is in [`core`] and [`run`].

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, ItemFn, Path};

use super::check::{Spec, TransitionReturn, transition_types};
use super::docs::docs;
use crate::common::body;
use crate::common::diag::located_at;
use crate::common::expr_arg::ExprArg;

/// The fn of a bad attribute, for callers and rust-analyzer: its body is kept and type-checked as
/// written, and adds no warnings of its own (its parameters are marked used). The body returns
/// `Result<T, E>` while the fn returns `Result<Transition<T, M>, E>`, so it is awaited (or called)
/// and its value wrapped, `Ok(v)` as `Transition::Applied(v)`. It never runs: the crate does not
/// compile.
pub(super) fn fallback(item: &ItemFn, krate: Option<&Path>) -> TokenStream {
    let Some(ret) = transition_types(&item.sig) else {
        return body::fallback_fn(item, None);
    };
    let krate = crate_path(krate);
    let TransitionReturn { ok_ty, err_ty, .. } = &ret;
    let err_ty = match err_ty {
        Some(err_ty) => quote!(#err_ty),
        None => quote!(_),
    };
    let body_ty = quote!(::core::result::Result<#ok_ty, #err_ty>);
    let fake_return = body::fake_return(&body_ty, ret.ret_ty.span());
    let stmts = &item.block.stmts;
    let value = if item.sig.asyncness.is_some() {
        quote!(async { #fake_return #(#stmts)* }.await)
    } else {
        quote!((|| { #fake_return #(#stmts)* })())
    };
    let wrapped = quote! {
        match #value {
            ::core::result::Result::Ok(value) => {
                ::core::result::Result::Ok(#krate::Transition::Applied(value))
            }
            ::core::result::Result::Err(error) => ::core::result::Result::Err(error),
        }
    };
    body::fallback_fn(item, Some(wrapped))
}

/// idem's path in the user's crate (see [`crate_root`](crate::common::wrap::crate_root)).
fn crate_path(krate: Option<&Path>) -> TokenStream {
    crate::common::wrap::crate_root(krate)
}

/// `M! { (checker) transition { … } }`: the machine's hidden macro (see the derive) hands the
/// transition's own tokens, with the machine's description, to `check_transition!`, which reports an
/// unknown state, an undeclared transition, a move out of a terminal state, a defaulted key not named
/// like the key column and `version` without a version column, each at the user's token.
fn machine_check(spec: &Spec, krate: &TokenStream) -> TokenStream {
    let machine = &spec.machine;
    let from = spec.from.iter().map(|state| &state.lit);
    let to = &spec.to.lit;
    let key = spec
        .key_defaulted
        .as_ref()
        .map(|param| quote!(key = #param;));
    let version = spec.args.version.as_ref().map(|version| {
        let tokens = version.error_tokens();
        quote!(version = (#tokens);)
    });
    quote! {
        #machine! {
            (#krate::__macros::check_transition)
            transition {
                from = [#(#from),*];
                to = #to;
                #key
                #version
            }
        }
    }
}

/// `let <name> = &(expr);` (a temporary the expression makes lives on with the binding), and the
/// binding as `&dyn ToSqlValue`, both spanned at the expression as written: a value idem cannot
/// bind is reported there, with `ToSqlValue`'s message.
fn value(value: &ExprArg, name: &str, private: &TokenStream) -> (TokenStream, TokenStream) {
    let expr = value.emitted();
    let span = value.span();
    let to_sql = located_at(quote!(#private::ToSqlValue), span);
    let name = body::binding(name);
    (
        quote_spanned!(span=> let #name = &(#expr);),
        quote_spanned!(span=> #name as &dyn #to_sql),
    )
}

/// The expansion of a checked `#[state_transition]` fn: the checks, the transition's static
/// description, and the body that runs it.
pub(super) fn expand(item: &ItemFn, spec: &Spec) -> TokenStream {
    let krate = crate_path(spec.args.krate.as_ref());
    let private = quote!(#krate::__private);
    let machine_check = machine_check(spec, &krate);
    let (conn, tx_check) = connection(spec, &private);
    let (body_ty, err_check) = body_type(&spec.ret, &private);
    let version_let = spec.args.version.as_ref().map(|version| {
        let expr = version.emitted();
        let name = body::binding("__idem_version");
        quote_spanned!(version.span()=> let #name: i64 = #expr;)
    });
    let core = core(spec, &item.block.stmts, &private, &conn, &body_ty);
    let run = run(item, spec, &private, &core);

    let docs = docs(spec);
    let spec_static = format_ident!("__IDEM_TRANSITION");
    let transition = transition_static(spec, &private, &spec_static);
    body::rewrap(
        item,
        quote!(#(#[doc = #docs])*),
        quote! {
            #machine_check
            #tx_check
            #err_check
            #version_let
            #transition
            // Every call, in every mode, gets the `idem` span, the counters and the report.
            let __idem_call = #spec_static.call();
            __idem_call.run(async { #run }).await
        },
    )
}

/// `static <name>: TransitionSpec<M> = …;`: the transition, described once: its states, and its
/// statements in every dialect, built at compile time from the machine's table and columns.
fn transition_static(spec: &Spec, private: &TokenStream, name: &Ident) -> TokenStream {
    let args = &spec.args;
    let machine = &spec.machine;
    // Through `IsMachine`, spanned at the machine as the user wrote it: a type that is no machine
    // is reported there, once (every use has the same span), as "`M: StateMachine` is not satisfied".
    let machine_alias = {
        let span = machine.span();
        let is_machine = located_at(quote!(#private::IsMachine), span);
        quote_spanned!(span=> <#machine as #is_machine>::Machine)
    };
    let to = spec.to.name.as_str();
    let from: Vec<&str> = spec.from.iter().map(|f| f.name.as_str()).collect();
    let set_columns: Vec<String> = args.set.iter().map(|s| s.column.to_string()).collect();
    let match_columns: Vec<String> = args.matches.iter().map(Ident::to_string).collect();
    let now = match &args.now {
        Some(now) => quote!(::core::option::Option::Some(#now)),
        None => quote!(::core::option::Option::None),
    };
    let from_count = from.len();
    let versioned = args.version.is_some();
    quote! {
        static #name: #private::TransitionSpec<#machine_alias> = #private::TransitionSpec::new(
            #to,
            &[#(#from),*],
            #private::TransitionShape {
                set: &[#(#set_columns),*],
                now: #now,
                matches: &[#(#match_columns),*],
                from_count: #from_count,
                versioned: #versioned,
            },
        );
    }
}

/// The connection the transition runs on, and the check of the caller's: the caller's (`tx`),
/// checked at the `tx` token against `TransitionConn` (the trait every backend's transaction
/// implements), or a transaction of its own on a registered store.
fn connection(spec: &Spec, private: &TokenStream) -> (TokenStream, Option<TokenStream>) {
    match &spec.tx {
        Some(tx) => {
            // Every use is the same cast at the `tx` token: a type that is no transaction is one
            // error there (rustc reports identical diagnostics once).
            let span = tx.span();
            let conn_trait = located_at(quote!(#private::TransitionConn), span);
            (
                quote_spanned!(span=> (&mut *#tx as &mut dyn #conn_trait)),
                Some(quote_spanned!(span=> let _ = (&mut *#tx as &mut dyn #conn_trait);)),
            )
        }
        None => {
            let conn_trait = quote!(#private::TransitionConn);
            (quote!((&mut *__idem_tx as &mut dyn #conn_trait)), None)
        }
    }
}

/// The type the body returns, `Result<T, E>`, and the check of `E`
/// (`let __idem_err = <E as CarriesIdemError>::proof();`). `E` is the fn's error type, or for an
/// alias (`anyhow::Result<Transition<T, M>>`) the one the type checker finds through the return
/// type.
fn body_type(ret: &TransitionReturn, private: &TokenStream) -> (TokenStream, TokenStream) {
    let TransitionReturn {
        ret_ty,
        ok_ty,
        err_ty,
        ..
    } = ret;
    let (err_ty, err_span) = match err_ty {
        Some(err_ty) => (quote!(#err_ty), err_ty.span()),
        None => {
            let span = ret_ty.span();
            let is_result = located_at(quote!(#private::IsResult), span);
            (quote_spanned!(span=> <#ret_ty as #is_result>::Err), span)
        }
    };
    let body_ty = quote!(::core::result::Result<#ok_ty, #err_ty>);
    let err_check = {
        let private = located_at(private.clone(), err_span);
        let name = body::binding("__idem_err");
        quote_spanned!(err_span=> let #name = <#err_ty as #private::CarriesIdemError>::proof();)
    };
    (body_ty, err_check)
}

/// One runtime entry point, as an async block: the update (its SQL picked by the connection's
/// dialect), the body in the same savepoint when one row moved, and why not otherwise.
fn core(
    spec: &Spec,
    stmts: &[syn::Stmt],
    private: &TokenStream,
    conn: &TokenStream,
    body_ty: &TokenStream,
) -> TokenStream {
    let args = &spec.args;
    let (set_lets, set_values): (Vec<_>, Vec<_>) = args
        .set
        .iter()
        .enumerate()
        .map(|(i, s)| value(&s.value, &format!("__idem_set{i}"), private))
        .unzip();
    let (key_let, key_value) = value(&spec.key, "__idem_key", private);
    let expected_version = if args.version.is_some() {
        quote!(::core::option::Option::Some(__idem_version))
    } else {
        quote!(::core::option::Option::None)
    };
    let fake_return = body::fake_return(body_ty, spec.ret.ret_ty.span());
    quote! {
        async {
            #key_let
            #(#set_lets)*
            // Converted before the first await: the future holds plain values only.
            let __idem_values = #private::TransitionValues::new(#key_value, &[#(#set_values),*]);
            let __idem_guard = match __idem_call
                .start(#conn, __idem_values, #expected_version)
                .await
            {
                ::core::result::Result::Ok(#private::TransitionStep::Apply(guard)) => guard,
                ::core::result::Result::Ok(#private::TransitionStep::Done(done)) => {
                    return ::core::result::Result::Ok(done.into_transition());
                }
                ::core::result::Result::Err(e) => {
                    return ::core::result::Result::Err(__idem_err.from_idem(e));
                }
            };
            // The row moved: run the body in the same transaction; its `Err` undoes the move.
            let __idem_out: #body_ty = async {
                #fake_return
                #(#stmts)*
            }
            .await;
            __idem_call.finish(__idem_guard, #conn, __idem_err, __idem_out).await
        }
    }
}

/// `core` run on the caller's transaction, or in a transaction of its own begun on the store.
fn run(item: &ItemFn, spec: &Spec, private: &TokenStream, core: &TokenStream) -> TokenStream {
    match &spec.store {
        None => quote!(#core.await),
        Some(store) => {
            let by = format!("#[state_transition] {}", item.sig.ident);
            let used = crate::common::store_arg::store_use(store, false, &by, private);
            quote! {
            #used
            let mut __idem_tx = match __idem_call.begin(#private::StoreArg::Named(#store)).await {
                ::core::result::Result::Ok(tx) => tx,
                ::core::result::Result::Err(e) => {
                    return ::core::result::Result::Err(__idem_err.from_idem(e));
                }
            };
            let __idem_result = #core.await;
            __idem_call.end(__idem_tx, __idem_err, __idem_result).await
            }
        }
    }
}
