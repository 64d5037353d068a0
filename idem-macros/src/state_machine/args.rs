//! Parsing of the enum and its `#[state_machine(…)]` / `#[state(…)]` attributes, through the option
//! parser every macro shares (unknown, duplicate and value-less options, missing commas).

use proc_macro2::{Span, TokenStream};
use syn::parse::{ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::{Attribute, Data, DeriveInput, Fields, Ident, LitStr, Path, Token};

use crate::common::diag::Errors;
use crate::common::expr_arg::{path_value, string_lit};
use crate::common::options::{self, Form, OptionSet, Value, opt};

/// The options of `#[state_machine(…)]` on the enum.
const MACHINE: OptionSet = OptionSet {
    macro_name: "#[state_machine]",
    options: &[
        opt("table", Form::Value, r#"table = "orders""#),
        opt("key", Form::Value, r#"key = "order_no""#),
        opt("status", Form::Value, r#"status = "status""#),
        opt("version", Form::Value, r#"version = "version""#),
        opt("crate", Form::Value, r#"crate = "::idem""#),
    ],
};

/// The options of `#[state(…)]` on a variant.
const STATE: OptionSet = OptionSet {
    macro_name: "#[state]",
    options: &[
        opt("name", Form::Value, r#"name = "REFUND_PENDING""#),
        opt("to", Form::List, "to(Paid, Closed)"),
        opt("terminal", Form::Flag, "terminal"),
    ],
};

/// The enum as written.
pub(super) struct MachineArgs {
    /// Whether any `#[state_machine(…)]` was written.
    pub(super) declared: bool,
    /// Options a misspelled name was probably meant as: they are not "missing".
    pub(super) suggested: Vec<&'static str>,
    pub(super) table: Option<LitStr>,
    pub(super) key: Option<LitStr>,
    pub(super) status: Option<LitStr>,
    pub(super) version: Option<LitStr>,
    pub(super) krate: Option<Path>,
    /// Every variant, in order; `None` when the item is no enum.
    pub(super) states: Option<Vec<StateArgs>>,
    pub(super) errors: Errors,
}

/// One variant as written.
pub(super) struct StateArgs {
    pub(super) variant: Ident,
    pub(super) fields: Fields,
    pub(super) name: Option<LitStr>,
    pub(super) to: Vec<Ident>,
    /// Where `terminal` was written.
    pub(super) terminal: Option<Span>,
}

/// Reads the attributes of `input`; every error is recorded, none stops the reading.
pub(super) fn parse(input: &DeriveInput) -> MachineArgs {
    let mut args = MachineArgs {
        declared: false,
        suggested: Vec::new(),
        table: None,
        key: None,
        status: None,
        version: None,
        krate: None,
        states: None,
        errors: Errors::default(),
    };
    for tokens in attribute_lists(&input.attrs, "state_machine", &mut args.errors) {
        args.declared = true;
        let Some((options, suggested)) = read(tokens, &MACHINE, &mut args.errors) else {
            continue;
        };
        args.suggested.extend(suggested);
        for given in options {
            let Value::Expr(value) = given.value else {
                continue;
            };
            let example = example(&MACHINE, given.name);
            let errors = &mut args.errors;
            if given.name == "crate" {
                args.krate = path_value(&value);
                if args.krate.is_none() {
                    errors.spanned(
                        &value,
                        "`crate` takes the path at which idem is reachable, e.g. `crate = \"::idem\"`",
                    );
                }
                continue;
            }
            let lit = string_lit(given.name, example, &value, errors);
            let slot = match given.name {
                "table" => &mut args.table,
                "key" => &mut args.key,
                "status" => &mut args.status,
                _ => &mut args.version,
            };
            if slot.is_some() {
                // Given in an earlier `#[state_machine(…)]` (one list finds its own duplicates).
                errors.at(
                    given.span,
                    format!(
                        "duplicate option `{}`; each option may be given once, remove this one",
                        given.name
                    ),
                );
            }
            *slot = lit;
        }
    }
    if let Data::Enum(data) = &input.data {
        let states = data
            .variants
            .iter()
            .map(|variant| state(variant, &mut args.errors))
            .collect();
        args.states = Some(states);
    }
    args
}

/// One variant and its `#[state(…)]`.
fn state(variant: &syn::Variant, errors: &mut Errors) -> StateArgs {
    let mut state = StateArgs {
        variant: variant.ident.clone(),
        fields: variant.fields.clone(),
        name: None,
        to: Vec::new(),
        terminal: None,
    };
    for tokens in attribute_lists(&variant.attrs, "state", errors) {
        let Some((options, _)) = read(tokens, &STATE, errors) else {
            continue;
        };
        for given in options {
            match given.value {
                Value::Expr(value) => {
                    state.name = string_lit("name", example(&STATE, "name"), &value, errors);
                }
                Value::List(targets) => {
                    let parser = Punctuated::<Ident, Token![,]>::parse_terminated;
                    match parser.parse2(targets) {
                        Ok(targets) => state.to.extend(targets),
                        Err(error) => errors.push(syn::Error::new(
                            error.span(),
                            format!("{error}; name the target variants, e.g. `to(Paid, Closed)`"),
                        )),
                    }
                }
                Value::Flag => state.terminal = Some(given.span),
            }
        }
    }
    state
}

/// The tokens inside each `#[name(…)]` of `attrs`.
fn attribute_lists(attrs: &[Attribute], name: &str, errors: &mut Errors) -> Vec<TokenStream> {
    attrs
        .iter()
        .filter(|attr| attr.path().is_ident(name))
        .filter_map(|attr| match attr.meta.require_list() {
            Ok(list) => Some(list.tokens.clone()),
            Err(_) => {
                errors.spanned(
                    attr,
                    format!("write the options of `#[{name}]` in parentheses, e.g. `#[{name}(…)]`"),
                );
                None
            }
        })
        .collect()
}

/// The options in `tokens` and the names misspellings were taken for, their errors moved to
/// `errors`.
fn read(
    tokens: TokenStream,
    set: &OptionSet,
    errors: &mut Errors,
) -> Option<(Vec<options::Given>, Vec<&'static str>)> {
    match (|input: ParseStream| options::parse(input, set)).parse2(tokens) {
        Ok(mut options) => {
            errors.append(std::mem::take(&mut options.errors));
            Some((options.given, options.suggested))
        }
        Err(error) => {
            errors.push(error);
            None
        }
    }
}

/// How the option `name` of `set` is written, for messages.
fn example(set: &OptionSet, name: &str) -> &'static str {
    set.options
        .iter()
        .find(|def| def.name == name)
        .map_or("", |def| def.example)
}
