//! Checks of `#[consume_token]` against the fn it is on: the signature (async, returns `Result`), and
//! the `token`, `subject` and `store` expressions against the fn's parameters, through the parts
//! every macro shares.
//!
//! The output is a [`Spec`]: everything code generation needs, with no `Option` left to unwrap.

use proc_macro2::Span;
use syn::{ItemFn, Path};

use super::args::{ConsumeTokenArgs, TOKEN_STORES};
use crate::common::expr_arg::ExprArg;
use crate::common::key_scan::{Role, check_expr_arg};
use crate::common::signature::{
    AsyncNeed, ResultShape, ReturnNeed, check_async, check_return, parameters,
};
use crate::common::store_arg::{StoreSpec, check_store_expr};

const ASYNC: AsyncNeed = AsyncNeed {
    macro_name: "#[consume_token]",
    awaits: "spending the token awaits the token store",
    run_time: "spending the token is run-time work",
};

const RETURN: ReturnNeed = ReturnNeed {
    want: "`#[consume_token]` needs a fn that returns `Result<T, E>` where \
        `E: From<idem::IdemError>` (a used or invalid token is returned as an `Err` of the fn's own \
        error type)",
    named: "`#[consume_token]` needs a named type here: the body is wrapped in a block of the fn's \
        return type, which cannot be an `impl Trait` type; write the concrete type",
    example: "Result<Order, ShopError>",
};

/// Everything the expansion needs, checked.
pub(crate) struct Spec {
    pub(crate) token: ExprArg,
    pub(crate) store: StoreSpec,
    pub(crate) subject: Option<ExprArg>,
    /// `restore_on_err`, at its name.
    pub(crate) restore_on_err: Option<Span>,
    /// `crate = "…"`, or `None` for `::idem`.
    pub(crate) krate: Option<Path>,
    pub(crate) ret: ResultShape,
}

/// Checks `args` against `item`; every error found, in the order the user reads them.
pub(crate) fn check(args: ConsumeTokenArgs, item: &ItemFn) -> syn::Result<Spec> {
    let ConsumeTokenArgs {
        token,
        store,
        subject,
        restore_on_err,
        krate,
        mut errors,
    } = args;

    check_async(&item.sig, &ASYNC, &mut errors);
    let ret = check_return(&item.sig, &RETURN, &mut errors);
    let params = parameters(&item.sig);
    let fn_name = item.sig.ident.to_string();
    if let Some(token) = &token {
        check_expr_arg(token, Role::Token, &params, &fn_name, &mut errors);
    }
    if let Some(subject) = &subject {
        check_expr_arg(subject, Role::Subject, &params, &fn_name, &mut errors);
    }
    if let Some(StoreSpec::Given(expr)) = &store {
        check_store_expr(expr, &params, &TOKEN_STORES, &mut errors);
    }
    errors.finish()?;

    match (token, store, ret) {
        (Some(token), Some(store), Some(ret)) => Ok(Spec {
            token,
            store,
            subject,
            restore_on_err,
            krate,
            ret,
        }),
        // Unreachable: a missing option or a bad return type always records an error above.
        _ => Err(syn::Error::new(
            item.sig.ident.span(),
            "internal error in `#[consume_token]`: an option is missing but no error was recorded; \
             please report it",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::TokenStream;
    use quote::quote;

    fn errors(args: TokenStream, item: TokenStream) -> Vec<String> {
        let args: ConsumeTokenArgs = syn::parse2(args).unwrap();
        let item: ItemFn = syn::parse2(item).unwrap();
        match check(args, &item) {
            Ok(_) => Vec::new(),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    fn submit_with(args: TokenStream) -> Vec<String> {
        errors(
            args,
            quote!(
                async fn submit(form: &Form, session: &Session) -> Result<Order, ShopError> {
                    todo!()
                }
            ),
        )
    }

    #[test]
    fn accepts_strings_bare_expressions_methods_and_aliases() {
        assert!(
            submit_with(quote!(
                token = "form.token",
                store = "tokens",
                subject = "session.user_id",
                restore_on_err
            ))
            .is_empty()
        );
        assert!(submit_with(quote!(token = form.token.as_str(), store = "tokens")).is_empty());
        let errors = errors(
            quote!(token = "form.token", store = self.tokens),
            quote!(
                async fn submit<F: AsRef<str>>(&self, form: F) -> anyhow::Result<u8> {
                    todo!()
                }
            ),
        );
        assert!(errors.is_empty(), "{errors:?}");
    }

    #[test]
    fn token_and_subject_are_read_from_the_parameters() {
        assert_eq!(
            submit_with(quote!(token = "fom.token", store = "tokens")),
            [
                "unknown parameter `fom` in `token`; did you mean `form`? the parameters are `form`, `session`"
            ]
        );
        let constant = submit_with(quote!(token = "\"abc\"", store = "tokens"));
        assert_eq!(constant.len(), 1);
        assert!(
            constant[0].starts_with("`token` uses no parameter of `submit`"),
            "{constant:?}"
        );
        let fresh = submit_with(quote!(
            token = "form.token",
            store = "tokens",
            subject = "Uuid::new_v4().to_string()"
        ));
        assert_eq!(fresh.len(), 1);
        assert!(
            fresh[0].starts_with(
                "`Uuid::new_v4` returns a new value on every call, so it would never be the subject"
            ),
            "{fresh:?}"
        );
        let awaited = submit_with(quote!(token = "form.token().await", store = "tokens"));
        assert!(
            awaited[0].starts_with("`.await` is not allowed in `token`"),
            "{awaited:?}"
        );
    }

    #[test]
    fn reports_every_mistake_of_the_fn_at_once() {
        let errors = errors(
            quote!(token = "form.token", store = tokens),
            quote!(
                fn submit(form: &Form) -> Option<u8> {
                    todo!()
                }
            ),
        );
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].starts_with("`#[consume_token]` needs an `async fn`"));
        assert!(errors[1].starts_with("`#[consume_token]` needs a fn that returns `Result<T, E>`"));
        assert!(errors[2].starts_with(
            "`store = tokens` names no parameter; to use the token store registered as `tokens`"
        ));
    }
}
