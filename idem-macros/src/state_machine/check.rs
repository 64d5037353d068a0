//! Checks of the enum and its `#[state_machine]` / `#[state]` options: SQL identifiers, unit
//! variants, `to(…)` naming variants, `terminal` without `to(…)`, one stored name per state.

use syn::{DeriveInput, Fields, Ident, LitStr};

use super::args::MachineArgs;
use super::{Machine, State};
use crate::common::diag::{self, Errors};

/// `[A-Za-z_][A-Za-z0-9_]*`: the SQL identifiers idem writes into statements unquoted.
pub(crate) fn is_sql_ident(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `WaitPay` → `WAIT_PAY`.
pub(crate) fn screaming_snake(ident: &str) -> String {
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

/// Checks the parsed enum: every error found, in the order the user reads them.
pub(super) fn check(input: &DeriveInput, args: &mut MachineArgs) -> syn::Result<Machine> {
    let mut errors = std::mem::take(&mut args.errors);
    let Some(states_args) = &args.states else {
        errors.spanned(
            &input.ident,
            "`#[derive(StateMachine)]` goes on an enum of unit variants, one per state",
        );
        return Err(errors.finish().expect_err("an error was just recorded"));
    };
    if !input.generics.params.is_empty() {
        errors.spanned(
            &input.generics,
            "a state machine enum cannot be generic; remove the generic parameters",
        );
    }

    const EXAMPLE: &str =
        r#"#[state_machine(table = "orders", key = "order_no", status = "status")]"#;
    if !args.declared {
        errors.spanned(
            &input.ident,
            format!("`#[derive(StateMachine)]` needs the table and columns: add `{EXAMPLE}`"),
        );
    } else {
        for (slot, name) in [(&args.table, "table"), (&args.key, "key")] {
            if slot.is_none() && !args.suggested.contains(&name) {
                errors.spanned(
                    &input.ident,
                    format!("`#[state_machine]` is missing `{name} = \"…\"`, e.g. `{EXAMPLE}`"),
                );
            }
        }
    }
    let mut column = |lit: &Option<LitStr>, option: &str, dotted: bool| {
        lit.as_ref()
            .and_then(|lit| sql_ident(lit, option, dotted, &mut errors))
    };
    let table = column(&args.table, "table", true);
    let key = column(&args.key, "key", false);
    let status = column(&args.status, "status", false);
    let version = column(&args.version, "version", false);

    let variants: Vec<&Ident> = states_args.iter().map(|state| &state.variant).collect();
    let variant_names: Vec<String> = variants.iter().map(|v| v.to_string()).collect();
    let mut states = Vec::new();
    for state in states_args {
        if !matches!(state.fields, Fields::Unit) {
            errors.spanned(
                &state.fields,
                format!(
                    "state `{}` must be a unit variant: a state is only a name",
                    state.variant
                ),
            );
        }
        for target in state.to.iter().filter(|target| !variants.contains(target)) {
            let name = target.to_string();
            errors.spanned(
                target,
                format!(
                    "`to({name})` names no variant of `{}`{} the variants are {}",
                    input.ident,
                    diag::did_you_mean_clause(&name, variant_names.iter().map(String::as_str)),
                    diag::backticked(variant_names.iter().map(String::as_str)),
                ),
            );
        }
        if let Some(span) = state.terminal
            && !state.to.is_empty()
        {
            errors.at(
                span,
                format!(
                    "state `{}` is `terminal` and has `to(…)`: no transition leaves a terminal state; \
                     remove `terminal` or the `to(…)`",
                    state.variant
                ),
            );
        }
        let name = match &state.name {
            Some(lit) => sql_text(lit, &mut errors),
            None => Some(screaming_snake(&state.variant.to_string())),
        };
        states.push(State {
            variant: state.variant.clone(),
            name: name.unwrap_or_default(),
            to: state
                .to
                .iter()
                .filter(|target| variants.contains(target))
                .cloned()
                .collect(),
            terminal: state.terminal.is_some(),
        });
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
        table: table.unwrap_or_default(),
        key: key.unwrap_or_default(),
        status: status.unwrap_or_else(|| "status".to_owned()),
        version,
        krate: args.krate.clone(),
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
