//! Checks of `#[state_transition]`'s options against the fn: the signature, the transaction, the key,
//! and the expressions of `key`, `set` and `version`.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{FnArg, GenericArgument, Ident, ItemFn, LitStr, Pat, PathArguments, Type};

use super::args::{Args, EXAMPLE, ExprArg, StateName};
use crate::common::diag::{self, Errors};

/// The checked attribute.
pub(super) struct Spec {
    pub(super) args: Args,
    pub(super) from: Vec<StateName>,
    pub(super) to: StateName,
    /// `Some(param)` in tx mode, else the store name.
    pub(super) tx: Option<Ident>,
    pub(super) store: Option<LitStr>,
    /// The key expression, and whether it was defaulted to the first parameter (checked against the
    /// machine's key column at compile time).
    pub(super) key: ExprArg,
    pub(super) key_defaulted: Option<String>,
    pub(super) ok_ty: Type,
    pub(super) err_ty: Type,
}

/// Parameter names, in order (`self` for a receiver).
pub(super) fn parameters(item: &ItemFn) -> Vec<String> {
    crate::common::signature::parameters(&item.sig)
}

/// Lowercase single-name paths in `expr` that are no parameter.
pub(super) struct UnknownNames<'a> {
    params: &'a [String],
    found: Vec<Ident>,
}

impl<'ast> Visit<'ast> for UnknownNames<'_> {
    fn visit_expr_path(&mut self, node: &'ast syn::ExprPath) {
        if node.qself.is_none()
            && let Some(ident) = node.path.get_ident()
        {
            let name = ident.to_string();
            if name.starts_with(|c: char| c.is_lowercase() || c == '_')
                && !self.params.contains(&name)
            {
                self.found.push(ident.clone());
            }
        }
        syn::visit::visit_expr_path(self, node);
    }
}

pub(super) fn check_expr(arg: &ExprArg, option: &str, params: &[String], errors: &mut Errors) {
    let mut visitor = UnknownNames {
        params,
        found: Vec::new(),
    };
    visitor.visit_expr(&arg.expr);
    for ident in visitor.found {
        let name = ident.to_string();
        let did_you_mean = diag::did_you_mean_clause(&name, params.iter().map(String::as_str));
        errors.at(
            arg.span,
            format!(
                "`{option}` uses `{name}`, which is no parameter of the fn{did_you_mean} the \
                 parameters are {}; add the parameter or fix the name",
                diag::backticked(params.iter().map(String::as_str))
            ),
        );
    }
}

pub(super) fn check(mut args: Args, item: &ItemFn) -> syn::Result<Spec> {
    let mut errors = std::mem::take(&mut args.errors);
    let attr_span = Span::call_site();
    let params = parameters(item);

    if item.sig.asyncness.is_none() {
        errors.spanned(
            item.sig.fn_token,
            "`#[state_transition]` needs an `async fn`: it awaits the database; add `async`",
        );
    }
    if args.from.is_empty() && !args.seen.iter().any(|s| s == "from") {
        errors.at(
            attr_span,
            format!("`#[state_transition]` is missing `from`, e.g. `{EXAMPLE}`"),
        );
    }
    if args.to.is_none() && !args.seen.iter().any(|s| s == "to") {
        errors.at(
            attr_span,
            format!("`#[state_transition]` is missing `to`, e.g. `{EXAMPLE}`"),
        );
    }
    if let Some(to) = &args.to {
        for from in &args.from {
            if from.name == to.name {
                errors.spanned(
                    &from.lit,
                    format!(
                        "`from` and `to` are both `{}`: a transition must change the state; a repeat \
                         of `{}` is already recognised as `Transition::AlreadyApplied`, so remove \
                         `{}` from `from`",
                        to.name, to.name, to.name
                    ),
                );
            }
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

    // Where the update runs.
    let tx = match (&args.tx, &args.store) {
        (Some(_), Some(store)) => {
            errors.spanned(
                store,
                "give `tx = \"…\"` (the caller's transaction) or `store = \"…\"` (a transaction of \
                 its own), not both; remove one",
            );
            None
        }
        (Some(tx), None) => {
            let name = tx.value();
            if params.contains(&name) {
                Some(Ident::new(&name, tx.span()))
            } else {
                errors.spanned(
                    tx,
                    format!(
                        "`tx = \"{name}\"` names no parameter; the parameters are {}; add a \
                         `{name}: &mut sqlx::Transaction<'_, Sqlite>` parameter",
                        diag::backticked(params.iter().map(String::as_str))
                    ),
                );
                None
            }
        }
        (None, Some(_)) => None,
        // The short form: a parameter named `tx` is the transaction.
        (None, None) if params.iter().any(|p| p == "tx") => {
            Some(Ident::new("tx", Span::call_site()))
        }
        (None, None) => {
            errors.at(
                attr_span,
                "`#[state_transition]` needs a transaction: a `tx: &mut sqlx::Transaction<'_, Sqlite>` \
                 parameter (or `tx = \"name\"`), or `store = \"sqlite\"` to begin one on a registered \
                 store",
            );
            None
        }
    };

    // The key: given, or the first parameter that is not the transaction (named like the key column).
    let tx_name = tx.as_ref().map(Ident::to_string);
    let (key, key_defaulted) = match &args.key {
        Some(key) => {
            check_expr(key, "key", &params, &mut errors);
            (Some(key.clone()), None)
        }
        None => {
            let first = item.sig.inputs.iter().find_map(|input| match input {
                FnArg::Typed(typed) => match &*typed.pat {
                    Pat::Ident(pat) if Some(pat.ident.to_string()) != tx_name => {
                        Some(pat.ident.clone())
                    }
                    _ => None,
                },
                FnArg::Receiver(_) => None,
            });
            match first {
                Some(ident) => (
                    Some(ExprArg {
                        span: ident.span(),
                        expr: syn::parse_quote!(#ident),
                    }),
                    Some(ident.to_string()),
                ),
                None => {
                    errors.at(
                        attr_span,
                        "`#[state_transition]` needs the row's key: add a parameter named like the \
                         machine's key column, or `key = \"req.order_no\"`",
                    );
                    (None, None)
                }
            }
        }
    };
    for set in &args.set {
        check_expr(
            &set.value,
            &format!("set({} = …)", set.column),
            &params,
            &mut errors,
        );
    }
    if let Some(version) = &args.version {
        check_expr(version, "version", &params, &mut errors);
    }

    let types = transition_types(&item.sig.output);
    if types.is_none() {
        let span = match &item.sig.output {
            syn::ReturnType::Type(_, ty) => ty.span(),
            syn::ReturnType::Default => item.sig.ident.span(),
        };
        errors.at(
            span,
            "`#[state_transition]` needs a fn returning `Result<idem::Transition<T, Machine>, E>`; \
             its body returns `Result<T, E>` and runs only when the row moved",
        );
    }
    errors.finish()?;
    let (ok_ty, err_ty) = types.expect("checked above");
    Ok(Spec {
        from: args.from.clone(),
        to: args.to.clone().expect("checked above"),
        tx,
        store: args.store.clone(),
        key: key.expect("checked above"),
        key_defaulted,
        ok_ty,
        err_ty,
        args,
    })
}

/// `(T, E)` of `…Result<…Transition<T, S>, E>`.
pub(super) fn transition_types(output: &syn::ReturnType) -> Option<(Type, Type)> {
    let syn::ReturnType::Type(_, ty) = output else {
        return None;
    };
    let args = |ty: &Type, name: &str| -> Option<Vec<Type>> {
        let Type::Path(path) = ty else { return None };
        let last = path.path.segments.last()?;
        if last.ident != name {
            return None;
        }
        let PathArguments::AngleBracketed(args) = &last.arguments else {
            return None;
        };
        Some(
            args.args
                .iter()
                .filter_map(|arg| match arg {
                    GenericArgument::Type(ty) => Some(ty.clone()),
                    _ => None,
                })
                .collect(),
        )
    };
    let result = args(ty, "Result")?;
    let [transition, err] = result.as_slice() else {
        return None;
    };
    let inner = args(transition, "Transition")?;
    let [ok, _machine] = inner.as_slice() else {
        return None;
    };
    Some((ok.clone(), err.clone()))
}
