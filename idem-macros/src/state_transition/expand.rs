//! Code generation for `#[state_transition]`: the checks against the machine (handed to the machine's
//! own macro), the SQL (built at compile time from the machine's consts), and the fn's new body,
//! which runs the update and the user's body in one transaction through `<idem>::__private`.
//!
//! Every call into the runtime's transition support is in [`expand`]'s `core` and `run` blocks.

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

/// `::idem`, or the `crate = "…"` path.
fn crate_path(krate: Option<&Path>) -> TokenStream {
    match krate {
        Some(path) => quote!(#path),
        None => quote!(::idem),
    }
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

/// A `.bind(&(expr))`, spanned at the expression as written.
fn bind(value: &ExprArg) -> TokenStream {
    let expr = value.emitted();
    quote_spanned!(value.span()=> .bind(&(#expr)))
}

pub(super) fn expand(item: &ItemFn, spec: &Spec) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
        ..
    } = item;
    let (outer_attrs, inner_attrs) = body::outer_and_inner(attrs);
    let stmts = &block.stmts;
    let args = &spec.args;
    let krate = crate_path(args.krate.as_ref());
    let private = quote!(#krate::__private);
    let machine = &spec.machine;
    let machine_check = machine_check(spec, &krate);
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

    let set_binds = args.set.iter().map(|s| bind(&s.value));
    let match_binds = args.matches.iter().filter_map(|column| {
        args.set
            .iter()
            .find(|s| s.column == *column)
            .map(|s| bind(&s.value))
    });
    let key_bind = bind(&spec.key);
    let key_bind_again = key_bind.clone();
    let version_let = args.version.as_ref().map(|version| {
        let expr = version.emitted();
        let name = body::binding("__idem_version");
        quote_spanned!(version.span()=> let #name: i64 = #expr;)
    });
    let version_bind = versioned.then(|| quote!(.bind(__idem_version)));
    let expected_version = if versioned {
        quote!(::core::option::Option::Some(__idem_version))
    } else {
        quote!(::core::option::Option::None)
    };

    let (conn, tx_check) = match &spec.tx {
        Some(tx) => (
            quote_spanned!(tx.span()=> #private::transition_conn(&mut *#tx)),
            Some(quote_spanned!(tx.span()=> let _ = #private::transition_conn(&mut *#tx);)),
        ),
        None => (quote!(#private::transition_conn(&mut __idem_tx)), None),
    };
    // The body returns `Result<T, E>`; `E` is the fn's error type, or for an alias
    // (`anyhow::Result<Transition<T, M>>`) the one the type checker finds through the return type.
    let TransitionReturn {
        ret_ty,
        ok_ty,
        err_ty,
        ..
    } = &spec.ret;
    let (err_ty, err_span) = match err_ty {
        Some(err_ty) => (quote!(#err_ty), err_ty.span()),
        None => {
            let span = ret_ty.span();
            let is_result = located_at(quote!(#private::IsResult), span);
            (quote_spanned!(span=> <#ret_ty as #is_result>::Err), span)
        }
    };
    let body_ty = quote!(::core::result::Result<#ok_ty, #err_ty>);
    let fake_return = body::fake_return(&body_ty, ret_ty.span());
    let err_check = {
        let private = located_at(private.clone(), err_span);
        let name = body::binding("__idem_err");
        quote_spanned!(err_span=> let #name = <#err_ty as #private::CarriesIdemError>::proof();)
    };

    let core = quote! {
        async {
            if let ::core::result::Result::Err(e) = #private::transition_savepoint(#conn).await {
                return ::core::result::Result::Err(__idem_err.from_idem(e));
            }
            let __idem_rows = #private::transition_rows(
                #private::transition_query(__idem_sql.update.as_str())
                    .bind(#to)
                    #(#set_binds)*
                    #key_bind
                    #(.bind(#from))*
                    #version_bind
                    .execute(#conn)
                    .await,
            );
            match __idem_rows {
                ::core::result::Result::Ok(1) => {
                    // The row moved: run the body in the same transaction; its `Err` undoes the move.
                    let __idem_out: #body_ty = async {
                        #fake_return
                        #(#stmts)*
                    }
                    .await;
                    return match __idem_out {
                        ::core::result::Result::Ok(value) => match #private::transition_release(#conn).await {
                            ::core::result::Result::Ok(()) => ::core::result::Result::Ok(#krate::Transition::Applied(value)),
                            ::core::result::Result::Err(e) => ::core::result::Result::Err(__idem_err.from_idem(e)),
                        },
                        ::core::result::Result::Err(error) => {
                            // The body's error is what the caller needs; a failed rollback-to-savepoint
                            // also fails the enclosing transaction's commit.
                            let _ = #private::transition_abort(#conn).await;
                            ::core::result::Result::Err(error)
                        }
                    };
                }
                ::core::result::Result::Ok(0) => {}
                ::core::result::Result::Ok(rows) => {
                    let _ = #private::transition_abort(#conn).await;
                    return ::core::result::Result::Err(__idem_err.from_idem(#krate::IdemError::store(
                        ::std::format!("the key matched {rows} rows; the machine's key column must be unique"),
                    )));
                }
                ::core::result::Result::Err(e) => {
                    let _ = #private::transition_abort(#conn).await;
                    return ::core::result::Result::Err(__idem_err.from_idem(e));
                }
            }
            // No row moved: read it (under the transaction's write lock) to tell why.
            let __idem_row = #private::transition_query(__idem_sql.read.as_str())
                .bind(#to)
                #(#match_binds)*
                #key_bind_again
                .fetch_optional(#conn)
                .await;
            let __idem_outcome = #private::transition_outcome::<#ok_ty, #machine_alias>(
                __idem_row,
                &[#(#from),*],
                #expected_version,
            );
            if let ::core::result::Result::Err(e) = #private::transition_release(#conn).await {
                return ::core::result::Result::Err(__idem_err.from_idem(e));
            }
            __idem_outcome.map_err(|e| __idem_err.from_idem(e))
        }
    };

    let run = match &spec.store {
        None => quote!(#core.await),
        Some(store) => quote! {
            let mut __idem_tx = match #private::transition_begin(#store).await {
                ::core::result::Result::Ok(tx) => tx,
                ::core::result::Result::Err(e) => return ::core::result::Result::Err(__idem_err.from_idem(e)),
            };
            let __idem_result = #core.await;
            match __idem_result {
                ::core::result::Result::Ok(outcome) => match #private::transition_commit(__idem_tx).await {
                    ::core::result::Result::Ok(()) => ::core::result::Result::Ok(outcome),
                    ::core::result::Result::Err(e) => ::core::result::Result::Err(__idem_err.from_idem(e)),
                },
                ::core::result::Result::Err(error) => {
                    let _ = #private::transition_rollback(__idem_tx).await;
                    ::core::result::Result::Err(error)
                }
            }
        },
    };

    let docs = docs(spec);
    let sql_static = format_ident!("__IDEM_SQL");
    quote! {
        #(#outer_attrs)*
        #(#[doc = #docs])*
        #vis #sig {
            #(#inner_attrs)*
            #private::require_sqlite!();
            #machine_check
            #tx_check
            #err_check
            #version_let
            // Built at compile time from the machine's table and columns, one string per dialect; the
            // SQLite one runs (the only backend wired today).
            static #sql_static: #krate::TransitionSql = #krate::TransitionSql::build::<#machine_alias>(
                &#private::TransitionShape {
                    set: &[#(#set_columns),*],
                    now: #now,
                    matches: &[#(#match_columns),*],
                    from_count: #from_count,
                    versioned: #versioned,
                },
            );
            let __idem_sql = &#sql_static.sqlite;
            #run
        }
    }
}
