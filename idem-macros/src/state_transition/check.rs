//! Checks of `#[state_transition]`'s options against the fn: the signature and its return type (which
//! names the machine), where the update runs, the key, and the expressions of `key`, `set` and
//! `version` (through the key scanner every macro shares).
//!
//! What only the machine knows (its states, transitions, key and version columns) is checked later,
//! by the machine's own macro (see `expand.rs`).

use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, LitStr, Pat, Path, ReturnType, Signature, Type};

use super::args::{Args, EXAMPLE, StateName};
use crate::common::diag::{self, Errors};
use crate::common::expr_arg::ExprArg;
use crate::common::key_scan::{Role, check_expr_arg};
use crate::common::signature::{
    AsyncNeed, ResultType, check_async, parameters, peel, result_type, type_arguments,
};

const ASYNC: AsyncNeed = AsyncNeed {
    macro_name: "#[state_transition]",
    awaits: "it awaits the database",
    run_time: "the update is run-time work",
};

/// The checked attribute: everything code generation needs.
pub(super) struct Spec {
    pub(super) args: Args,
    pub(super) from: Vec<StateName>,
    pub(super) to: StateName,
    /// The caller's transaction parameter in tx mode; `None` with `store = "…"`.
    pub(super) tx: Option<Ident>,
    pub(super) store: Option<LitStr>,
    /// The row's key as it goes into the expansion.
    pub(super) key: ExprArg,
    /// Without `key = …`, the parameter taken as the key: it must be named like the machine's key
    /// column (checked against the machine).
    pub(super) key_defaulted: Option<Ident>,
    /// The machine: `machine = …`, else the `M` of `Transition<T, M>` in the return type.
    pub(super) machine: Path,
    pub(super) ret: TransitionReturn,
}

/// `Result<Transition<T, M>, E>`, or an alias of `Result` around `Transition<T, M>`.
pub(super) struct TransitionReturn {
    pub(super) ret_ty: Type,
    /// `T`: what the body returns in `Ok`.
    pub(super) ok_ty: Type,
    /// `E` when written; `None` for an alias (`anyhow::Result<Transition<T, M>>`).
    pub(super) err_ty: Option<Type>,
    /// `M`, as written in the return type.
    pub(super) machine_ty: Type,
}

/// Checks `args` against `item`; every error found, in the order the user reads them.
pub(super) fn check(mut args: Args, item: &ItemFn) -> syn::Result<Spec> {
    let mut errors = std::mem::take(&mut args.errors);
    let params = parameters(&item.sig);
    let fn_name = item.sig.ident.to_string();

    check_async(&item.sig, &ASYNC, &mut errors);
    let missing = args.options.missing(&["from", "to"]);
    if !missing.is_empty() {
        let names = diag::backticked_and(missing.iter().copied());
        errors.push(args.options.error_at(format!(
            "`#[state_transition]` is missing {names}, e.g. `{EXAMPLE}`"
        )));
    }
    check_states(&args, &mut errors);
    for column in &args.matches {
        if !args.set.iter().any(|set| set.column == *column) {
            let name = column.to_string();
            errors.spanned(
                column,
                format!(
                    "`match({name})` compares a column the transition sets: add `set({name} = \"…\")`"
                ),
            );
        }
    }

    let tx = transaction(&args, item, &params, &mut errors);
    let (key, key_defaulted) = key(&args, item, tx.as_ref(), &mut errors);
    if let Some(key) = &key {
        check_expr_arg(key, Role::RowKey, &params, &fn_name, &mut errors);
    }
    for set in &args.set {
        let column = set.column.to_string();
        check_expr_arg(
            &set.value,
            Role::Set(&column),
            &params,
            &fn_name,
            &mut errors,
        );
    }
    if let Some(version) = &args.version {
        check_expr_arg(version, Role::Version, &params, &fn_name, &mut errors);
    }
    let ret = transition_return(&item.sig, &mut errors);
    let machine = match (&args.machine, &ret) {
        (Some(machine), _) => Some(machine.clone()),
        (None, Some(ret)) => machine_path(&ret.machine_ty, &mut errors),
        (None, None) => None,
    };
    errors.finish()?;

    match (args.to.clone(), key, machine, ret) {
        (Some(to), Some(key), Some(machine), Some(ret)) => Ok(Spec {
            from: args.from.clone(),
            to,
            tx,
            store: args.store.clone(),
            key: ExprArg::bare(key.emitted()),
            key_defaulted,
            machine,
            ret,
            args,
        }),
        // Unreachable: each missing part records an error above.
        _ => Err(syn::Error::new(
            item.sig.ident.span(),
            "internal error in `#[state_transition]`: a part is missing but no error was recorded; \
             please report it",
        )),
    }
}

/// `from` and `to` against each other (their names against the machine come later).
fn check_states(args: &Args, errors: &mut Errors) {
    if let Some(to) = &args.to {
        for from in args.from.iter().filter(|from| from.name == to.name) {
            errors.spanned(
                &from.lit,
                format!(
                    "`from` and `to` are both `{0}`: a transition must change the state; a repeat of \
                     `{0}` is already recognised as `Transition::AlreadyApplied`, so remove `{0}` from \
                     `from`",
                    to.name
                ),
            );
        }
    }
    for (i, from) in args.from.iter().enumerate() {
        if args.from[..i].iter().any(|f| f.name == from.name) {
            errors.spanned(
                &from.lit,
                format!("`{}` is listed twice in `from`; remove one", from.name),
            );
        }
    }
}

/// The caller's transaction (`tx = "…"`, or a parameter named `tx`), or `None` with `store = "…"`.
fn transaction(
    args: &Args,
    item: &ItemFn,
    params: &[String],
    errors: &mut Errors,
) -> Option<Ident> {
    match (&args.tx, &args.store) {
        (Some(_), Some(store)) => {
            errors.spanned(
                store,
                "give `tx = \"…\"` (the caller's transaction) or `store = \"…\"` (a transaction of \
                 its own), not both; remove one",
            );
            None
        }
        (Some(tx), None) => {
            let name = tx.to_string();
            if !params.contains(&name) {
                errors.at(
                    tx.span(),
                    format!(
                        "`tx = \"{name}\"` names no parameter; the parameters are {}; add a \
                         `{name}: &mut idem::SqliteTx` parameter (or `idem::MySqlTx`, `idem::PgTx`, \
                         an `idem::sqlx` transaction)",
                        diag::backticked(params.iter().map(String::as_str))
                    ),
                );
                return None;
            }
            Some(tx.clone())
        }
        (None, Some(_)) => None,
        // The short form: a parameter named `tx` is the transaction.
        (None, None) => match parameter_named(&item.sig, "tx") {
            Some(tx) => Some(tx),
            None => {
                errors.push(args.options.error_at(
                    "`#[state_transition]` needs a transaction: a `tx: &mut idem::SqliteTx` \
                     parameter (or `idem::MySqlTx`, `idem::PgTx`, an `idem::sqlx` transaction; \
                     `tx = \"name\"` for another name), or `store = \"sqlite\"` to begin one on a \
                     registered store",
                ));
                None
            }
        },
    }
}

/// The parameter bound to `name` by a plain `name: Type`.
fn parameter_named(sig: &Signature, name: &str) -> Option<Ident> {
    sig.inputs.iter().find_map(|input| match input {
        FnArg::Typed(typed) => match &*typed.pat {
            Pat::Ident(pat) if pat.ident == name => Some(pat.ident.clone()),
            _ => None,
        },
        FnArg::Receiver(_) => None,
    })
}

/// The row's key: `key = …`, or the first parameter that is not the transaction (then named like
/// the machine's key column).
fn key(
    args: &Args,
    item: &ItemFn,
    tx: Option<&Ident>,
    errors: &mut Errors,
) -> (Option<ExprArg>, Option<Ident>) {
    if let Some(key) = &args.key {
        return (Some(key.clone()), None);
    }
    let first = item.sig.inputs.iter().find_map(|input| match input {
        FnArg::Typed(typed) => match &*typed.pat {
            Pat::Ident(pat) if Some(&pat.ident) != tx => Some(pat.ident.clone()),
            _ => None,
        },
        FnArg::Receiver(_) => None,
    });
    match first {
        Some(ident) => (Some(ExprArg::bare(syn::parse_quote!(#ident))), Some(ident)),
        None => {
            errors.push(args.options.error_at(
                "`#[state_transition]` needs the row's key: add a parameter named like the \
                 machine's key column, or `key = \"req.order_no\"`",
            ));
            (None, None)
        }
    }
}

/// `Result<Transition<T, M>, E>` (or `anyhow::Result<Transition<T, M>>`, `ShopResult<Transition<T, M>>`),
/// else an error at the return type.
fn transition_return(sig: &Signature, errors: &mut Errors) -> Option<TransitionReturn> {
    let ret = transition_types(sig);
    if ret.is_none() {
        let span = match &sig.output {
            ReturnType::Type(_, ty) => ty.span(),
            ReturnType::Default => sig.ident.span(),
        };
        errors.at(
            span,
            "`#[state_transition]` needs a fn returning `Result<idem::Transition<T, Machine>, E>`; \
             its body returns `Result<T, E>` and runs only when the row moved",
        );
    }
    ret
}

/// The parts of a return type `Result<Transition<T, M>, E>` (or an alias of `Result` around
/// `Transition<T, M>`), if it is one.
pub(super) fn transition_types(sig: &Signature) -> Option<TransitionReturn> {
    let ReturnType::Type(_, ret_ty) = &sig.output else {
        return None;
    };
    let (ok, err) = match result_type(ret_ty) {
        ResultType::Named { ok, err } => (ok, err),
        ResultType::Alias { first } => (first, None),
        ResultType::NotResult => return None,
    };
    match type_arguments(ok, "Transition").as_deref() {
        Some([ok_ty, machine_ty]) => Some(TransitionReturn {
            ret_ty: (**ret_ty).clone(),
            ok_ty: (*ok_ty).clone(),
            err_ty: err.cloned(),
            machine_ty: (*machine_ty).clone(),
        }),
        _ => None,
    }
}

/// The machine's path from the `M` of `Transition<T, M>`.
fn machine_path(machine_ty: &Type, errors: &mut Errors) -> Option<Path> {
    if let Type::Path(path) = peel(machine_ty)
        && path.qself.is_none()
    {
        return Some(path.path.clone());
    }
    errors.spanned(
        machine_ty,
        "the machine of `Transition<T, Machine>` must be the path of a `#[derive(StateMachine)]` \
         enum; name it with `machine = path::to::Enum`",
    );
    None
}
