//! Checks of the attribute against the fn it is on: the signature (async, returns `Result`), and the
//! expressions of `key`, `fingerprint` and `tx` against the fn's parameters.
//!
//! The output is a [`Spec`]: everything code generation needs, with no `Option` left to unwrap.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, Ident, ItemFn, LitStr, Pat, Path, ReceiverKind, Signature, Type};

use super::args::{self, HeartbeatArg, IdempotentArgs, InProgress};
use crate::common::diag::{self, Errors};
use crate::common::expr_arg::ExprArg;
use crate::common::key_scan::{Role, check_expr_arg};
use crate::common::signature::{
    AsyncNeed, ResultShape, ReturnNeed, check_async, check_return, parameters, peel,
};
use crate::common::store_arg::{RECORD_STORES, StoreSpec, check_store_expr};

const ASYNC: AsyncNeed = AsyncNeed {
    macro_name: "#[idempotent]",
    awaits: "claiming the key and storing the result await the store",
    run_time: "claiming and storing the result are run-time work",
};

const RETURN: ReturnNeed = ReturnNeed {
    want: "`#[idempotent]` needs a fn that returns `Result<T, E>` where `T: Serialize + \
        DeserializeOwned` (the result is stored and replayed) and `E: From<idem::IdemError>`",
    named: "`#[idempotent]` needs a named type here: the result is stored and replayed, which an \
        `impl Trait` type cannot promise; write the concrete type",
    example: "Result<Receipt, PayError>",
};

/// Everything the expansion needs, checked.
pub(crate) struct Spec {
    pub(crate) biz: LitStr,
    pub(crate) key: Expr,
    /// `None` in transaction mode: the transaction carries its store.
    pub(crate) store: Option<StoreSpec>,
    pub(crate) ttl_ms: u64,
    /// `result_ttl = "…"`, in milliseconds, with the literal's span.
    pub(crate) result_ttl: Option<(u64, Span)>,
    pub(crate) lease_ms: u64,
    pub(crate) fingerprint: Option<Expr>,
    /// `on_in_progress = "wait(..)"`, in milliseconds, with the literal's span.
    pub(crate) wait: Option<(u64, Span)>,
    /// `heartbeat = "…"`, in milliseconds (`None` for `"off"`), with the literal's span.
    pub(crate) heartbeat: Option<(Option<u64>, Span)>,
    /// `store_timeout = "…"`, in milliseconds, with the literal's span.
    pub(crate) store_timeout: Option<(u64, Span)>,
    /// `tx_idle = "…"`, in milliseconds (`None` for `"off"`), with the literal's span.
    pub(crate) tx_idle: Option<(Option<u64>, Span)>,
    /// `recover = "…"`: the call asked before a takeover re-runs the body.
    pub(crate) recover: Option<Expr>,
    pub(crate) tx: Option<Ident>,
    /// `crate = "…"`, or `None` for `::idem`.
    pub(crate) krate: Option<Path>,
    pub(crate) ret: ResultShape,
}

/// Checks `args` against `item`; every error found, in the order the user reads them.
pub(crate) fn check(args: IdempotentArgs, item: &ItemFn) -> syn::Result<Spec> {
    let IdempotentArgs {
        biz,
        key,
        store,
        ttl,
        result_ttl,
        lease,
        fingerprint,
        on_in_progress,
        tx,
        heartbeat,
        store_timeout,
        tx_idle,
        recover,
        krate,
        mut errors,
    } = args;

    check_async(&item.sig, &ASYNC, &mut errors);
    let ret = check_return(&item.sig, &RETURN, &mut errors);
    let params = parameters(&item.sig);
    let fn_name = item.sig.ident.to_string();
    if let Some(key) = &key {
        check_expr_arg(key, Role::Key, &params, &fn_name, &mut errors);
    }
    if let Some(fingerprint) = &fingerprint {
        check_expr_arg(
            fingerprint,
            Role::Fingerprint,
            &params,
            &fn_name,
            &mut errors,
        );
    }
    if let Some(recover) = &recover {
        check_expr_arg(recover, Role::Recover, &params, &fn_name, &mut errors);
    }
    if let Some(tx) = &tx {
        check_tx(tx, &item.sig, &params, &mut errors);
        if let Some(InProgress::Wait(wait)) = &on_in_progress {
            // Waiting inside the transaction would hold its locks while the other call needs them.
            errors.at(
                wait.lit.span(),
                "`on_in_progress = \"wait(..)\"` cannot be combined with `tx`: a duplicate in a \
                 transaction already waits on the record's lock and then replays; remove `on_in_progress`",
            );
        }
    }
    if let Some(StoreSpec::Given(expr)) = &store {
        check_store_expr(expr, &params, &RECORD_STORES, &mut errors);
    }
    errors.finish()?;

    // With `tx` there is no store option (refused when given); without, it is required.
    let store = match (&tx, store) {
        (Some(_), _) => Some(None),
        (None, Some(store)) => Some(Some(store)),
        (None, None) => None,
    };
    match (biz, key, store, ret) {
        (Some(biz), Some(key), Some(store), Some(ret)) => Ok(Spec {
            biz,
            key: key.emitted(),
            store,
            heartbeat: heartbeat.map(|h| match h {
                HeartbeatArg::Every(every) => (Some(every.millis), every.lit.span()),
                HeartbeatArg::Off(lit) => (None, lit.span()),
            }),
            store_timeout: store_timeout.map(|t| (t.millis, t.lit.span())),
            tx_idle: tx_idle.map(|idle| match idle {
                HeartbeatArg::Every(every) => (Some(every.millis), every.lit.span()),
                HeartbeatArg::Off(lit) => (None, lit.span()),
            }),
            ttl_ms: ttl.map_or(args::DEFAULT_TTL_MS, |ttl| ttl.millis),
            result_ttl: result_ttl.map(|kept| (kept.millis, kept.lit.span())),
            lease_ms: lease.map_or(args::DEFAULT_LEASE_MS, |lease| lease.millis),
            fingerprint: fingerprint.as_ref().map(ExprArg::emitted),
            recover: recover.as_ref().map(ExprArg::emitted),
            wait: match on_in_progress {
                Some(InProgress::Wait(wait)) => Some((wait.millis, wait.lit.span())),
                Some(InProgress::Reject) | None => None,
            },
            tx,
            krate,
            ret,
        }),
        // Unreachable: a missing option or a bad return type always records an error above.
        _ => Err(syn::Error::new(
            item.sig.ident.span(),
            "internal error in `#[idempotent]`: an option is missing but no error was recorded; please report it",
        )),
    }
}

/// The parameter `tx` takes, for messages: a `&mut` to the transaction each SQL store's `begin()`
/// returns.
fn tx_param(name: &str) -> String {
    if name == "self" {
        return "`&mut self`".to_owned();
    }
    format!("`{name}: &mut idem::SqliteTx` (or `idem::MySqlTx`, `idem::PgTx`)")
}

/// `tx = "tx"` must name a parameter, taken by `&mut`.
fn check_tx(tx: &Ident, sig: &Signature, params: &[String], errors: &mut Errors) {
    let name = tx.to_string();
    let fn_name = sig.ident.to_string();
    if params.contains(&name) {
        check_tx_by_mut(&name, sig, errors);
        return;
    }
    let names = params.iter().map(String::as_str);
    let message = if params.is_empty() {
        format!(
            "`tx` names `{name}`, but `{fn_name}` has no parameters; add the transaction from the \
             store's `begin()` as a parameter, e.g. {}",
            tx_param(&name)
        )
    } else {
        format!(
            "`tx` names `{name}`, which is not a parameter of `{fn_name}`{} the parameters are {}; name \
             the `&mut` transaction parameter",
            diag::did_you_mean_clause(&name, names.clone()),
            diag::backticked(names),
        )
    };
    errors.at(tx.span(), message);
}

/// The `tx` parameter must be a `&mut` reference: the claim and the mark are written in the
/// transaction. Anything else (by value, `&`) is one error at the parameter, here, before the type
/// checker would report it in terms of the generated code (`*tx` on a `u64`, a `&mut` borrow
/// through a `&`). A type that is no reference syntax at all (a macro) is left to the type checker,
/// which reports a non-transaction once, at the `tx` option.
fn check_tx_by_mut(name: &str, sig: &Signature, errors: &mut Errors) {
    let taken = sig.inputs.iter().find_map(|input| match input {
        FnArg::Receiver(receiver) if name == "self" => Some(match &receiver.kind {
            ReceiverKind::Reference(_, _, Some(_)) => Taken::ByMut,
            ReceiverKind::Reference(and, ..) => Taken::Shared(and.span()),
            ReceiverKind::Typed(_, ty) => taken(ty),
            _ => Taken::ByValue(receiver.span()),
        }),
        FnArg::Typed(typed) => match &*typed.pat {
            Pat::Ident(pat) if pat.ident == name => Some(taken(&typed.ty)),
            _ => None,
        },
        FnArg::Receiver(_) => None,
    });
    match taken {
        Some(Taken::Shared(span)) => errors.at(
            span,
            format!(
                "`{name}` is a shared reference; `tx` needs a `&mut` one, as the claim and the mark \
                 are written in the transaction: write `&mut` here"
            ),
        ),
        Some(Taken::ByValue(span)) => errors.at(
            span,
            format!(
                "`{name}` is taken by value; `tx` needs a `&mut` transaction from the store's \
                 `begin()`: write {}",
                tx_param(name)
            ),
        ),
        // Bound inside a pattern (`(tx, n): (&mut SqliteTx, u8)`): left to the type checker.
        Some(Taken::ByMut) | None => {}
    }
}

/// How the `tx` parameter takes its value, by its written type.
enum Taken {
    /// `&mut T`, or a type only the type checker can judge.
    ByMut,
    /// `&T` (`&self`), at the `&`.
    Shared(Span),
    /// Anything else, at its span.
    ByValue(Span),
}

fn taken(ty: &Type) -> Taken {
    match peel(ty) {
        Type::Reference(reference) if reference.mutability.is_some() => Taken::ByMut,
        Type::Reference(reference) => Taken::Shared(reference.and_token.span()),
        Type::Macro(_) | Type::Verbatim(_) => Taken::ByMut,
        _ => Taken::ByValue(ty.span()),
    }
}
