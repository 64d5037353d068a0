//! Parsing and checks of the enum and its `#[state_machine]` / `#[state]` attributes.

use proc_macro2::Span;
use syn::{Data, DeriveInput, Fields, Ident, LitStr, Path};

use super::{Machine, State};
use crate::common::diag::{self, Errors};

/// `[A-Za-z_][A-Za-z0-9_]*`: the SQL identifiers idem writes into statements unquoted.
pub(crate) fn is_sql_ident(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `WaitPay` → `WAIT_PAY`.
pub(super) fn screaming_snake(ident: &str) -> String {
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
pub(super) fn sql_ident(
    lit: &LitStr,
    option: &str,
    dotted: bool,
    errors: &mut Errors,
) -> Option<String> {
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

pub(super) fn check(input: &DeriveInput) -> syn::Result<Machine> {
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
pub(super) fn sql_text(lit: &LitStr, errors: &mut Errors) -> Option<String> {
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
