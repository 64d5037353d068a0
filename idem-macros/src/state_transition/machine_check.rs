//! `check_transition!`: a transition's states, key and version against its machine.
//!
//! `#[state_transition]` cannot see the machine (it is another item, maybe in another module or
//! crate), so it calls the macro `#[derive(StateMachine)]` emitted under the enum's name; that macro
//! forwards the transition's tokens, with the machine's description (`state_machine/description.rs`),
//! to this hidden proc macro. Here everything is known, and each mistake becomes a `compile_error!`
//! at the user's own token (spans survive `macro_rules!` forwarding): the first line says the rule,
//! the second the fix.
//!
//! Input: `machine { … } transition { from = ["A", …]; to = "B"; key = param; version = (expr); }`,
//! `key` only when the key was defaulted to a parameter, `version` only when given.

use proc_macro2::TokenStream;
use syn::parse::{Parse, ParseStream};
use syn::{Ident, LitStr, Token};

use crate::common::diag::{self, Errors};
use crate::state_machine::description::{Description, MachineInfo};
use crate::state_machine::screaming_snake;

/// The expansion of `check_transition! { … }`: nothing, or the errors.
pub(crate) fn check_transition(input: TokenStream) -> TokenStream {
    match syn::parse2::<Input>(input) {
        Ok(Input {
            machine: MachineInfo::Known(machine),
            transition,
        }) => match check(&machine, &transition).finish() {
            Ok(()) => TokenStream::new(),
            Err(error) => error.into_compile_error(),
        },
        // The derive reported an error of its own: one mistake, one error.
        Ok(Input {
            machine: MachineInfo::Broken,
            ..
        }) => TokenStream::new(),
        Err(error) => syn::Error::new(
            error.span(),
            format!(
                "internal error in `#[state_transition]`: the machine's macro and idem's macros \
                 disagree ({error}); use one version of idem"
            ),
        )
        .into_compile_error(),
    }
}

struct Input {
    machine: MachineInfo,
    transition: Transition,
}

/// What the transition says about the machine, as the user's tokens.
struct Transition {
    from: Vec<LitStr>,
    to: LitStr,
    /// The parameter taken as the row's key, when `key = …` was not given.
    key: Option<Ident>,
    /// The `version = …` value, when given.
    version: Option<TokenStream>,
}

impl Parse for Input {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let machine = input.parse()?;
        let keyword: Ident = input.parse()?;
        if keyword != "transition" {
            return Err(syn::Error::new(
                keyword.span(),
                "expected `transition { … }`",
            ));
        }
        let content;
        syn::braced!(content in input);
        let mut transition = Transition {
            from: Vec::new(),
            to: LitStr::new("", keyword.span()),
            key: None,
            version: None,
        };
        while !content.is_empty() {
            let entry: Ident = content.parse()?;
            content.parse::<Token![=]>()?;
            match entry.to_string().as_str() {
                "from" => {
                    let names;
                    syn::bracketed!(names in content);
                    transition.from = names
                        .parse_terminated(<LitStr as Parse>::parse, Token![,])?
                        .into_iter()
                        .collect();
                }
                "to" => transition.to = content.parse()?,
                "key" => transition.key = Some(content.parse()?),
                "version" => {
                    let value;
                    syn::parenthesized!(value in content);
                    transition.version = Some(value.parse()?);
                }
                _ => return Err(syn::Error::new(entry.span(), "unknown transition entry")),
            }
            content.parse::<Token![;]>()?;
        }
        Ok(Input {
            machine,
            transition,
        })
    }
}

/// Every mistake of `transition` against `machine`.
fn check(machine: &Description, transition: &Transition) -> Errors {
    let mut errors = Errors::default();
    let mut known = true;
    for lit in transition.from.iter().chain([&transition.to]) {
        if stored(machine, &lit.value()).is_none() {
            known = false;
            errors.at(lit.span(), unknown_state(machine, &lit.value()));
        }
    }
    // Moves are only judged between states that exist.
    if known {
        for from in &transition.from {
            if let Some(message) = rule_broken(machine, &from.value(), &transition.to.value()) {
                errors.at(from.span(), message);
            }
        }
    }
    if let Some(param) = &transition.key
        && *param != machine.key
    {
        errors.at(
            param.span(),
            format!(
                "the row's key is the first parameter, `{param}`, but the machine `{name}` finds rows \
                 by `{key}`\nrename the parameter to `{key}`, or name the key: `key = \"{param}\"`",
                name = machine.name,
                key = machine.key,
            ),
        );
    }
    if let Some(version) = &transition.version
        && machine.version.is_none()
    {
        errors.spanned(
            version,
            format!(
                "`version = …` compares the machine's version column, and `{name}` has none\nadd \
                 `version = \"version\"` to the `#[state_machine(…)]` of `{name}`, or remove `version` here",
                name = machine.name,
            ),
        );
    }
    errors
}

/// The variant stored as `name`.
fn stored<'a>(machine: &'a Description, name: &str) -> Option<&'a Ident> {
    machine
        .states
        .iter()
        .find(|(stored, _)| stored == name)
        .map(|(_, variant)| variant)
}

/// Why `name` is no state of `machine`, and what to write instead.
fn unknown_state(machine: &Description, name: &str) -> String {
    let names: Vec<&str> = machine
        .states
        .iter()
        .map(|(stored, _)| stored.as_str())
        .collect();
    let list = names
        .iter()
        .map(|name| format!("`\"{name}\"`"))
        .collect::<Vec<_>>()
        .join(", ");
    let machine_name = &machine.name;
    // A Rust variant name (or its default stored form) instead of the stored one.
    let variant = machine
        .states
        .iter()
        .find(|(_, variant)| *variant == name || screaming_snake(&variant.to_string()) == name);
    if let Some((stored, variant)) = variant {
        return format!(
            "the machine `{machine_name}` has no state `\"{name}\"`: its variant `{variant}` is stored \
             as `\"{stored}\"`\nwrite `\"{stored}\"`; the states of `{machine_name}` are stored as {list}"
        );
    }
    let suggestion = names
        .iter()
        .find(|stored| stored.eq_ignore_ascii_case(name))
        .copied()
        .or_else(|| diag::did_you_mean(name, names.iter().copied()));
    let did_you_mean =
        suggestion.map_or_else(String::new, |best| format!("did you mean `\"{best}\"`? "));
    format!(
        "the machine `{machine_name}` has no state `\"{name}\"`\n{did_you_mean}the states of \
         `{machine_name}` are stored as {list}"
    )
}

/// The rule of `machine` that forbids `from` → `to`, and the fix, if one does.
fn rule_broken(machine: &Description, from: &str, to: &str) -> Option<String> {
    let name = &machine.name;
    let from_variant = stored(machine, from)?;
    if machine.terminal.iter().any(|terminal| terminal == from) {
        return Some(format!(
            "`{from}` is a terminal state of the machine `{name}`: no transition leaves it\nremove \
             `\"{from}\"` from `from`, or remove `terminal` from the `#[state(…)]` of `{from_variant}`"
        ));
    }
    if machine.edges.iter().any(|(f, t)| f == from && t == to) {
        return None;
    }
    let to_variant = stored(machine, to)?;
    let mut targets: Vec<String> = machine
        .edges
        .iter()
        .filter(|(f, _)| f == from)
        .filter_map(|(_, t)| stored(machine, t).map(Ident::to_string))
        .collect();
    targets.push(to_variant.to_string());
    Some(format!(
        "the machine `{name}` declares no transition from `{from}` to `{to}`\nto allow it, write \
         `#[state(to({}))]` on `{from_variant}`; otherwise fix `from` or `to`",
        targets.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::Span;
    use quote::quote;

    fn orders() -> Description {
        let ident = |name| Ident::new(name, Span::call_site());
        Description {
            name: ident("OrderStatus"),
            table: "orders".into(),
            key: "order_no".into(),
            status: "status".into(),
            version: None,
            states: vec![
                ("WAIT_PAY".into(), ident("WaitPay")),
                ("PAID".into(), ident("Paid")),
                ("REFUND_PENDING".into(), ident("Refunding")),
                ("REFUNDED".into(), ident("Refunded")),
            ],
            terminal: vec!["REFUNDED".into()],
            edges: vec![
                ("WAIT_PAY".into(), "PAID".into()),
                ("PAID".into(), "REFUND_PENDING".into()),
                ("REFUND_PENDING".into(), "REFUNDED".into()),
            ],
        }
    }

    fn errors(transition: TokenStream) -> Vec<String> {
        let input: Input =
            syn::parse2(quote!(machine { broken } transition { #transition })).unwrap();
        match check(&orders(), &input.transition).finish() {
            Ok(()) => Vec::new(),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn accepts_a_declared_transition() {
        assert!(errors(quote!(from = ["WAIT_PAY"]; to = "PAID"; key = order_no;)).is_empty());
    }

    #[test]
    fn names_an_unknown_state_with_quotes() {
        let found = errors(quote!(from = ["WAIT_PAY"]; to = "PAYED";));
        assert_eq!(
            found,
            [
                "the machine `OrderStatus` has no state `\"PAYED\"`\ndid you mean `\"PAID\"`? the states of \
                 `OrderStatus` are stored as `\"WAIT_PAY\"`, `\"PAID\"`, `\"REFUND_PENDING\"`, `\"REFUNDED\"`"
            ]
        );
        let found = errors(quote!(from = ["WaitPay"]; to = "paid";));
        assert!(
            found[0].starts_with(
                "the machine `OrderStatus` has no state `\"WaitPay\"`: its variant `WaitPay` is stored as `\"WAIT_PAY\"`\nwrite `\"WAIT_PAY\"`;"
            ),
            "{found:?}"
        );
        assert!(found[1].contains("did you mean `\"PAID\"`?"), "{found:?}");
    }

    #[test]
    fn states_the_rule_then_the_fix() {
        let found = errors(quote!(from = ["WAIT_PAY", "REFUNDED"]; to = "REFUND_PENDING";));
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(
            found[0],
            "the machine `OrderStatus` declares no transition from `WAIT_PAY` to `REFUND_PENDING`\nto \
             allow it, write `#[state(to(Paid, Refunding))]` on `WaitPay`; otherwise fix `from` or `to`"
        );
        assert!(found[1].starts_with(
            "`REFUNDED` is a terminal state of the machine `OrderStatus`: no transition leaves it\n"
        ));
    }

    #[test]
    fn checks_the_key_parameter_and_the_version_column() {
        let found = errors(quote!(from = ["WAIT_PAY"]; to = "PAID"; key = id; version = ("seen");));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("the row's key is the first parameter, `id`, but the machine")
        );
        assert!(
            found[0]
                .ends_with("rename the parameter to `order_no`, or name the key: `key = \"id\"`")
        );
        assert!(found[1].starts_with("`version = …` compares the machine's version column"));
    }
}
