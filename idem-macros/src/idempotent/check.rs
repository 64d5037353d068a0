//! Checks of the attribute against the fn it is on: the signature (async, returns `Result`), and the
//! expressions of `key`, `fingerprint` and `tx` against the fn's parameters.
//!
//! The output is a [`Spec`]: everything code generation needs, with no `Option` left to unwrap.

use proc_macro2::Span;
use syn::{Expr, Ident, ItemFn, LitStr, Path, ReturnType, Signature, Type};

use super::args::{self, IdempotentArgs, InProgress, StoreSpec};
use crate::common::diag::{self, Errors};
use crate::common::expr_arg::ExprArg;
use crate::common::key_scan::{Role, check_expr_arg};
use crate::common::signature::{AsyncNeed, ResultType, check_async, parameters, peel, result_type};

const ASYNC: AsyncNeed = AsyncNeed {
    macro_name: "#[idempotent]",
    awaits: "claiming the key and storing the result await the store",
    run_time: "claiming and storing the result are run-time work",
};

/// Everything the expansion needs, checked.
pub(crate) struct Spec {
    pub(crate) biz: LitStr,
    pub(crate) key: Expr,
    pub(crate) store: StoreSpec,
    pub(crate) ttl_ms: u64,
    pub(crate) lease_ms: u64,
    pub(crate) fingerprint: Option<Expr>,
    /// `on_in_progress = "wait(..)"`, in milliseconds, with the literal's span.
    pub(crate) wait: Option<(u64, Span)>,
    pub(crate) tx: Option<Ident>,
    /// `crate = "…"`, or `None` for `::idem`.
    pub(crate) krate: Option<Path>,
    pub(crate) ret: ResultShape,
}

/// The fn's return type: `Result<T, E>`, or an alias whose `Ok` / `Err` types the type checker finds.
pub(crate) struct ResultShape {
    pub(crate) ret_ty: Type,
    /// The `Ok` type as written; `None` for an alias other than `…::Result<T>` (`ShopResult<T>`).
    pub(crate) ok_ty: Option<Type>,
    /// The error type as written; `None` for a one-argument alias (`anyhow::Result<T>`).
    pub(crate) err_ty: Option<Type>,
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
        krate,
        mut errors,
    } = args;

    check_async(&item.sig, &ASYNC, &mut errors);
    let ret = check_return(&item.sig, &mut errors);
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
        check_store_expr(expr, &params, &mut errors);
    }
    errors.finish()?;

    match (biz, key, store, ret) {
        (Some(biz), Some(key), Some(store), Some(ret)) => Ok(Spec {
            biz,
            key: key.emitted(),
            store,
            ttl_ms: ttl.map_or(args::DEFAULT_TTL_MS, |ttl| ttl.millis),
            lease_ms: lease.map_or(args::DEFAULT_LEASE_MS, |lease| lease.millis),
            fingerprint: fingerprint.as_ref().map(ExprArg::emitted),
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

/// The fn returns `Result<T, E>` (or an alias of it) with named `Ok` and error types.
fn check_return(sig: &Signature, errors: &mut Errors) -> Option<ResultShape> {
    const WANT: &str = "`#[idempotent]` needs a fn that returns `Result<T, E>` where `T: Serialize + \
        DeserializeOwned` (the result is stored and replayed) and `E: From<idem::IdemError>`";
    let ret_ty = match &sig.output {
        ReturnType::Type(_, ty) => &**ty,
        ReturnType::Default => {
            errors.at(
                sig.ident.span(),
                format!("{WANT}; add a return type, e.g. `-> Result<Receipt, PayError>`"),
            );
            return None;
        }
    };
    let (ok_ty, err_ty, written) = match result_type(ret_ty) {
        ResultType::Named { ok, err } => (Some(ok), err, vec![Some(ok), err]),
        // The type checker finds `Ok` and `Err` (and says so when it is no `Result`).
        ResultType::Alias { first } => (None, None, vec![Some(first)]),
        ResultType::NotResult => {
            errors.spanned(
                ret_ty,
                format!(
                    "{WANT}; wrap the return type in `Result`, e.g. `-> Result<Receipt, PayError>`"
                ),
            );
            return None;
        }
    };
    let mut concrete = true;
    for ty in written.into_iter().flatten() {
        if let Type::ImplTrait(_) = peel(ty) {
            errors.spanned(
                ty,
                "`#[idempotent]` needs a named type here: the result is stored and replayed, which an \
                 `impl Trait` type cannot promise; write the concrete type",
            );
            concrete = false;
        }
    }
    concrete.then(|| ResultShape {
        ret_ty: ret_ty.clone(),
        ok_ty: ok_ty.cloned(),
        err_ty: err_ty.cloned(),
    })
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

/// `store = sqlite` (bare) where `store = "sqlite"` was meant.
fn check_store_expr(expr: &Expr, params: &[String], errors: &mut Errors) {
    let Expr::Path(path) = expr else { return };
    let Some(ident) = path.path.get_ident() else {
        return;
    };
    let name = ident.to_string();
    if path.qself.is_some()
        || params.contains(&name)
        || !name.starts_with(|c: char| c.is_lowercase())
    {
        return;
    }
    errors.at(
        ident.span(),
        format!(
            "`store = {name}` names no parameter; to use the store registered as `{name}`, write \
             `store = \"{name}\"`; to pass a store, give an expression such as `store = self.store` or \
             `store = STORE`"
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::TokenStream;
    use quote::quote;

    fn check_tokens(args: TokenStream, item: TokenStream) -> Result<Spec, Vec<String>> {
        let args: IdempotentArgs = syn::parse2(args).unwrap();
        let item: ItemFn = syn::parse2(item).unwrap();
        check(args, &item).map_err(|error| error.into_iter().map(|e| e.to_string()).collect())
    }

    fn errors(args: TokenStream, item: TokenStream) -> Vec<String> {
        match check_tokens(args, item) {
            Ok(_) => Vec::new(),
            Err(messages) => messages,
        }
    }

    fn pay_with(key: TokenStream) -> Vec<String> {
        errors(
            quote!(biz = "PAY", key = #key, store = "sqlite"),
            quote!(
                async fn pay(req: &PayReq, user: &User) -> Result<Receipt, PayError> {
                    todo!()
                }
            ),
        )
    }

    #[test]
    fn accepts_a_good_fn() {
        let spec = check_tokens(
            quote!(
                biz = "PAY",
                key = "req.order_no",
                store = "sqlite",
                fingerprint = "req"
            ),
            quote!(
                pub async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
                    todo!()
                }
            ),
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(spec.ttl_ms, args::DEFAULT_TTL_MS);
        assert_eq!(spec.lease_ms, args::DEFAULT_LEASE_MS);
        let ok = spec.ret.ok_ty.as_ref().unwrap();
        assert_eq!(quote!(#ok).to_string(), "Receipt");
        assert!(spec.ret.err_ty.is_some());
        assert!(spec.fingerprint.is_some());
    }

    #[test]
    fn accepts_methods_generics_and_result_aliases() {
        let spec = check_tokens(
            quote!(biz = "PAY", key = "self.tenant", store = self.store),
            quote!(
                async fn pay<T: Into<u64>>(&self, _n: T) -> anyhow::Result<Vec<u8>>
                where
                    T: Send,
                {
                    todo!()
                }
            ),
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert!(spec.ret.err_ty.is_none());
        assert!(
            check_tokens(
                quote!(biz = "PAY", key = (a, b), store = "s"),
                quote!(
                    async fn pay((a, b): (u8, u8)) -> io::Result<u8> {
                        todo!()
                    }
                ),
            )
            .is_ok()
        );
    }

    #[test]
    fn refuses_sync_const_and_non_result_fns() {
        let found = errors(
            quote!(biz = "PAY", key = "req.id", store = "s"),
            quote!(
                const fn pay(req: &Req) -> Result<u8, E> {
                    todo!()
                }
            ),
        );
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].contains("cannot wrap a `const fn`") && found[0].contains("remove `const`")
        );
        assert!(found[1].contains("needs an `async fn`") && found[1].contains("add `async`"));

        let found = errors(
            quote!(biz = "PAY", key = "req.id", store = "s"),
            quote!(
                async fn pay(req: &Req) -> Option<u8> {
                    todo!()
                }
            ),
        );
        assert!(
            found[0].contains("returns `Result<T, E>`")
                && found[0].contains("wrap the return type")
        );

        let found = errors(
            quote!(biz = "PAY", key = "req.id", store = "s"),
            quote!(
                async fn pay(req: &Req) {
                    todo!()
                }
            ),
        );
        assert!(found[0].contains("add a return type"), "{found:?}");

        let found = errors(
            quote!(biz = "PAY", key = "req.id", store = "s"),
            quote!(
                async fn pay(req: &Req) -> Result<impl Serialize, E> {
                    todo!()
                }
            ),
        );
        assert!(found[0].contains("needs a named type"), "{found:?}");
    }

    #[test]
    fn names_an_unknown_parameter_with_a_suggestion() {
        let found = pay_with(quote!("reqq.order_no"));
        assert_eq!(
            found,
            [
                "unknown parameter `reqq` in `key`; did you mean `req`? the parameters are `req`, `user`"
            ]
        );
        let found = pay_with(quote!(order.id));
        assert_eq!(
            found,
            ["unknown parameter `order` in `key`; the parameters are `req`, `user`"]
        );
    }

    #[test]
    fn accepts_keys_over_parameters() {
        assert!(pay_with(quote!("req.order_no")).is_empty());
        assert!(pay_with(quote!("(req.user_id, req.client_req_id)")).is_empty());
        assert!(pay_with(quote!(format!("{}-{}", req.a, user.b))).is_empty());
        assert!(pay_with(quote!(format!("{req}"))).is_empty());
        assert!(pay_with(quote!(hash(&req.order_no))).is_empty());
        assert!(pay_with(quote!(req.items.iter().map(|item| item.id).sum::<u64>())).is_empty());
        assert!(pay_with(quote!(Key::new(req.id, MAX))).is_empty());
    }

    #[test]
    fn refuses_a_key_that_uses_no_parameter() {
        let found = pay_with(quote!("42"));
        assert_eq!(found.len(), 1);
        assert!(
            found[0].starts_with("`key` uses no parameter of `pay`")
                && found[0].contains("every call would share one record"),
            "{found:?}"
        );
        let found = errors(
            quote!(biz = "PAY", key = "CONST", store = "s", fingerprint = "1"),
            quote!(
                async fn tick() -> Result<(), E> {
                    todo!()
                }
            ),
        );
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("`tick` has no parameters"));
        assert!(found[1].starts_with("`fingerprint` uses no parameter"));
    }

    #[test]
    fn refuses_await_in_the_key() {
        let found = pay_with(quote!(req.id().await));
        assert_eq!(found.len(), 1);
        assert!(found[0].starts_with("`.await` is not allowed in `key`"));
        let found = pay_with(quote!(format!("{}", req.id().await)));
        assert!(
            found[0].starts_with("`.await` is not allowed in `key`"),
            "{found:?}"
        );
    }

    #[test]
    fn refuses_values_that_change_on_every_retry() {
        for key in [
            quote!("Uuid::new_v4()"),
            quote!((req.id, uuid::Uuid::now_v7())),
            quote!((req.id, std::time::SystemTime::now())),
            quote!((req.id, chrono::Utc::now().timestamp())),
            quote!((req.id, rand::random::<u64>())),
            quote!((req.id, rand::thread_rng().next_u64())),
            quote!((req.id, req.rng.random::<u64>())),
            quote!(format!("{}{}", req.id, Uuid::new_v4())),
        ] {
            let found = pay_with(key.clone());
            assert_eq!(found.len(), 1, "{key}: {found:?}");
            assert!(
                found[0].contains("returns a new value on every call")
                    && found[0].contains(
                        "the key must come from the caller and stay stable across retries"
                    ),
                "{found:?}"
            );
        }
        assert!(pay_with(quote!((req.id, req.created.now))).is_empty());
    }

    #[test]
    fn checks_the_fingerprint_like_the_key() {
        let found = errors(
            quote!(biz = "PAY", key = "req.id", store = "s", fingerprint = "rq"),
            quote!(
                async fn pay(req: &Req) -> Result<u8, E> {
                    todo!()
                }
            ),
        );
        assert_eq!(
            found,
            [
                "unknown parameter `rq` in `fingerprint`; did you mean `req`? the parameters are `req`"
            ]
        );
    }

    #[test]
    fn checks_that_tx_names_a_parameter() {
        let found = errors(
            quote!(biz = "PAY", key = "req.id", store = "s", tx = "txn"),
            quote!(
                async fn pay(tx: &mut Tx, req: &Req) -> Result<u8, E> {
                    todo!()
                }
            ),
        );
        assert_eq!(found.len(), 1);
        assert!(
            found[0].starts_with(
                "`tx` names `txn`, which is not a parameter of `pay`; did you mean `tx`? the parameters are `tx`, `req`"
            ),
            "{found:?}"
        );
    }

    #[test]
    fn hints_at_a_quoted_store_name() {
        let found = errors(
            quote!(biz = "PAY", key = "req.id", store = sqlite),
            quote!(
                async fn pay(req: &Req) -> Result<u8, E> {
                    todo!()
                }
            ),
        );
        assert!(found[0].contains("write `store = \"sqlite\"`"), "{found:?}");
        assert!(
            errors(
                quote!(biz = "PAY", key = "req.id", store = store),
                quote!(
                    async fn pay(store: &S, req: &Req) -> Result<u8, E> {
                        todo!()
                    }
                ),
            )
            .is_empty()
        );
    }

    #[test]
    fn reports_argument_and_signature_errors_together() {
        let found = errors(
            quote!(biz = "PAY PAY", key = "reqq.id", store = "s"),
            quote!(
                fn pay(req: &Req) -> u8 {
                    todo!()
                }
            ),
        );
        assert_eq!(found.len(), 4, "{found:#?}");
    }
}
