//! Code generation for `#[state_transition]`.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, ItemFn};

use super::args::ExprArg;
use super::check::{Spec, transition_types};
use super::docs::docs;

/// The fn as written, for callers, when the attribute is wrong. Its body returns `Result<T, E>` while
/// the fn returns `Result<Transition<T, S>, E>`, so emitting it verbatim would add a type error that is
/// not the user's: the body is kept (and type-checked) in an async block that is never run.
pub(super) fn fallback(item: TokenStream) -> TokenStream {
    let Ok(item_fn) = syn::parse2::<ItemFn>(item.clone()) else {
        return item;
    };
    let (Some((ok_ty, err_ty)), Some(_)) =
        (transition_types(&item_fn.sig.output), item_fn.sig.asyncness)
    else {
        return item;
    };
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
        ..
    } = &item_fn;
    let stmts = &block.stmts;
    let body_ty = quote!(::core::result::Result<#ok_ty, #err_ty>);
    let (outer_attrs, inner_attrs) = crate::common::body::outer_and_inner(attrs);
    quote! {
        #(#outer_attrs)*
        #vis #sig {
            #(#inner_attrs)*
            #[allow(unreachable_code, clippy::diverging_sub_expression, clippy::empty_loop, clippy::needless_return)]
            let _ = async {
                if false {
                    let __idem_fake_return: #body_ty = loop {};
                    return __idem_fake_return;
                }
                #(#stmts)*
            };
            ::core::unreachable!("`#[state_transition]` failed to expand")
        }
    }
}

pub(super) fn expand(item: &ItemFn, spec: &Spec) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
        ..
    } = item;
    let (outer_attrs, inner_attrs) = crate::common::body::outer_and_inner(attrs);
    let stmts = &block.stmts;
    let args = &spec.args;
    let krate = match &args.krate {
        Some(path) => quote!(#path),
        None => quote!(::idem),
    };
    let private = quote!(#krate::__private);
    let (ok_ty, err_ty) = (&spec.ok_ty, &spec.err_ty);
    let machine = match &args.machine {
        Some(path) => quote!(#path),
        // The alias `#[derive(StateMachine)]` puts in the module of the enum (see there).
        None => quote!(__IdemMachine),
    };
    let to = spec.to.name.as_str();
    let from: Vec<&str> = spec.from.iter().map(|f| f.name.as_str()).collect();

    // Every state name as a path to the machine's `States` const, spanned at the literal: a typo is
    // rustc's "no associated item named `PAYED`" with "an associated constant with a similar name exists".
    let name_checks = spec
        .from
        .iter()
        .chain(std::iter::once(&spec.to))
        .map(|state| {
            let span = state.lit.span();
            // Spanned at the literal itself: rustc's "similar name" help needs the token's own span.
            let marker = Ident::new(&state.name, span);
            quote_spanned!(span=> let () = <<__IdemM as #private::Machine>::States>::#marker;)
        });
    // Edges and terminal states, by const evaluation: a panic message names both states and the fix.
    let edge_checks = spec.from.iter().map(|from_state| {
        let from = from_state.name.as_str();
        let span = from_state.lit.span();
        let terminal = format!(
            "`{from}` is a terminal state of the machine: no transition leaves it, so `{from}` → `{to}` \
             can never apply; remove `{from}` from `from`, or drop `terminal` from its `#[state(…)]`"
        );
        let undeclared = format!(
            "the machine declares no transition from `{from}` to `{to}`; add `to(…)` naming the `{to}` \
             variant to the `#[state(…)]` of `{from}`, or fix `from`/`to`"
        );
        quote_spanned! {span=>
            const _: () = {
                let m = <__IdemM as #krate::StateMachine>::STATES;
                if #private::contains(m, #from) && #private::contains(m, #to) {
                    if #private::contains(<__IdemM as #krate::StateMachine>::TERMINAL, #from) {
                        ::core::panic!(#terminal);
                    }
                    if !#private::has_edge(<__IdemM as #krate::StateMachine>::EDGES, #from, #to) {
                        ::core::panic!(#undeclared);
                    }
                }
            };
        }
    });
    let key_check = spec.key_defaulted.as_ref().map(|param| {
        let message = format!(
            "without `key = \"…\"` the first parameter, `{param}`, is the row's key and must be named \
             like the machine's key column; rename it or add `key = \"{param}\"` naming the value"
        );
        quote_spanned! {spec.key.span=>
            const _: () = if !#private::str_eq(<__IdemM as #krate::StateMachine>::KEY_COLUMN, #param) {
                ::core::panic!(#message);
            };
        }
    });
    let version_check = args.version.as_ref().map(|version| {
        quote_spanned! {version.span=>
            const _: () = if <__IdemM as #krate::StateMachine>::VERSION_COLUMN.is_none() {
                ::core::panic!("`version = …` needs the machine's version column: add `version = \"version\"` to its `#[state_machine(…)]`");
            };
        }
    });

    let set_columns: Vec<String> = args.set.iter().map(|s| s.column.to_string()).collect();
    let match_columns: Vec<String> = args.matches.iter().map(Ident::to_string).collect();
    let now = match &args.now {
        Some(now) => quote!(::core::option::Option::Some(#now)),
        None => quote!(::core::option::Option::None),
    };
    let from_count = from.len();
    let versioned = args.version.is_some();

    let bind = |value: &ExprArg| {
        let expr = &value.expr;
        quote_spanned!(value.span=> .bind(&(#expr)))
    };
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
        let expr = &version.expr;
        quote_spanned!(version.span=> let __idem_version: i64 = #expr;)
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
    let body_ty = quote!(::core::result::Result<#ok_ty, #err_ty>);
    let err_check = {
        let span = err_ty.span();
        quote_spanned!(span=> let __idem_err = #private::check_err_type::<#err_ty>();)
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
                        #[allow(unreachable_code, clippy::diverging_sub_expression, clippy::empty_loop, clippy::needless_return)]
                        if false {
                            let __idem_fake_return: #body_ty = loop {};
                            return __idem_fake_return;
                        }
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
            let __idem_outcome = #private::transition_outcome::<#ok_ty, __IdemM>(
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

    let docs = docs(spec, &machine);
    let sql_static = format_ident!("__IDEM_SQL");
    quote! {
        #(#outer_attrs)*
        #(#[doc = #docs])*
        #vis #sig {
            #(#inner_attrs)*
            #private::require_sqlite!();
            type __IdemM = #machine;
            #(#name_checks)*
            #(#edge_checks)*
            #key_check
            #version_check
            #tx_check
            #err_check
            #version_let
            // Built at compile time from the machine's table and columns, one string per dialect; the
            // SQLite one runs (the only backend wired today).
            static #sql_static: #krate::TransitionSql = #krate::TransitionSql::build::<__IdemM>(
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
