//! Parsing of `#[idempotent(...)]`'s arguments.
//!
//! The option list itself (unknown, duplicate and value-less options, missing commas) is read by
//! `common::options`; this file turns each value into what `#[idempotent]` needs. Checks that need the
//! fn's signature (does the key name a parameter?) live in `check.rs`.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::{Expr, Ident, LitStr, Path};

use crate::common::diag::Errors;
use crate::common::duration;
use crate::common::expr_arg::{ExprArg, crate_path, expr_arg, ident_value, string_lit};
use crate::common::options::{self, Form, OptionSet, Options, Required, Value, opt, req};
use crate::common::store_arg::{self, RECORD_STORES, StoreSpec};

/// Default `ttl`: seven days (`idem::DEFAULT_TTL`; docs/DESIGN.md, *Expiry, result ttl and tombstones*).
pub(crate) const DEFAULT_TTL_MS: u64 = 7 * 24 * 3_600_000;
/// Default `lease`: thirty seconds.
pub(crate) const DEFAULT_LEASE_MS: u64 = 30_000;
/// Longest accepted `biz`, in bytes (the runtime's `DEFAULT_MAX_BIZ_LEN`, in the same unit).
pub(crate) const MAX_BIZ_BYTES: usize = 32;
/// Longest `tx_idle`: 24 days (the runtime's `MAX_TX_IDLE_TIMEOUT`, in the same unit).
pub(crate) const MAX_TX_IDLE_MS: u64 = 24 * 86_400_000;
/// A complete attribute, shown whenever a required option is missing.
pub(crate) const EXAMPLE: &str =
    r#"#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite")]"#;

/// The options of `#[idempotent]`, in the order messages list them.
const OPTIONS: OptionSet = OptionSet {
    macro_name: "#[idempotent]",
    options: &[
        opt("biz", Form::Value, r#"biz = "PAY""#),
        opt("key", Form::Value, r#"key = "req.order_no""#),
        opt("store", Form::Value, r#"store = "sqlite""#),
        opt("ttl", Form::Value, r#"ttl = "7d""#),
        opt("result_ttl", Form::Value, r#"result_ttl = "1d""#),
        opt("lease", Form::Value, r#"lease = "30s""#),
        opt("fingerprint", Form::Value, r#"fingerprint = "req""#),
        opt(
            "on_in_progress",
            Form::Value,
            r#"on_in_progress = "wait(5s)""#,
        ),
        opt("tx", Form::Value, r#"tx = "tx""#),
        opt("heartbeat", Form::Value, r#"heartbeat = "10s""#),
        opt("store_timeout", Form::Value, r#"store_timeout = "10s""#),
        opt("tx_idle", Form::Value, r#"tx_idle = "30s""#),
        opt(
            "recover",
            Form::Value,
            r#"recover = "find_payment(&req.order_no)""#,
        ),
        opt("crate", Form::Value, r#"crate = "::idem""#),
    ],
};

/// How `name` is written, for messages.
fn example(name: &str) -> &'static str {
    OPTIONS
        .options
        .iter()
        .find(|def| def.name == name)
        .map_or("", |def| def.example)
}

/// A duration option, already converted to milliseconds.
pub(crate) struct DurationArg {
    pub(crate) millis: u64,
    pub(crate) lit: LitStr,
}

/// `on_in_progress`: what a repeat does while the first call is still running.
pub(crate) enum InProgress {
    /// Answer `IdemError::InProgress` at once (the default).
    Reject,
    /// Wait up to this long for the first call to finish, then replay its result.
    Wait(DurationArg),
}

/// Everything `#[idempotent(...)]` was given, plus every error found while parsing it.
///
/// An option that was given but invalid is `None` here and has an error in `errors`.
pub(crate) struct IdempotentArgs {
    pub(crate) biz: Option<LitStr>,
    pub(crate) key: Option<ExprArg>,
    pub(crate) store: Option<StoreSpec>,
    pub(crate) ttl: Option<DurationArg>,
    /// `result_ttl = "1d"`: how long the result is kept for replay, when shorter than `ttl`.
    pub(crate) result_ttl: Option<DurationArg>,
    pub(crate) lease: Option<DurationArg>,
    pub(crate) fingerprint: Option<ExprArg>,
    pub(crate) on_in_progress: Option<InProgress>,
    /// The transaction parameter, spanned at the literal that named it.
    pub(crate) tx: Option<Ident>,
    /// `heartbeat = "10s"`: renew the lease this often while the body runs; `heartbeat = "off"`:
    /// never (the default is a third of the lease).
    pub(crate) heartbeat: Option<HeartbeatArg>,
    /// `store_timeout = "2s"`: the bound on each of the call's store steps.
    pub(crate) store_timeout: Option<DurationArg>,
    /// `tx_idle = "30s"`: how long the transaction may sit idle once it holds the claim before
    /// the server ends it; `tx_idle = "off"`: no bound (the default is the lease).
    pub(crate) tx_idle: Option<HeartbeatArg>,
    /// `recover = "find_payment(&req.order_no)"`: asked before a takeover re-runs the body.
    pub(crate) recover: Option<ExprArg>,
    pub(crate) krate: Option<Path>,
    pub(crate) errors: Errors,
}

impl Parse for IdempotentArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut options = options::parse(input, &OPTIONS)?;
        let mut args = IdempotentArgs {
            biz: None,
            key: None,
            store: None,
            ttl: None,
            result_ttl: None,
            lease: None,
            fingerprint: None,
            on_in_progress: None,
            tx: None,
            heartbeat: None,
            store_timeout: None,
            tx_idle: None,
            recover: None,
            krate: None,
            errors: std::mem::take(&mut options.errors),
        };
        let mut store_span = None;
        for given in std::mem::take(&mut options.given) {
            if given.name == "store" {
                store_span = Some(given.span);
            }
            let Value::Expr(value) = given.value else {
                continue;
            };
            let (name, errors) = (given.name, &mut args.errors);
            match name {
                "biz" => {
                    args.biz = string_lit(name, example(name), &value, errors)
                        .and_then(|lit| check_biz(lit, errors))
                }
                "key" => args.key = expr_arg(name, example(name), value, errors),
                "fingerprint" => args.fingerprint = expr_arg(name, example(name), value, errors),
                "recover" => args.recover = expr_arg(name, example(name), value, errors),
                "store" => args.store = store_arg::store(value, &RECORD_STORES, errors),
                "heartbeat" => args.heartbeat = heartbeat_arg(&value, errors),
                "tx_idle" => args.tx_idle = tx_idle_arg(&value, errors),
                "ttl" | "result_ttl" | "lease" | "store_timeout" => {
                    let duration = duration_arg(name, &value, errors);
                    match name {
                        "ttl" => args.ttl = duration,
                        "result_ttl" => args.result_ttl = duration,
                        "lease" => args.lease = duration,
                        _ => args.store_timeout = duration,
                    }
                }
                "on_in_progress" => {
                    args.on_in_progress = string_lit(name, example(name), &value, errors)
                        .and_then(|lit| in_progress(lit, errors))
                }
                "tx" => args.tx = tx(&value, errors),
                _ => args.krate = crate_path(&value, errors),
            }
        }
        args.check_missing(&options);
        args.check_store_with_tx(&options, store_span);
        args.check_ttl_outlives_lease(&options);
        args.check_result_ttl(&options);
        args.check_heartbeat(&options);
        args.check_tx_idle(&options);
        args.check_recover(&options);
        Ok(args)
    }
}

/// `biz`: non-empty, at most 32 bytes (the limit the store enforces, in the same unit), no
/// whitespace.
fn check_biz(lit: LitStr, errors: &mut Errors) -> Option<LitStr> {
    let value = lit.value();
    let bytes = value.len();
    let problem = if value.is_empty() {
        "`biz` is empty; name the business action, e.g. `biz = \"PAY\"`".to_owned()
    } else if value.chars().any(char::is_whitespace) {
        format!(
            "`biz` must not contain whitespace, but `{}` does; join the words with `_`, e.g. `biz = \"{}\"`",
            value.escape_default(),
            value.split_whitespace().collect::<Vec<_>>().join("_"),
        )
    } else if bytes > MAX_BIZ_BYTES {
        format!(
            "`biz` is {bytes} bytes long in UTF-8; keep it at most {MAX_BIZ_BYTES} bytes (the store's limit: it is stored with every record), e.g. `biz = \"PAY\"`"
        )
    } else {
        return Some(lit);
    };
    errors.at(lit.span(), problem);
    None
}

/// `ttl` / `result_ttl` / `lease` / `store_timeout`: `"7d"`, `"30s"`, ….
fn duration_arg(name: &str, value: &Expr, errors: &mut Errors) -> Option<DurationArg> {
    duration_arg_hinted(name, value, errors, "")
}

/// [`duration_arg`], with `hint` after the error's explanation.
fn duration_arg_hinted(
    name: &str,
    value: &Expr,
    errors: &mut Errors,
    hint: &str,
) -> Option<DurationArg> {
    let lit = string_lit(name, example(name), value, errors)?;
    match duration::parse_millis(&lit.value()) {
        Ok(millis) => Some(DurationArg { millis, lit }),
        Err(error) => {
            errors.at(
                lit.span(),
                format!(
                    "invalid `{name}` duration `\"{}\"`: {error}{hint}",
                    lit.value().escape_default()
                ),
            );
            None
        }
    }
}

/// `heartbeat = "…"`: a period, or `"off"`.
pub(crate) enum HeartbeatArg {
    Every(DurationArg),
    Off(LitStr),
}

impl HeartbeatArg {
    pub(crate) fn lit(&self) -> &LitStr {
        match self {
            HeartbeatArg::Every(every) => &every.lit,
            HeartbeatArg::Off(lit) => lit,
        }
    }
}

fn heartbeat_arg(value: &Expr, errors: &mut Errors) -> Option<HeartbeatArg> {
    if let Some(lit) = crate::common::expr_arg::as_lit_str(value)
        && lit.value() == "off"
    {
        return Some(HeartbeatArg::Off(lit.clone()));
    }
    duration_arg_hinted(
        "heartbeat",
        value,
        errors,
        "; or `heartbeat = \"off\"` to never renew the lease",
    )
    .map(HeartbeatArg::Every)
}

/// `tx_idle = "…"`: a duration, or `"off"`.
fn tx_idle_arg(value: &Expr, errors: &mut Errors) -> Option<HeartbeatArg> {
    if let Some(lit) = crate::common::expr_arg::as_lit_str(value)
        && lit.value() == "off"
    {
        return Some(HeartbeatArg::Off(lit.clone()));
    }
    duration_arg_hinted(
        "tx_idle",
        value,
        errors,
        "; or `tx_idle = \"off\"` for no bound",
    )
    .map(HeartbeatArg::Every)
}

/// `on_in_progress`: `"reject"` or `"wait(5s)"`.
fn in_progress(lit: LitStr, errors: &mut Errors) -> Option<InProgress> {
    let value = lit.value();
    if value == "reject" {
        return Some(InProgress::Reject);
    }
    if let Some(inner) = value
        .strip_prefix("wait(")
        .and_then(|rest| rest.strip_suffix(')'))
    {
        return match duration::parse_millis(inner) {
            Ok(millis) => Some(InProgress::Wait(DurationArg { millis, lit })),
            Err(error) => {
                errors.at(
                    lit.span(),
                    format!(
                        "invalid duration `{}` in `on_in_progress = \"wait(..)\"`: {error}",
                        inner.escape_default()
                    ),
                );
                None
            }
        };
    }
    errors.at(
        lit.span(),
        format!(
            "unknown `on_in_progress` value `\"{}\"`; the choices are `\"reject\"` (the default: answer \
             `IdemError::InProgress` at once) and `\"wait(<duration>)\"` (wait for the first call to finish, \
             e.g. `\"wait(5s)\"`)",
            value.escape_default()
        ),
    );
    None
}

/// `tx = "tx"` (or `tx = tx`): the name of the transaction parameter.
fn tx(value: &Expr, errors: &mut Errors) -> Option<Ident> {
    let ident = ident_value(value);
    if ident.is_some() {
        return ident;
    }
    errors.spanned(
        value,
        "`tx` takes the name of the transaction parameter, e.g. `tx = \"tx\"` for `tx: &mut idem::SqliteTx` \
         (or `idem::MySqlTx`, `idem::PgTx`)",
    );
    None
}

impl IdempotentArgs {
    /// One error naming every required option that is absent, with a complete example. `store` is
    /// not needed with `tx`: the transaction carries its store.
    fn check_missing(&mut self, options: &Options) {
        const BIZ: Required = req("biz", "`biz` names the business action");
        const KEY: Required = req(
            "key",
            "`key` is the caller's idempotency key, built from the parameters",
        );
        const STORE: Required = req("store", "`store` says where records live");
        let required: &[Required] = if options.has("tx") {
            &[BIZ, KEY]
        } else {
            &[BIZ, KEY, STORE]
        };
        if let Some(error) = options.missing_error(&OPTIONS, required, EXAMPLE) {
            self.errors.push(error);
        }
    }

    /// With `tx`, the store is the one the transaction was begun on, by construction; a `store`
    /// beside it could only disagree.
    fn check_store_with_tx(&mut self, options: &Options, store_span: Option<Span>) {
        if !options.has("tx") {
            return;
        }
        if let Some(span) = store_span {
            self.errors.at(
                span,
                "with `tx`, the records go to the store the transaction was begun on \
                 (`store.begin()`), so `store` is not needed; remove `store = …`",
            );
            self.store = None;
        }
    }

    /// A heartbeat renews the lease while the body runs: it must beat more often than the lease
    /// runs out, and it has nothing to renew in a transaction (the claim is not visible to others
    /// before the commit).
    fn check_heartbeat(&mut self, options: &Options) {
        let Some(heartbeat) = &self.heartbeat else {
            return;
        };
        if options.has("tx") {
            self.errors.at(
                heartbeat.lit().span(),
                "`heartbeat` cannot be combined with `tx`: a claim in a transaction is invisible to \
                 other calls until the commit, so there is no lease to renew; remove `heartbeat`",
            );
            return;
        }
        let HeartbeatArg::Every(heartbeat) = heartbeat else {
            return;
        };
        if options.has("lease") && self.lease.is_none() {
            return;
        }
        let lease = self.lease.as_ref().map_or(DEFAULT_LEASE_MS, |l| l.millis);
        if heartbeat.millis >= lease {
            self.errors.at(
                heartbeat.lit.span(),
                format!(
                    "`heartbeat` ({}) must be shorter than `lease` ({}): each beat renews the lease \
                     before it runs out; a third of the lease is usual, e.g. `heartbeat = \"{}\"`",
                    duration::format_millis(heartbeat.millis),
                    duration::format_millis(lease),
                    duration::format_millis((lease / 3).max(1)),
                ),
            );
        }
    }

    /// `tx_idle` bounds the idle time of the call's transaction: only with `tx`, and at most
    /// what both servers take (24 days).
    fn check_tx_idle(&mut self, options: &Options) {
        let Some(idle) = &self.tx_idle else {
            return;
        };
        if !options.has("tx") {
            self.errors.at(
                idle.lit().span(),
                "`tx_idle` needs `tx`: it bounds how long the call's transaction may sit idle \
                 while it holds the claim; a lease-mode call holds no transaction (its lease \
                 bounds a silent holder); remove `tx_idle` or add `tx = \"tx\"`",
            );
            self.tx_idle = None;
            return;
        }
        if let HeartbeatArg::Every(every) = idle
            && every.millis > MAX_TX_IDLE_MS
        {
            self.errors.at(
                every.lit.span(),
                format!(
                    "`tx_idle` ({}) is longer than the maximum of 24d (idem::MAX_TX_IDLE_TIMEOUT; \
                     Postgres takes at most about 24.8 days); use `tx_idle = \"off\"` for no bound",
                    duration::format_millis(every.millis),
                ),
            );
            self.tx_idle = None;
        }
    }

    /// `recover` is asked before a takeover re-runs the body: there is none in a transaction (a
    /// claim that dies rolls back with the business writes), and it must call a fn with what
    /// identifies the action, not name one.
    fn check_recover(&mut self, options: &Options) {
        let Some(recover) = &self.recover else {
            return;
        };
        if options.has("tx") {
            self.errors.spanned(
                recover.error_tokens(),
                "`recover` cannot be combined with `tx`: in a transaction the claim, the business \
                 writes and the mark commit or roll back together, so no record is ever left with \
                 an effect and no mark; remove `recover`",
            );
            self.recover = None;
            return;
        }
        if let Expr::Path(path) = &recover.expr {
            let name = crate::common::diag::path_to_string(&path.path);
            self.errors.spanned(
                recover.error_tokens(),
                format!(
                    "`recover` must call `{name}` with what identifies the action, e.g. \
                     `recover = \"{name}(&req.order_no)\"`: idem calls it when it takes over a \
                     claim whose holder did not finish"
                ),
            );
            self.recover = None;
        }
    }

    /// A result is kept at most as long as its record: `result_ttl` no longer than `ttl`.
    fn check_result_ttl(&mut self, options: &Options) {
        let Some(result_ttl) = &self.result_ttl else {
            return;
        };
        if options.has("ttl") && self.ttl.is_none() {
            return;
        }
        let ttl = self.ttl.as_ref().map_or(DEFAULT_TTL_MS, |ttl| ttl.millis);
        if result_ttl.millis <= ttl {
            return;
        }
        let ttl_text = match &self.ttl {
            Some(_) => duration::format_millis(ttl),
            None => format!("{}, the default", duration::format_millis(ttl)),
        };
        self.errors.at(
            result_ttl.lit.span(),
            format!(
                "`result_ttl` ({}) must not be longer than `ttl` ({ttl_text}): a result is kept at \
                 most as long as its record, and the record (the key's uniqueness) lives `ttl`; \
                 raise `ttl` to at least `\"{}\"`, or lower `result_ttl`",
                duration::format_millis(result_ttl.millis),
                duration::format_millis(result_ttl.millis),
            ),
        );
        self.result_ttl = None;
    }

    /// The record must outlive the lease that protects it, else a slow first call loses its record.
    fn check_ttl_outlives_lease(&mut self, options: &Options) {
        // An option given but invalid has its own error already.
        if (options.has("ttl") && self.ttl.is_none())
            || (options.has("lease") && self.lease.is_none())
        {
            return;
        }
        let ttl = self.ttl.as_ref().map_or(DEFAULT_TTL_MS, |ttl| ttl.millis);
        let lease = self
            .lease
            .as_ref()
            .map_or(DEFAULT_LEASE_MS, |lease| lease.millis);
        if ttl > lease {
            return;
        }
        let describe = |arg: &Option<DurationArg>, millis| match arg {
            Some(_) => duration::format_millis(millis),
            None => format!("{}, the default", duration::format_millis(millis)),
        };
        let message = format!(
            "`ttl` ({}) must be longer than `lease` ({}): the record must outlive the lease that protects \
             it; raise `ttl` or lower `lease`",
            describe(&self.ttl, ttl),
            describe(&self.lease, lease),
        );
        let span = match (&self.ttl, &self.lease) {
            (Some(ttl), _) => ttl.lit.span(),
            (None, Some(lease)) => lease.lit.span(),
            (None, None) => Span::call_site(),
        };
        self.errors.at(span, message);
    }
}
