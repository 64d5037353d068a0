//! The SQL a `#[state_transition]` fn documents in its rustdoc.

use super::check::Spec;
use crate::common::diag;

/// The doc lines that show the statement (table and key/status columns come from the machine).
pub(super) fn docs(spec: &Spec) -> Vec<String> {
    let args = &spec.args;
    let machine = format!("`{}`", diag::path_to_string(&spec.machine));
    let from: Vec<String> = spec.from.iter().map(|f| format!("`{}`", f.name)).collect();
    let mut set = String::new();
    for column in &args.set {
        set.push_str(&format!(", \"{}\" = ?", column.column));
    }
    if let Some(now) = &args.now {
        set.push_str(&format!(", \"{}\" = CURRENT_TIMESTAMP", now));
    }
    set.push_str(", \"{version}\" = \"{version}\" + 1");
    let status_in = if spec.from.len() == 1 {
        "= ?".to_owned()
    } else {
        format!("IN ({})", vec!["?"; spec.from.len()].join(", "))
    };
    let version = if args.version.is_some() {
        " AND \"{version}\" = ?"
    } else {
        ""
    };
    let mut matches = String::new();
    for column in &args.matches {
        matches.push_str(&format!(" AND \"{column}\" = ?"));
    }
    let mode = match (&spec.tx, &spec.store) {
        (Some(tx), _) => format!("in the caller's transaction `{tx}` (a savepoint)"),
        (None, Some(store)) => format!(
            "in a transaction of its own on store `{}` (its `begin()`)",
            store.value()
        ),
        (None, None) => String::new(),
    };
    let shape = format!(
        "idem::state_machine::TransitionSql::build::<{}>(&idem::state_machine::TransitionShape {{ set: &[{}], now: {}, matches: &[{}], \
         from_count: {}, versioned: {} }})",
        diag::path_to_string(&spec.machine),
        args.set
            .iter()
            .map(|c| format!("\"{}\"", c.column))
            .collect::<Vec<_>>()
            .join(", "),
        args.now
            .as_ref()
            .map_or("None".to_owned(), |now| format!("Some(\"{now}\")")),
        args.matches
            .iter()
            .map(|c| format!("\"{c}\""))
            .collect::<Vec<_>>()
            .join(", "),
        spec.from.len(),
        args.version.is_some(),
    );
    vec![
        String::new(),
        "# State transition".to_owned(),
        String::new(),
        format!(
            "Moves a row of {machine} from {} to `{}` {mode}; `{{table}}`, `{{key}}`, `{{status}}` and \
             `{{version}}` are the machine's `#[state_machine(…)]` names. Shown for SQLite; MySQL quotes \
             identifiers with `` ` `` instead of `\"`, Postgres numbers the parameters `$1`, `$2`, …; the \
             `{{version}}` parts are there when the machine has a version column (every transition then \
             bumps it):",
            from.join(" or "),
            spec.to.name
        ),
        String::new(),
        "```sql".to_owned(),
        format!(
            "UPDATE \"{{table}}\" SET \"{{status}}\" = ?{set} WHERE \"{{key}}\" = ? AND \"{{status}}\" {status_in}{version}"
        ),
        format!(
            "-- when no row changed (MySQL/Postgres add FOR UPDATE):\nSELECT \"{{status}}\", CASE WHEN \"{{status}}\" = ?{matches} THEN 1 ELSE 0 END, \"{{version}}\" FROM \"{{table}}\" WHERE \"{{key}}\" = ?"
        ),
        "```".to_owned(),
        String::new(),
        format!("The exact statements per dialect: `{shape}`."),
    ]
}
