//! Code generation for `#[consume_token]`: keep the fn's attributes, visibility and signature, replace
//! the body by one runtime call, `<idem>::__private::consume_token`, which spends the token, runs the
//! original body only when that succeeded, and puts the token back on `Err` with `restore_on_err`.

use proc_macro2::{Ident, TokenStream};
use quote::{quote, quote_spanned};
use syn::ItemFn;

use super::args::TOKEN_STORES;
use super::check::Spec;
use crate::common::body;
use crate::common::diag::located_at;
use crate::common::expr_arg::ExprArg;
use crate::common::store_arg;
use crate::common::wrap;

/// The expansion of a checked `#[consume_token]` fn.
pub(crate) fn expand(item: &ItemFn, spec: &Spec) -> TokenStream {
    let private = wrap::private_path(spec.krate.as_ref());
    let ret = &spec.ret;
    let err_check = wrap::err_check(ret, &private);
    let (ok_arg, err_arg) = wrap::type_args(ret);
    let by = format!("#[consume_token] {}", item.sig.ident);
    let (use_as_store, store_arg) = store_arg::store_arg(&spec.store, &TOKEN_STORES, &by, &private);
    let token = text(&spec.token, &private, "TokenText", "token_text");
    let subject = match &spec.subject {
        Some(subject) => {
            let subject = text(subject, &private, "SubjectText", "subject_text");
            quote!(::core::option::Option::Some(#subject))
        }
        None => quote!(::core::option::Option::None),
    };
    let restore_on_err = match spec.restore_on_err {
        Some(span) => quote_spanned!(span=> true),
        None => quote!(false),
    };
    let user_body = wrap::user_body(ret, &private, &item.block.stmts);
    // What the runtime call itself reports (outside the checks) is shown at the return type.
    let consume = wrap::engine_call(
        wrap::return_type_anchor(ret),
        &private,
        quote!(consume_token::<#ok_arg, #err_arg, _>),
        quote!(#store_arg, __idem_token, __idem_subject, #restore_on_err, __idem_err, #user_body),
    );
    let body = wrap::declared(ret, &private, consume);

    body::rewrap(
        item,
        TokenStream::new(),
        quote! {
            #use_as_store
            #err_check
            // Copied out before the body runs: the body may move the parameters they are read
            // from, and `restore_on_err` needs them after it.
            let __idem_token = #token;
            let __idem_subject = #subject;
            #body
        },
    )
}

/// `<private>::TokenText::token_text(&(expr))`: the expression's text as a `String`. The call is
/// spanned at the expression as written, so a value that is no text is reported there, once, with
/// the runtime trait's message.
fn text(arg: &ExprArg, private: &TokenStream, trait_name: &str, method: &str) -> TokenStream {
    let expr = arg.emitted();
    let span = arg.span();
    let (trait_name, method) = (Ident::new(trait_name, span), Ident::new(method, span));
    let path = located_at(quote!(#private::#trait_name::#method), span);
    quote_spanned!(span=> #path(&(#expr)))
}

#[cfg(test)]
mod tests {
    use crate::consume_token::consume_token;
    use proc_macro2::TokenStream;
    use quote::quote;

    fn expand(args: TokenStream, item: TokenStream) -> String {
        consume_token(args, item).to_string()
    }

    #[test]
    fn expands_a_named_store() {
        let out = expand(
            quote!(token = "form.token", store = "tokens"),
            quote! {
                /// Submits.
                pub async fn submit(form: &Form) -> Result<Order, ShopError> {
                    Ok(Order)
                }
            },
        );
        assert!(!out.contains("compile_error"), "{out}");
        for expected in [
            "# [doc = r\" Submits.\"] pub async fn submit (form : & Form) -> Result < Order , ShopError > {",
            "let __idem_err = < ShopError as :: idem :: __private :: CarriesIdemError > :: proof () ;",
            "let __idem_token = :: idem :: __private :: TokenText :: token_text (& (form . token)) ;",
            "let __idem_subject = :: core :: option :: Option :: None ;",
            ":: idem :: __private :: consume_token :: < Order , ShopError , _ > (:: idem :: __private :: TokenStoreArg :: Named (\"tokens\") , __idem_token , __idem_subject , false , __idem_err , async {",
            "let __idem_fake_return : Result < Order , ShopError > = loop { } ; return __idem_fake_return ;",
            "Ok (Order) }) . await }",
        ] {
            assert!(out.contains(expected), "missing `{expected}` in\n{out}");
        }
        assert!(
            !out.contains("AsTokenStore"),
            "only a given store needs the import: {out}"
        );
        assert!(
            !out.contains("async move"),
            "the body borrows the parameters: {out}"
        );
    }

    #[test]
    fn expands_a_given_store_a_subject_the_flag_and_an_alias() {
        let out = expand(
            quote!(
                token = form.token,
                store = self.tokens,
                subject = "session.user_id",
                restore_on_err,
                crate = "shop::idem"
            ),
            quote! {
                async fn submit(&self, form: Form, session: &Session) -> anyhow::Result<Order> {
                    Ok(Order)
                }
            },
        );
        assert!(!out.contains("compile_error"), "{out}");
        for expected in [
            "use shop :: idem :: __private :: { AsTokenStore as _ , AsTokenStoreRef as _ } ;",
            "let __idem_err = < < anyhow :: Result < Order > as shop :: idem :: __private :: IsResult > :: Err as shop :: idem :: __private :: CarriesIdemError > :: proof () ;",
            "let __idem_subject = :: core :: option :: Option :: Some (shop :: idem :: __private :: SubjectText :: subject_text (& (session . user_id))) ;",
            "shop :: idem :: __private :: consume_token :: < Order , _ , _ > (shop :: idem :: __private :: TokenStoreArg :: Given ((& (self . tokens)) . as_idem_token_store ()) , __idem_token , __idem_subject , true , __idem_err , async {",
        ] {
            assert!(out.contains(expected), "missing `{expected}` in\n{out}");
        }

        // An alias under another name: the type checker finds its `Ok` and `Err`.
        let out = expand(
            quote!(token = "form.token", store = "tokens"),
            quote! {
                async fn submit(form: &Form) -> ShopResult<Order> {
                    Ok(Order)
                }
            },
        );
        for expected in [
            ":: idem :: __private :: consume_token :: < _ , _ , _ > (",
            "< ShopResult < Order > as :: idem :: __private :: IsResult > :: into_result (__idem_out)",
            "< ShopResult < Order > as :: idem :: __private :: IsResult > :: from_result (__idem_result)",
        ] {
            assert!(out.contains(expected), "missing `{expected}` in\n{out}");
        }
    }

    #[test]
    fn a_bad_attribute_keeps_the_fn_as_written() {
        let out = expand(
            quote!(tokn = "form.token", store = "tokens"),
            quote! {
                async fn submit(form: &Form) -> Result<Order, ShopError> {
                    Ok(Order)
                }
            },
        );
        assert_eq!(out.matches("compile_error").count(), 1, "{out}");
        assert!(
            out.starts_with(
                "async fn submit (form : & Form) -> Result < Order , ShopError > { let _ = & form ; Ok (Order) }"
            ),
            "{out}"
        );
        let out = expand(
            quote!(token = "t", store = "tokens"),
            quote!(
                struct Form;
            ),
        );
        assert!(out.starts_with("struct Form ;"), "{out}");
        assert!(out.contains("`#[consume_token]` goes on an `async fn` that returns `Result`; this item is not a fn"), "{out}");
    }
}
