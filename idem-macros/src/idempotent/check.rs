//! Checks of the attribute against the fn it is on: the signature (async, returns `Result`), and the
//! expressions of `key`, `fingerprint` and `tx` against the fn's parameters.
//!
//! The output is a [`Spec`]: everything code generation needs, with no `Option` left to unwrap.

use proc_macro2::Span;
use syn::{Expr, Ident, ItemFn, LitStr, Path};

use super::args::{self, HeartbeatArg, IdempotentArgs, InProgress};
use crate::common::diag::{self, Errors};
use crate::common::expr_arg::ExprArg;
use crate::common::key_scan::{Role, check_expr_arg};
use crate::common::signature::{
    AsyncNeed, ResultShape, ReturnNeed, check_async, check_return, parameters,
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
    pub(crate) lease_ms: u64,
    pub(crate) fingerprint: Option<Expr>,
    /// `on_in_progress = "wait(..)"`, in milliseconds, with the literal's span.
    pub(crate) wait: Option<(u64, Span)>,
    /// `heartbeat = "…"`, in milliseconds (`None` for `"off"`), with the literal's span.
    pub(crate) heartbeat: Option<(Option<u64>, Span)>,
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
        lease,
        fingerprint,
        on_in_progress,
        tx,
        heartbeat,
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
        check_tx(tx, &params, &fn_name, &mut errors);
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
            ttl_ms: ttl.map_or(args::DEFAULT_TTL_MS, |ttl| ttl.millis),
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

/// `tx = "tx"` must name a parameter.
fn check_tx(tx: &Ident, params: &[String], fn_name: &str, errors: &mut Errors) {
    let name = tx.to_string();
    if params.contains(&name) {
        return;
    }
    let names = params.iter().map(String::as_str);
    let message = if params.is_empty() {
        format!(
            "`tx` names `{name}`, but `{fn_name}` has no parameters; add the transaction as a parameter, \
             e.g. `{name}: &mut sqlx::Transaction<'_, sqlx::Sqlite>`"
        )
    } else {
        format!(
            "`tx` names `{name}`, which is not a parameter of `{fn_name}`{} the parameters are {}; name \
             the `&mut` transaction or connection parameter",
            diag::did_you_mean_clause(&name, names.clone()),
            diag::backticked(names),
        )
    };
    errors.at(tx.span(), message);
}
