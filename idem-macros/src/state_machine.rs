//! `#[derive(StateMachine)]`: parse the enum and its `#[state_machine]` / `#[state]` attributes, check
//! them, and generate the `idem::StateMachine` impl, `Display`/`FromStr`, the sqlx impls (through the
//! runtime, so the user's crate needs no sqlx features) and the hidden items `#[state_transition]`
//! checks names against.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};
use syn::{Data, DeriveInput, Fields, Ident, LitStr, Path};

use crate::common::diag::{self, Errors};

/// A checked machine.
struct Machine {
    ident: Ident,
    table: String,
    key: String,
    status: String,
    version: Option<String>,
    krate: Option<Path>,
    states: Vec<State>,
}

struct State {
    variant: Ident,
    name: String,
    to: Vec<Ident>,
    terminal: bool,
}

/// `#[derive(StateMachine)]`: on error, only the errors (a derive never re-emits the item).
pub(crate) fn derive(input: TokenStream) -> TokenStream {
    match syn::parse2::<DeriveInput>(input).and_then(|input| check(&input)) {
        Ok(machine) => expand(&machine),
        Err(error) => error.into_compile_error(),
    }
}

/// `[A-Za-z_][A-Za-z0-9_]*`: the SQL identifiers idem writes into statements unquoted.
pub(crate) fn is_sql_ident(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `WaitPay` → `WAIT_PAY`.
fn screaming_snake(ident: &str) -> String {
    let mut out = String::new();
    let chars: Vec<char> = ident.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c.is_uppercase() && i > 0 {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            if prev.is_lowercase() || prev.is_ascii_digit() || (prev.is_uppercase() && next_lower) {
                out.push('_');
            }
        }
        out.extend(c.to_uppercase());
    }
    out
}

/// A `table = "…"`-like value that must be a SQL identifier (`schema.table` where `dotted`).
fn sql_ident(lit: &LitStr, option: &str, dotted: bool, errors: &mut Errors) -> Option<String> {
    let value = lit.value();
    let ok = if dotted {
        let parts: Vec<&str> = value.split('.').collect();
        parts.len() <= 2 && parts.iter().all(|part| is_sql_ident(part))
    } else {
        is_sql_ident(&value)
    };
    if ok {
        Some(value)
    } else {
        let form = if dotted {
            "`[A-Za-z_][A-Za-z0-9_]*`, optionally `schema.table`"
        } else {
            "`[A-Za-z_][A-Za-z0-9_]*`"
        };
        errors.spanned(
            lit,
            format!(
                "`{option} = \"{value}\"` is not a SQL identifier idem can write unquoted; use {form}"
            ),
        );
        None
    }
}

fn check(input: &DeriveInput) -> syn::Result<Machine> {
    let mut errors = Errors::default();
    let Data::Enum(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            &input.ident,
            "`#[derive(StateMachine)]` goes on an enum of unit variants, one per state",
        ));
    };
    if !input.generics.params.is_empty() {
        errors.spanned(
            &input.generics,
            "a state machine enum cannot be generic; remove the generic parameters",
        );
    }

    let (mut table, mut key, mut status, mut version, mut krate) = (None, None, None, None, None);
    let mut found = false;
    for attr in input
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("state_machine"))
    {
        found = true;
        let parsed = attr.parse_nested_meta(|meta| {
            let name = meta.path.get_ident().map(Ident::to_string).unwrap_or_default();
            match name.as_str() {
                "table" | "key" | "status" | "version" => {
                    let lit: LitStr = meta.value()?.parse()?;
                    let value = sql_ident(&lit, &name, name == "table", &mut errors);
                    let slot = match name.as_str() {
                        "table" => &mut table,
                        "key" => &mut key,
                        "status" => &mut status,
                        _ => &mut version,
                    };
                    if slot.is_some() {
                        errors.spanned(&meta.path, format!("duplicate option `{name}`; remove one"));
                    }
                    *slot = Some(value);
                }
                "crate" => {
                    let lit: LitStr = meta.value()?.parse()?;
                    krate = Some(lit.parse::<Path>()?);
                }
                _ => {
                    const OPTIONS: [&str; 5] = ["table", "key", "status", "version", "crate"];
                    let did_you_mean = diag::did_you_mean_clause(&name, OPTIONS);
                    errors.spanned(
                        &meta.path,
                        format!(
                            "unknown option `{name}` in `#[state_machine]`{did_you_mean} the options are {}",
                            diag::backticked(OPTIONS)
                        ),
                    );
                    // Skip its value, if any.
                    if meta.input.peek(syn::Token![=]) {
                        let _: syn::Expr = meta.value()?.parse()?;
                    }
                }
            }
            Ok(())
        });
        if let Err(error) = parsed {
            errors.push(error);
        }
    }
    const EXAMPLE: &str =
        r#"#[state_machine(table = "orders", key = "order_no", status = "status")]"#;
    if !found {
        errors.spanned(
            &input.ident,
            format!("`#[derive(StateMachine)]` needs the table and columns: add `{EXAMPLE}`"),
        );
    } else {
        for (slot, name) in [(&table, "table"), (&key, "key")] {
            if slot.is_none() {
                errors.spanned(
                    &input.ident,
                    format!("`#[state_machine]` is missing `{name} = \"…\"`, e.g. `{EXAMPLE}`"),
                );
            }
        }
    }

    let variants: Vec<&Ident> = data.variants.iter().map(|v| &v.ident).collect();
    let mut states = Vec::new();
    for variant in &data.variants {
        if !matches!(variant.fields, Fields::Unit) {
            errors.spanned(
                &variant.fields,
                format!(
                    "state `{}` must be a unit variant: a state is only a name",
                    variant.ident
                ),
            );
        }
        let mut state = State {
            variant: variant.ident.clone(),
            name: screaming_snake(&variant.ident.to_string()),
            to: Vec::new(),
            terminal: false,
        };
        let mut terminal_span = None;
        for attr in variant.attrs.iter().filter(|a| a.path().is_ident("state")) {
            let parsed = attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("name") {
                    let lit: LitStr = meta.value()?.parse()?;
                    if let Some(name) = sql_text(&lit, &mut errors) {
                        state.name = name;
                    }
                } else if meta.path.is_ident("terminal") {
                    state.terminal = true;
                    terminal_span = Some(meta.path.get_ident().map_or_else(Span::call_site, Ident::span));
                } else if meta.path.is_ident("to") {
                    meta.parse_nested_meta(|target| {
                        match target.path.get_ident() {
                            Some(ident) if variants.contains(&ident) => state.to.push(ident.clone()),
                            _ => {
                                let name = diag::path_to_string(&target.path);
                                let did_you_mean = diag::did_you_mean_clause(
                                    &name,
                                    variants.iter().map(|v| v.to_string()).collect::<Vec<_>>().iter().map(String::as_str),
                                );
                                errors.spanned(
                                    &target.path,
                                    format!(
                                        "`to({name})` names no variant of `{}`{did_you_mean} the variants are {}",
                                        input.ident,
                                        diag::backticked(variants.iter().map(|v| v.to_string()).collect::<Vec<_>>().iter().map(String::as_str)),
                                    ),
                                );
                            }
                        }
                        Ok(())
                    })?;
                } else {
                    let name = diag::path_to_string(&meta.path);
                    const OPTIONS: [&str; 3] = ["name", "to", "terminal"];
                    let did_you_mean = diag::did_you_mean_clause(&name, OPTIONS);
                    errors.spanned(
                        &meta.path,
                        format!(
                            "unknown option `{name}` in `#[state]`{did_you_mean} the options are {}",
                            diag::backticked(OPTIONS)
                        ),
                    );
                }
                Ok(())
            });
            if let Err(error) = parsed {
                errors.push(error);
            }
        }
        if let Some(span) = terminal_span
            && !state.to.is_empty()
        {
            errors.at(
                span,
                format!(
                    "state `{}` is `terminal` and has `to(…)`: no transition leaves a terminal state; \
                     remove `terminal` or the `to(…)`",
                    variant.ident
                ),
            );
        }
        states.push(state);
    }
    for (i, state) in states.iter().enumerate() {
        if let Some(first) = states[..i].iter().find(|s| s.name == state.name) {
            errors.spanned(
                &state.variant,
                format!(
                    "states `{}` and `{}` are both stored as `{}`; give one another `#[state(name = \"…\")]`",
                    first.variant, state.variant, state.name
                ),
            );
        }
    }
    errors.finish()?;
    Ok(Machine {
        ident: input.ident.clone(),
        table: table.flatten().unwrap_or_default(),
        key: key.flatten().unwrap_or_default(),
        status: status.flatten().unwrap_or_else(|| "status".to_owned()),
        version: version.flatten(),
        krate,
        states,
    })
}

/// A stored state name: an identifier-like word, so `#[state_transition]` can check it by name.
fn sql_text(lit: &LitStr, errors: &mut Errors) -> Option<String> {
    let value = lit.value();
    if is_sql_ident(&value) && syn::parse_str::<Ident>(&value).is_ok() {
        Some(value)
    } else {
        errors.spanned(
            lit,
            format!(
                "state name `{value}` must be a word of letters, digits and `_` (`REFUND_PENDING`)"
            ),
        );
        None
    }
}

fn expand(machine: &Machine) -> TokenStream {
    let Machine {
        ident,
        table,
        key,
        status,
        version,
        krate,
        states,
    } = machine;
    let krate = match krate {
        Some(path) => quote!(#path),
        None => quote!(::idem),
    };
    let name = ident.to_string();
    let version = match version {
        Some(version) => quote!(::core::option::Option::Some(#version)),
        None => quote!(::core::option::Option::None),
    };
    let names: Vec<&str> = states.iter().map(|s| s.name.as_str()).collect();
    let variants: Vec<&Ident> = states.iter().map(|s| &s.variant).collect();
    let terminal = states
        .iter()
        .filter(|s| s.terminal)
        .map(|s| s.name.as_str());
    let stored = |variant: &Ident| -> &str {
        states
            .iter()
            .find(|s| &s.variant == variant)
            .map_or("", |s| s.name.as_str())
    };
    let edges = states.iter().flat_map(|s| {
        s.to.iter().map(move |to| {
            let (from, to) = (s.name.as_str(), stored(to));
            quote!((#from, #to))
        })
    });
    let markers = names.iter().map(|name| Ident::new(name, Span::call_site()));
    let module = format_ident!("__idem_sm_{}", ident);
    quote! {
        impl #krate::StateMachine for #ident {
            const NAME: &'static str = #name;
            const TABLE: &'static str = #table;
            const KEY_COLUMN: &'static str = #key;
            const STATUS_COLUMN: &'static str = #status;
            const VERSION_COLUMN: ::core::option::Option<&'static str> = #version;
            const STATES: &'static [&'static str] = &[#(#names),*];
            const TERMINAL: &'static [&'static str] = &[#(#terminal),*];
            const EDGES: &'static [(&'static str, &'static str)] = &[#(#edges),*];
            fn as_str(self) -> &'static str {
                match self {
                    #(Self::#variants => #names,)*
                }
            }
            fn parse(name: &str) -> ::core::option::Option<Self> {
                match name {
                    #(#names => ::core::option::Option::Some(Self::#variants),)*
                    _ => ::core::option::Option::None,
                }
            }
        }
        impl ::core::fmt::Display for #ident {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.pad(#krate::StateMachine::as_str(*self))
            }
        }
        impl ::core::str::FromStr for #ident {
            type Err = #krate::UnknownState;
            fn from_str(name: &str) -> ::core::result::Result<Self, Self::Err> {
                <Self as #krate::StateMachine>::parse(name)
                    .ok_or_else(|| #krate::UnknownState::new(#name, name))
            }
        }
        impl #krate::__private::Machine for #ident {
            type States = #module::__idem_states::States;
        }
        #krate::__private::sqlite_text!(#ident);

        // What `#[state_transition]` resolves: `__IdemMachine` names the one machine of this module
        // (two machines in one module make it ambiguous, and then `machine = …` picks one), and
        // `States` has one const per stored name, so a misspelled name gets rustc's "similar name".
        #[doc(hidden)]
        #[allow(non_snake_case, non_camel_case_types, non_upper_case_globals, missing_docs, unreachable_pub)]
        pub mod #module {
            pub type __IdemMachine = super::#ident;
            pub mod __idem_states {
                pub struct States;
                impl States {
                    #(pub const #markers: () = ();)*
                }
            }
        }
        #[doc(hidden)]
        #[allow(unused_imports)]
        use #module::*;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_names_default_to_screaming_snake_case() {
        assert_eq!(screaming_snake("WaitPay"), "WAIT_PAY");
        assert_eq!(screaming_snake("Paid"), "PAID");
        assert_eq!(screaming_snake("HTTPError"), "HTTP_ERROR");
        assert_eq!(screaming_snake("Step2Done"), "STEP2_DONE");
        assert!(is_sql_ident("order_no") && !is_sql_ident("order-no") && !is_sql_ident("1a"));
    }
}
