//! Parsing of `#[consume_token(...)]`'s arguments.
//!
//! The option list itself (unknown, duplicate and value-less options, a flag given a value, missing
//! commas) is read by `common::options`; this file turns each value into what `#[consume_token]`
//! needs. Checks that need the fn's signature (does the token name a parameter?) live in `check.rs`.

use proc_macro2::Span;
use syn::Path;
use syn::parse::{Parse, ParseStream};

use crate::common::diag::Errors;
use crate::common::expr_arg::{ExprArg, crate_path, expr_arg};
use crate::common::options::{self, Form, OptionSet, Required, Value, opt, req};
use crate::common::store_arg::{self, StoreKind, StoreSpec};

/// A complete attribute, shown whenever a required option is missing.
pub(crate) const EXAMPLE: &str = r#"#[consume_token(token = "form.token", store = "tokens")]"#;

/// The options of `#[consume_token]`, in the order messages list them.
pub(crate) const OPTIONS: OptionSet = OptionSet {
    macro_name: "#[consume_token]",
    options: &[
        opt("token", Form::Value, r#"token = "form.token""#),
        opt("store", Form::Value, r#"store = "tokens""#),
        opt("subject", Form::Value, r#"subject = "session.user_id""#),
        opt("restore_on_err", Form::Flag, "restore_on_err").note(
            "a flag: with it, a body that returns `Err` puts the token back so the user can submit \
             again; without it, the token stays spent",
        ),
        opt("crate", Form::Value, r#"crate = "::idem""#),
    ],
};

/// The stores of `#[consume_token]`: token stores.
pub(crate) const TOKEN_STORES: StoreKind = StoreKind {
    what: "token store",
    example_name: "tokens",
    example_exprs: ["self.tokens", "TOKENS"],
    arg: "TokenStoreArg",
    as_trait: "AsTokenStore",
    as_ref_trait: "AsTokenStoreRef",
    method: "as_idem_token_store",
};

/// How `name` is written, for messages.
fn example(name: &str) -> &'static str {
    OPTIONS
        .options
        .iter()
        .find(|def| def.name == name)
        .map_or("", |def| def.example)
}

/// Everything `#[consume_token(...)]` was given, plus every error found while parsing it.
///
/// An option that was given but invalid is `None` here and has an error in `errors`.
pub(crate) struct ConsumeTokenArgs {
    pub(crate) token: Option<ExprArg>,
    pub(crate) store: Option<StoreSpec>,
    pub(crate) subject: Option<ExprArg>,
    /// `restore_on_err`, at its name.
    pub(crate) restore_on_err: Option<Span>,
    pub(crate) krate: Option<Path>,
    pub(crate) errors: Errors,
}

impl Parse for ConsumeTokenArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut options = options::parse(input, &OPTIONS)?;
        let mut args = ConsumeTokenArgs {
            token: None,
            store: None,
            subject: None,
            restore_on_err: None,
            krate: None,
            errors: std::mem::take(&mut options.errors),
        };
        for given in std::mem::take(&mut options.given) {
            let (name, errors) = (given.name, &mut args.errors);
            match given.value {
                Value::Flag => args.restore_on_err = Some(given.span),
                // No option of `#[consume_token]` takes a list: the parser refuses one.
                Value::List(_) => {}
                Value::Expr(value) => match name {
                    "token" => args.token = expr_arg(name, example(name), value, errors),
                    "subject" => args.subject = expr_arg(name, example(name), value, errors),
                    "store" => args.store = store_arg::store(value, &TOKEN_STORES, errors),
                    _ => args.krate = crate_path(&value, errors),
                },
            }
        }
        const TOKEN: Required = req(
            "token",
            "`token` is the submit token the request carries, read from the parameters",
        );
        const STORE: Required = req("store", "`store` says where the tokens live");
        if let Some(error) = options.missing_error(&OPTIONS, &[TOKEN, STORE], EXAMPLE) {
            args.errors.push(error);
        }
        Ok(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::TokenStream;
    use quote::quote;

    fn parse(tokens: TokenStream) -> ConsumeTokenArgs {
        syn::parse2(tokens).expect("the parser records errors instead of failing")
    }

    fn messages(args: ConsumeTokenArgs) -> Vec<String> {
        match args.errors.finish() {
            Ok(()) => Vec::new(),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn reads_every_option() {
        let args = parse(quote!(
            token = "form.token",
            store = "tokens",
            subject = session.user_id,
            restore_on_err,
            crate = "::idem"
        ));
        assert!(args.token.as_ref().unwrap().lit.is_some());
        assert!(matches!(args.store, Some(StoreSpec::Named(_))));
        assert!(args.subject.as_ref().unwrap().lit.is_none());
        assert!(args.restore_on_err.is_some());
        assert!(args.krate.is_some());
        assert!(messages(args).is_empty());

        let args = parse(quote!(token = form.token, store = self.tokens));
        assert!(matches!(args.store, Some(StoreSpec::Given(_))));
        assert!(args.restore_on_err.is_none() && args.subject.is_none());
        assert!(messages(args).is_empty());
    }

    #[test]
    fn names_what_is_missing_with_an_example() {
        assert_eq!(
            messages(parse(quote!())),
            [
                "missing `token` and `store` in `#[consume_token]` (`token` is the submit token the \
              request carries, read from the parameters, `store` says where the tokens live); write \
              e.g. `#[consume_token(token = \"form.token\", store = \"tokens\")]`"
            ]
        );
        let only_store = messages(parse(quote!(token = "form.token")));
        assert_eq!(only_store.len(), 1);
        assert!(
            only_store[0].starts_with("missing `store` in `#[consume_token]` (`store` says"),
            "{only_store:?}"
        );
        // A misspelled option is reported once, not also as missing.
        assert_eq!(
            messages(parse(quote!(tokn = "form.token", store = "tokens"))),
            [
                "unknown option `tokn` in `#[consume_token]`; did you mean `token`? the options are \
              `token`, `store`, `subject`, `restore_on_err`, `crate`"
            ]
        );
    }

    #[test]
    fn restore_on_err_is_a_flag() {
        let errors = messages(parse(quote!(
            token = "form.token",
            store = "tokens",
            restore_on_err = true
        )));
        assert_eq!(
            errors,
            [
                "`restore_on_err` takes no value; write the name alone, e.g. `restore_on_err` (a flag: \
              with it, a body that returns `Err` puts the token back so the user can submit again; \
              without it, the token stays spent)"
            ]
        );
    }

    #[test]
    fn refuses_empty_values() {
        let errors = messages(parse(quote!(
            token = "",
            store = " ",
            subject = "",
            crate = 1
        )));
        assert_eq!(errors.len(), 4, "{errors:?}");
        assert!(errors[0].starts_with("`token` is empty"), "{errors:?}");
        assert!(
            errors[1].starts_with("`store` is empty; name a token store registered at start-up"),
            "{errors:?}"
        );
        assert!(errors[2].starts_with("`subject` is empty"), "{errors:?}");
        assert!(
            errors[3].starts_with("`crate` takes the path"),
            "{errors:?}"
        );
    }
}
