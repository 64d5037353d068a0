//! `#[state_transition(from = "WAIT_PAY", to = "PAID", …)]`: parse, check against the fn, generate.
//!
//! What only the machine knows (its table, columns, states and edges) is checked by the generated code at
//! compile time: state names through the machine's hidden `States` consts (rustc's "similar name" help
//! for a typo) and edges, terminal states, the key column and the version column through `const`
//! assertions whose panic messages name the states and the fix. The SQL is built by a `const fn` of the
//! runtime from the machine's consts.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{
    Expr, ExprLit, FnArg, GenericArgument, Ident, ItemFn, Lit, LitStr, Pat, Path, PathArguments,
    Token, Type,
};

use crate::common::diag::{self, Errors};
use crate::state_machine::is_sql_ident;

const OPTIONS: [&str; 12] = [
    "from", "to", "machine", "key", "set", "now", "match", "version", "tx", "store", "crate", "",
];
const EXAMPLE: &str = r#"#[state_transition(from = "WAIT_PAY", to = "PAID")]"#;

fn option_names() -> impl Iterator<Item = &'static str> {
    OPTIONS.into_iter().filter(|name| !name.is_empty())
}

/// A state name as written, spanned at its literal.
#[derive(Clone)]
struct StateName {
    name: String,
    lit: LitStr,
}

/// An expression given quoted (`key = "req.order_no"`) or bare.
#[derive(Clone)]
struct ExprArg {
    expr: Expr,
    span: Span,
}

/// One `set(col = expr)` column.
struct SetColumn {
    column: Ident,
    value: ExprArg,
}

#[derive(Default)]
struct Args {
    from: Vec<StateName>,
    to: Option<StateName>,
    machine: Option<Path>,
    key: Option<ExprArg>,
    set: Vec<SetColumn>,
    now: Option<LitStr>,
    matches: Vec<Ident>,
    version: Option<ExprArg>,
    tx: Option<LitStr>,
    store: Option<LitStr>,
    krate: Option<Path>,
    seen: Vec<String>,
    errors: Errors,
}

impl Parse for Args {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            if let Err(error) = parse_one(input, &mut args) {
                args.errors.push(error);
                while !input.is_empty() && !input.peek(Token![,]) {
                    input.parse::<proc_macro2::TokenTree>()?;
                }
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

fn parse_one(input: ParseStream, args: &mut Args) -> syn::Result<()> {
    let name = <Ident as syn::ext::IdentExt>::parse_any(input)?;
    let key = name.to_string();
    if !option_names().any(|option| option == key) {
        let did_you_mean = diag::did_you_mean_clause(&key, option_names());
        args.errors.at(
            name.span(),
            format!(
                "unknown option `{key}` in `#[state_transition]`{did_you_mean} the options are {}",
                diag::backticked(option_names())
            ),
        );
        while !input.is_empty() && !input.peek(Token![,]) {
            input.parse::<proc_macro2::TokenTree>()?;
        }
        return Ok(());
    }
    if args.seen.contains(&key) {
        args.errors.at(
            name.span(),
            format!("duplicate option `{key}`; each option may be given once, remove this one"),
        );
    }
    args.seen.push(key.clone());
    match key.as_str() {
        "set" => {
            let content;
            syn::parenthesized!(content in input);
            let columns =
                Punctuated::<(Ident, Expr), Token![,]>::parse_terminated_with(&content, |input| {
                    let column: Ident = input.parse()?;
                    input.parse::<Token![=]>()?;
                    Ok((column, input.parse()?))
                })?;
            for (column, value) in columns {
                check_column(&column.to_string(), column.span(), "set", &mut args.errors);
                let value = expr_arg(value)?;
                args.set.push(SetColumn { column, value });
            }
        }
        "match" => {
            let content;
            syn::parenthesized!(content in input);
            let columns = Punctuated::<Ident, Token![,]>::parse_terminated_with(
                &content,
                <Ident as syn::ext::IdentExt>::parse_any,
            )?;
            args.matches.extend(columns);
        }
        _ => {
            if !input.peek(Token![=]) {
                return Err(syn::Error::new(
                    name.span(),
                    format!("`{key}` needs a value, e.g. `{EXAMPLE}`"),
                ));
            }
            input.parse::<Token![=]>()?;
            let value: Expr = input.parse()?;
            match key.as_str() {
                "from" => match &value {
                    Expr::Array(array) => {
                        for elem in &array.elems {
                            args.from.push(state_name(elem)?);
                        }
                        if array.elems.is_empty() {
                            args.errors
                                .spanned(array, "`from = []` lists no state; name at least one");
                        }
                    }
                    _ => args.from.push(state_name(&value)?),
                },
                "to" => args.to = Some(state_name(&value)?),
                "machine" => args.machine = Some(path_arg(&value)?),
                "crate" => args.krate = Some(path_arg(&value)?),
                "key" => args.key = Some(expr_arg(value)?),
                "version" => args.version = Some(expr_arg(value)?),
                "now" => {
                    let lit = lit_str(&value, "now = \"paid_at\"")?;
                    check_column(&lit.value(), lit.span(), "now", &mut args.errors);
                    args.now = Some(lit);
                }
                "tx" => args.tx = Some(lit_str(&value, "tx = \"tx\"")?),
                "store" => args.store = Some(lit_str(&value, "store = \"sqlite\"")?),
                _ => unreachable!("every option is handled"),
            }
        }
    }
    Ok(())
}

fn check_column(name: &str, span: Span, option: &str, errors: &mut Errors) {
    if !is_sql_ident(name) {
        errors.at(
            span,
            format!(
                "`{name}` in `{option}` is not a SQL column name idem can write unquoted; use \
                 `[A-Za-z_][A-Za-z0-9_]*`"
            ),
        );
    }
}

fn lit_str(value: &Expr, example: &str) -> syn::Result<LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(lit.clone()),
        other => Err(syn::Error::new_spanned(
            other,
            format!("expected a string literal, e.g. `{example}`"),
        )),
    }
}

fn state_name(value: &Expr) -> syn::Result<StateName> {
    let lit = lit_str(value, r#"from = "WAIT_PAY""#)?;
    let name = lit.value();
    if !is_sql_ident(&name) || syn::parse_str::<Ident>(&name).is_err() {
        return Err(syn::Error::new_spanned(
            &lit,
            format!(
                "`{name}` is not a state name; state names are stored words such as `WAIT_PAY`"
            ),
        ));
    }
    Ok(StateName { name, lit })
}

fn path_arg(value: &Expr) -> syn::Result<Path> {
    match value {
        Expr::Path(path) if path.qself.is_none() => Ok(path.path.clone()),
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => lit.parse(),
        other => Err(syn::Error::new_spanned(
            other,
            "expected a path, e.g. `machine = OrderStatus`",
        )),
    }
}

fn expr_arg(value: Expr) -> syn::Result<ExprArg> {
    match &value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(ExprArg {
            expr: lit.parse()?,
            span: lit.span(),
        }),
        _ => Ok(ExprArg {
            span: value.span(),
            expr: value,
        }),
    }
}

/// The checked attribute.
struct Spec {
    args: Args,
    from: Vec<StateName>,
    to: StateName,
    /// `Some(param)` in tx mode, else the store name.
    tx: Option<Ident>,
    store: Option<LitStr>,
    /// The key expression, and whether it was defaulted to the first parameter (checked against the
    /// machine's key column at compile time).
    key: ExprArg,
    key_defaulted: Option<String>,
    ok_ty: Type,
    err_ty: Type,
}

/// `#[state_transition(args)] item`: on error the fn as written plus every error.
pub(crate) fn attribute(args: TokenStream, item: TokenStream) -> TokenStream {
    match try_attribute(args, item.clone()) {
        Ok(expanded) => expanded,
        Err(error) => {
            let errors = error.into_compile_error();
            let item = fallback(item);
            quote!(#item #errors)
        }
    }
}

/// The fn as written, for callers, when the attribute is wrong. Its body returns `Result<T, E>` while
/// the fn returns `Result<Transition<T, S>, E>`, so emitting it verbatim would add a type error that is
/// not the user's: the body is kept (and type-checked) in an async block that is never run.
fn fallback(item: TokenStream) -> TokenStream {
    let Ok(item_fn) = syn::parse2::<ItemFn>(item.clone()) else {
        return item;
    };
    let (Some((ok_ty, err_ty)), Some(_)) =
        (transition_types(&item_fn.sig.output), item_fn.sig.asyncness)
    else {
        return item;
    };
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
        ..
    } = &item_fn;
    let stmts = &block.stmts;
    let body_ty = quote!(::core::result::Result<#ok_ty, #err_ty>);
    let (outer_attrs, inner_attrs) = crate::common::diag::outer_and_inner(attrs);
    quote! {
        #(#outer_attrs)*
        #vis #sig {
            #(#inner_attrs)*
            #[allow(unreachable_code, clippy::diverging_sub_expression, clippy::empty_loop, clippy::needless_return)]
            let _ = async {
                if false {
                    let __idem_fake_return: #body_ty = loop {};
                    return __idem_fake_return;
                }
                #(#stmts)*
            };
            ::core::unreachable!("`#[state_transition]` failed to expand")
        }
    }
}

fn try_attribute(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let args: Args = syn::parse2(args.clone())?;
    let item_fn: ItemFn = syn::parse2(item.clone()).map_err(|error| {
        syn::Error::new(
            error.span(),
            "`#[state_transition]` goes on an `async fn` with a body that returns \
             `Result<idem::Transition<T, Machine>, E>`",
        )
    })?;
    let spec = check(args, &item_fn)?;
    Ok(expand(&item_fn, &spec))
}

/// Parameter names, in order (`self` for a receiver).
fn parameters(item: &ItemFn) -> Vec<String> {
    crate::common::signature::parameters(&item.sig)
}

/// Lowercase single-name paths in `expr` that are no parameter.
struct UnknownNames<'a> {
    params: &'a [String],
    found: Vec<Ident>,
}

impl<'ast> Visit<'ast> for UnknownNames<'_> {
    fn visit_expr_path(&mut self, node: &'ast syn::ExprPath) {
        if node.qself.is_none()
            && let Some(ident) = node.path.get_ident()
        {
            let name = ident.to_string();
            if name.starts_with(|c: char| c.is_lowercase() || c == '_')
                && !self.params.contains(&name)
            {
                self.found.push(ident.clone());
            }
        }
        syn::visit::visit_expr_path(self, node);
    }
}

fn check_expr(arg: &ExprArg, option: &str, params: &[String], errors: &mut Errors) {
    let mut visitor = UnknownNames {
        params,
        found: Vec::new(),
    };
    visitor.visit_expr(&arg.expr);
    for ident in visitor.found {
        let name = ident.to_string();
        let did_you_mean = diag::did_you_mean_clause(&name, params.iter().map(String::as_str));
        errors.at(
            arg.span,
            format!(
                "`{option}` uses `{name}`, which is no parameter of the fn{did_you_mean} the \
                 parameters are {}; add the parameter or fix the name",
                diag::backticked(params.iter().map(String::as_str))
            ),
        );
    }
}

fn check(mut args: Args, item: &ItemFn) -> syn::Result<Spec> {
    let mut errors = std::mem::take(&mut args.errors);
    let attr_span = Span::call_site();
    let params = parameters(item);

    if item.sig.asyncness.is_none() {
        errors.spanned(
            item.sig.fn_token,
            "`#[state_transition]` needs an `async fn`: it awaits the database; add `async`",
        );
    }
    if args.from.is_empty() && !args.seen.iter().any(|s| s == "from") {
        errors.at(
            attr_span,
            format!("`#[state_transition]` is missing `from`, e.g. `{EXAMPLE}`"),
        );
    }
    if args.to.is_none() && !args.seen.iter().any(|s| s == "to") {
        errors.at(
            attr_span,
            format!("`#[state_transition]` is missing `to`, e.g. `{EXAMPLE}`"),
        );
    }
    if let Some(to) = &args.to {
        for from in &args.from {
            if from.name == to.name {
                errors.spanned(
                    &from.lit,
                    format!(
                        "`from` and `to` are both `{}`: a transition must change the state; a repeat \
                         of `{}` is already recognised as `Transition::AlreadyApplied`, so remove \
                         `{}` from `from`",
                        to.name, to.name, to.name
                    ),
                );
            }
        }
    }
    for (i, from) in args.from.iter().enumerate() {
        if args.from[..i].iter().any(|f| f.name == from.name) {
            errors.spanned(
                &from.lit,
                format!("`{}` is listed twice in `from`; remove one", from.name),
            );
        }
    }
    for column in &args.matches {
        if !args.set.iter().any(|set| set.column == *column) {
            let name = column.to_string();
            errors.spanned(
                column,
                format!(
                    "`match({name})` compares a column the transition sets: add `set({name} = \"…\")`"
                ),
            );
        }
    }

    // Where the update runs.
    let tx = match (&args.tx, &args.store) {
        (Some(_), Some(store)) => {
            errors.spanned(
                store,
                "give `tx = \"…\"` (the caller's transaction) or `store = \"…\"` (a transaction of \
                 its own), not both; remove one",
            );
            None
        }
        (Some(tx), None) => {
            let name = tx.value();
            if params.contains(&name) {
                Some(Ident::new(&name, tx.span()))
            } else {
                errors.spanned(
                    tx,
                    format!(
                        "`tx = \"{name}\"` names no parameter; the parameters are {}; add a \
                         `{name}: &mut sqlx::Transaction<'_, Sqlite>` parameter",
                        diag::backticked(params.iter().map(String::as_str))
                    ),
                );
                None
            }
        }
        (None, Some(_)) => None,
        // The short form: a parameter named `tx` is the transaction.
        (None, None) if params.iter().any(|p| p == "tx") => {
            Some(Ident::new("tx", Span::call_site()))
        }
        (None, None) => {
            errors.at(
                attr_span,
                "`#[state_transition]` needs a transaction: a `tx: &mut sqlx::Transaction<'_, Sqlite>` \
                 parameter (or `tx = \"name\"`), or `store = \"sqlite\"` to begin one on a registered \
                 store",
            );
            None
        }
    };

    // The key: given, or the first parameter that is not the transaction (named like the key column).
    let tx_name = tx.as_ref().map(Ident::to_string);
    let (key, key_defaulted) = match &args.key {
        Some(key) => {
            check_expr(key, "key", &params, &mut errors);
            (Some(key.clone()), None)
        }
        None => {
            let first = item.sig.inputs.iter().find_map(|input| match input {
                FnArg::Typed(typed) => match &*typed.pat {
                    Pat::Ident(pat) if Some(pat.ident.to_string()) != tx_name => {
                        Some(pat.ident.clone())
                    }
                    _ => None,
                },
                FnArg::Receiver(_) => None,
            });
            match first {
                Some(ident) => (
                    Some(ExprArg {
                        span: ident.span(),
                        expr: syn::parse_quote!(#ident),
                    }),
                    Some(ident.to_string()),
                ),
                None => {
                    errors.at(
                        attr_span,
                        "`#[state_transition]` needs the row's key: add a parameter named like the \
                         machine's key column, or `key = \"req.order_no\"`",
                    );
                    (None, None)
                }
            }
        }
    };
    for set in &args.set {
        check_expr(
            &set.value,
            &format!("set({} = …)", set.column),
            &params,
            &mut errors,
        );
    }
    if let Some(version) = &args.version {
        check_expr(version, "version", &params, &mut errors);
    }

    let types = transition_types(&item.sig.output);
    if types.is_none() {
        let span = match &item.sig.output {
            syn::ReturnType::Type(_, ty) => ty.span(),
            syn::ReturnType::Default => item.sig.ident.span(),
        };
        errors.at(
            span,
            "`#[state_transition]` needs a fn returning `Result<idem::Transition<T, Machine>, E>`; \
             its body returns `Result<T, E>` and runs only when the row moved",
        );
    }
    errors.finish()?;
    let (ok_ty, err_ty) = types.expect("checked above");
    Ok(Spec {
        from: args.from.clone(),
        to: args.to.clone().expect("checked above"),
        tx,
        store: args.store.clone(),
        key: key.expect("checked above"),
        key_defaulted,
        ok_ty,
        err_ty,
        args,
    })
}

/// `(T, E)` of `…Result<…Transition<T, S>, E>`.
fn transition_types(output: &syn::ReturnType) -> Option<(Type, Type)> {
    let syn::ReturnType::Type(_, ty) = output else {
        return None;
    };
    let args = |ty: &Type, name: &str| -> Option<Vec<Type>> {
        let Type::Path(path) = ty else { return None };
        let last = path.path.segments.last()?;
        if last.ident != name {
            return None;
        }
        let PathArguments::AngleBracketed(args) = &last.arguments else {
            return None;
        };
        Some(
            args.args
                .iter()
                .filter_map(|arg| match arg {
                    GenericArgument::Type(ty) => Some(ty.clone()),
                    _ => None,
                })
                .collect(),
        )
    };
    let result = args(ty, "Result")?;
    let [transition, err] = result.as_slice() else {
        return None;
    };
    let inner = args(transition, "Transition")?;
    let [ok, _machine] = inner.as_slice() else {
        return None;
    };
    Some((ok.clone(), err.clone()))
}

fn expand(item: &ItemFn, spec: &Spec) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
        ..
    } = item;
    let (outer_attrs, inner_attrs) = crate::common::diag::outer_and_inner(attrs);
    let stmts = &block.stmts;
    let args = &spec.args;
    let krate = match &args.krate {
        Some(path) => quote!(#path),
        None => quote!(::idem),
    };
    let private = quote!(#krate::__private);
    let (ok_ty, err_ty) = (&spec.ok_ty, &spec.err_ty);
    let machine = match &args.machine {
        Some(path) => quote!(#path),
        // The alias `#[derive(StateMachine)]` puts in the module of the enum (see there).
        None => quote!(__IdemMachine),
    };
    let to = spec.to.name.as_str();
    let from: Vec<&str> = spec.from.iter().map(|f| f.name.as_str()).collect();

    // Every state name as a path to the machine's `States` const, spanned at the literal: a typo is
    // rustc's "no associated item named `PAYED`" with "an associated constant with a similar name exists".
    let name_checks = spec
        .from
        .iter()
        .chain(std::iter::once(&spec.to))
        .map(|state| {
            let span = state.lit.span();
            // Spanned at the literal itself: rustc's "similar name" help needs the token's own span.
            let marker = Ident::new(&state.name, span);
            quote_spanned!(span=> let () = <<__IdemM as #private::Machine>::States>::#marker;)
        });
    // Edges and terminal states, by const evaluation: a panic message names both states and the fix.
    let edge_checks = spec.from.iter().map(|from_state| {
        let from = from_state.name.as_str();
        let span = from_state.lit.span();
        let terminal = format!(
            "`{from}` is a terminal state of the machine: no transition leaves it, so `{from}` → `{to}` \
             can never apply; remove `{from}` from `from`, or drop `terminal` from its `#[state(…)]`"
        );
        let undeclared = format!(
            "the machine declares no transition from `{from}` to `{to}`; add `to(…)` naming the `{to}` \
             variant to the `#[state(…)]` of `{from}`, or fix `from`/`to`"
        );
        quote_spanned! {span=>
            const _: () = {
                let m = <__IdemM as #krate::StateMachine>::STATES;
                if #private::contains(m, #from) && #private::contains(m, #to) {
                    if #private::contains(<__IdemM as #krate::StateMachine>::TERMINAL, #from) {
                        ::core::panic!(#terminal);
                    }
                    if !#private::has_edge(<__IdemM as #krate::StateMachine>::EDGES, #from, #to) {
                        ::core::panic!(#undeclared);
                    }
                }
            };
        }
    });
    let key_check = spec.key_defaulted.as_ref().map(|param| {
        let message = format!(
            "without `key = \"…\"` the first parameter, `{param}`, is the row's key and must be named \
             like the machine's key column; rename it or add `key = \"{param}\"` naming the value"
        );
        quote_spanned! {spec.key.span=>
            const _: () = if !#private::str_eq(<__IdemM as #krate::StateMachine>::KEY_COLUMN, #param) {
                ::core::panic!(#message);
            };
        }
    });
    let version_check = args.version.as_ref().map(|version| {
        quote_spanned! {version.span=>
            const _: () = if <__IdemM as #krate::StateMachine>::VERSION_COLUMN.is_none() {
                ::core::panic!("`version = …` needs the machine's version column: add `version = \"version\"` to its `#[state_machine(…)]`");
            };
        }
    });

    let set_columns: Vec<String> = args.set.iter().map(|s| s.column.to_string()).collect();
    let match_columns: Vec<String> = args.matches.iter().map(Ident::to_string).collect();
    let now = match &args.now {
        Some(now) => quote!(::core::option::Option::Some(#now)),
        None => quote!(::core::option::Option::None),
    };
    let from_count = from.len();
    let versioned = args.version.is_some();

    let bind = |value: &ExprArg| {
        let expr = &value.expr;
        quote_spanned!(value.span=> .bind(&(#expr)))
    };
    let set_binds = args.set.iter().map(|s| bind(&s.value));
    let match_binds = args.matches.iter().filter_map(|column| {
        args.set
            .iter()
            .find(|s| s.column == *column)
            .map(|s| bind(&s.value))
    });
    let key_bind = bind(&spec.key);
    let key_bind_again = key_bind.clone();
    let version_let = args.version.as_ref().map(|version| {
        let expr = &version.expr;
        quote_spanned!(version.span=> let __idem_version: i64 = #expr;)
    });
    let version_bind = versioned.then(|| quote!(.bind(__idem_version)));
    let expected_version = if versioned {
        quote!(::core::option::Option::Some(__idem_version))
    } else {
        quote!(::core::option::Option::None)
    };

    let (conn, tx_check) = match &spec.tx {
        Some(tx) => (
            quote_spanned!(tx.span()=> #private::transition_conn(&mut *#tx)),
            Some(quote_spanned!(tx.span()=> let _ = #private::transition_conn(&mut *#tx);)),
        ),
        None => (quote!(#private::transition_conn(&mut __idem_tx)), None),
    };
    let body_ty = quote!(::core::result::Result<#ok_ty, #err_ty>);
    let err_check = {
        let span = err_ty.span();
        quote_spanned!(span=> let __idem_err = #private::check_err_type::<#err_ty>();)
    };

    let core = quote! {
        async {
            if let ::core::result::Result::Err(e) = #private::transition_savepoint(#conn).await {
                return ::core::result::Result::Err(__idem_err.from_idem(e));
            }
            let __idem_rows = #private::transition_rows(
                #private::transition_query(__idem_sql.update.as_str())
                    .bind(#to)
                    #(#set_binds)*
                    #key_bind
                    #(.bind(#from))*
                    #version_bind
                    .execute(#conn)
                    .await,
            );
            match __idem_rows {
                ::core::result::Result::Ok(1) => {
                    // The row moved: run the body in the same transaction; its `Err` undoes the move.
                    let __idem_out: #body_ty = async {
                        #[allow(unreachable_code, clippy::diverging_sub_expression, clippy::empty_loop, clippy::needless_return)]
                        if false {
                            let __idem_fake_return: #body_ty = loop {};
                            return __idem_fake_return;
                        }
                        #(#stmts)*
                    }
                    .await;
                    return match __idem_out {
                        ::core::result::Result::Ok(value) => match #private::transition_release(#conn).await {
                            ::core::result::Result::Ok(()) => ::core::result::Result::Ok(#krate::Transition::Applied(value)),
                            ::core::result::Result::Err(e) => ::core::result::Result::Err(__idem_err.from_idem(e)),
                        },
                        ::core::result::Result::Err(error) => {
                            // The body's error is what the caller needs; a failed rollback-to-savepoint
                            // also fails the enclosing transaction's commit.
                            let _ = #private::transition_abort(#conn).await;
                            ::core::result::Result::Err(error)
                        }
                    };
                }
                ::core::result::Result::Ok(0) => {}
                ::core::result::Result::Ok(rows) => {
                    let _ = #private::transition_abort(#conn).await;
                    return ::core::result::Result::Err(__idem_err.from_idem(#krate::IdemError::store(
                        ::std::format!("the key matched {rows} rows; the machine's key column must be unique"),
                    )));
                }
                ::core::result::Result::Err(e) => {
                    let _ = #private::transition_abort(#conn).await;
                    return ::core::result::Result::Err(__idem_err.from_idem(e));
                }
            }
            // No row moved: read it (under the transaction's write lock) to tell why.
            let __idem_row = #private::transition_query(__idem_sql.read.as_str())
                .bind(#to)
                #(#match_binds)*
                #key_bind_again
                .fetch_optional(#conn)
                .await;
            let __idem_outcome = #private::transition_outcome::<#ok_ty, __IdemM>(
                __idem_row,
                &[#(#from),*],
                #expected_version,
            );
            if let ::core::result::Result::Err(e) = #private::transition_release(#conn).await {
                return ::core::result::Result::Err(__idem_err.from_idem(e));
            }
            __idem_outcome.map_err(|e| __idem_err.from_idem(e))
        }
    };

    let run = match &spec.store {
        None => quote!(#core.await),
        Some(store) => quote! {
            let mut __idem_tx = match #private::transition_begin(#store).await {
                ::core::result::Result::Ok(tx) => tx,
                ::core::result::Result::Err(e) => return ::core::result::Result::Err(__idem_err.from_idem(e)),
            };
            let __idem_result = #core.await;
            match __idem_result {
                ::core::result::Result::Ok(outcome) => match #private::transition_commit(__idem_tx).await {
                    ::core::result::Result::Ok(()) => ::core::result::Result::Ok(outcome),
                    ::core::result::Result::Err(e) => ::core::result::Result::Err(__idem_err.from_idem(e)),
                },
                ::core::result::Result::Err(error) => {
                    let _ = #private::transition_rollback(__idem_tx).await;
                    ::core::result::Result::Err(error)
                }
            }
        },
    };

    let docs = docs(spec, &machine);
    let sql_static = format_ident!("__IDEM_SQL");
    quote! {
        #(#outer_attrs)*
        #(#[doc = #docs])*
        #vis #sig {
            #(#inner_attrs)*
            #private::require_sqlite!();
            type __IdemM = #machine;
            #(#name_checks)*
            #(#edge_checks)*
            #key_check
            #version_check
            #tx_check
            #err_check
            #version_let
            // Built at compile time from the machine's table and columns, one string per dialect; the
            // SQLite one runs (the only backend wired today).
            static #sql_static: #krate::TransitionSql = #krate::TransitionSql::build::<__IdemM>(
                &#private::TransitionShape {
                    set: &[#(#set_columns),*],
                    now: #now,
                    matches: &[#(#match_columns),*],
                    from_count: #from_count,
                    versioned: #versioned,
                },
            );
            let __idem_sql = &#sql_static.sqlite;
            #run
        }
    }
}

/// The doc lines that show the statement (table and key/status columns come from the machine).
fn docs(spec: &Spec, machine: &TokenStream) -> Vec<String> {
    let args = &spec.args;
    let machine = machine.to_string().replace(' ', "");
    let machine = if machine == "__IdemMachine" {
        "the module's machine".to_owned()
    } else {
        format!("`{machine}`")
    };
    let from: Vec<String> = spec.from.iter().map(|f| format!("`{}`", f.name)).collect();
    let mut set = String::new();
    for column in &args.set {
        set.push_str(&format!(", {} = ?", column.column));
    }
    if let Some(now) = &args.now {
        set.push_str(&format!(", {} = CURRENT_TIMESTAMP", now.value()));
    }
    if args.version.is_some() {
        set.push_str(", {version} = {version} + 1");
    }
    let status_in = if spec.from.len() == 1 {
        "= ?".to_owned()
    } else {
        format!("IN ({})", vec!["?"; spec.from.len()].join(", "))
    };
    let version = if args.version.is_some() {
        " AND {version} = ?"
    } else {
        ""
    };
    let mut matches = String::new();
    for column in &args.matches {
        matches.push_str(&format!(" AND {column} = ?"));
    }
    let mode = match (&spec.tx, &spec.store) {
        (Some(tx), _) => format!("in the caller's transaction `{tx}` (a savepoint)"),
        (None, Some(store)) => format!(
            "in a `BEGIN IMMEDIATE` transaction on store `{}`",
            store.value()
        ),
        (None, None) => String::new(),
    };
    vec![
        String::new(),
        "# State transition".to_owned(),
        String::new(),
        format!(
            "Moves a row of {machine} from {} to `{}` {mode}; `{{table}}`, `{{key}}`, `{{status}}` and \
             `{{version}}` are the machine's `#[state_machine(…)]` names. SQLite/MySQL (`?`; Postgres \
             numbers them `$1`, `$2`, …):",
            from.join(" or "),
            spec.to.name
        ),
        String::new(),
        "```sql".to_owned(),
        format!("UPDATE {{table}} SET {{status}} = ?{set} WHERE {{key}} = ? AND {{status}} {status_in}{version}"),
        format!(
            "-- when no row changed (MySQL/Postgres add FOR UPDATE):\nSELECT {{status}}, CASE WHEN {{status}} = ?{matches} THEN 1 ELSE 0 END{} FROM {{table}} WHERE {{key}} = ?",
            if args.version.is_some() { ", {version}" } else { "" }
        ),
        "```".to_owned(),
        String::new(),
        "The exact strings per backend: `idem::TransitionSql::build::<Machine>(…)` (see `idem::TransitionSql`)."
            .to_owned(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(args: TokenStream, item: TokenStream) -> String {
        attribute(args, item).to_string()
    }

    #[test]
    fn expands_the_short_form_in_the_callers_transaction() {
        let out = expand(
            quote!(from = "WAIT_PAY", to = "PAID"),
            quote! {
                async fn pay(tx: &mut Tx<'_>, order_no: &str) -> Result<Transition<u8, S>, E> {
                    Ok(1)
                }
            },
        );
        assert!(!out.contains("compile_error"), "{out}");
        for expected in [
            "type __IdemM = __IdemMachine ;",
            "let () = << __IdemM as :: idem :: __private :: Machine > :: States > :: WAIT_PAY ;",
            ":: idem :: __private :: has_edge",
            ":: idem :: __private :: str_eq (< __IdemM as :: idem :: StateMachine > :: KEY_COLUMN , \"order_no\")",
            ":: idem :: __private :: transition_conn (& mut * tx)",
            ". bind (\"PAID\") . bind (& (order_no)) . bind (\"WAIT_PAY\") . execute",
            "let __idem_out : :: core :: result :: Result < u8 , E > = async {",
            "UPDATE {table} SET {status} = ? WHERE {key} = ? AND {status} = ?",
        ] {
            assert!(out.contains(expected), "missing `{expected}` in\n{out}");
        }
        assert!(!out.contains("transition_begin"), "{out}");
    }

    /// The docs render the statements by hand (the macro cannot see the machine's table); this
    /// pins that rendering to what `idem::TransitionSql` builds and runs.
    #[test]
    fn the_documented_sql_is_the_sql_that_runs() {
        use idem_runtime::StateMachine;

        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        struct Orders;
        impl StateMachine for Orders {
            const NAME: &'static str = "Orders";
            const TABLE: &'static str = "orders";
            const KEY_COLUMN: &'static str = "order_no";
            const STATUS_COLUMN: &'static str = "status";
            const VERSION_COLUMN: Option<&'static str> = Some("version");
            const STATES: &'static [&'static str] = &["WAIT_PAY", "PAY_FAILED", "PAID"];
            const TERMINAL: &'static [&'static str] = &[];
            const EDGES: &'static [(&'static str, &'static str)] = &[];
            fn as_str(self) -> &'static str {
                "PAID"
            }
            fn parse(_: &str) -> Option<Self> {
                None
            }
        }

        let out = expand(
            quote!(
                from = ["WAIT_PAY", "PAY_FAILED"],
                to = "PAID",
                set(trade_no = "trade_no"),
                now = "paid_at",
                match(trade_no),
                version = "v"
            ),
            quote! {
                async fn pay(tx: &mut Tx<'_>, order_no: &str, trade_no: &str, v: i64)
                    -> Result<Transition<(), S>, E> { Ok(()) }
            },
        );
        let documented = |start: &str| {
            let at = out
                .find(start)
                .unwrap_or_else(|| panic!("no `{start}` in the docs:\n{out}"));
            let text = &out[at..];
            text[..text.find('"').expect("the doc string ends")]
                .replace("{table}", "orders")
                .replace("{status}", "status")
                .replace("{key}", "order_no")
                .replace("{version}", "version")
        };
        let built = idem_runtime::TransitionSql::build::<Orders>(
            &idem_runtime::__private::TransitionShape {
                set: &["trade_no"],
                now: Some("paid_at"),
                matches: &["trade_no"],
                from_count: 2,
                versioned: true,
            },
        );
        assert_eq!(documented("UPDATE {table}"), built.sqlite.update.as_str());
        assert_eq!(documented("SELECT {status}"), built.sqlite.read.as_str());
    }

    #[test]
    fn expands_every_option_in_a_transaction_of_its_own() {
        let out = expand(
            quote!(
                machine = crate::OrderStatus,
                from = ["WAIT_PAY", "PAY_FAILED"],
                to = "PAID",
                key = "cb.order_no",
                set(trade_no = "cb.trade_no"),
                now = "paid_at",
                match(trade_no),
                version = "v",
                store = "sqlite"
            ),
            quote! {
                async fn pay(cb: &Cb, v: i64) -> Result<Transition<(), S>, E> { Ok(()) }
            },
        );
        assert!(!out.contains("compile_error"), "{out}");
        for expected in [
            "type __IdemM = crate :: OrderStatus ;",
            ":: idem :: __private :: transition_begin (\"sqlite\")",
            "set : & [\"trade_no\"] , now : :: core :: option :: Option :: Some (\"paid_at\") , matches : & [\"trade_no\"] , from_count : 2usize , versioned : true",
            ". bind (\"PAID\") . bind (& (cb . trade_no)) . bind (& (cb . order_no)) . bind (\"WAIT_PAY\") . bind (\"PAY_FAILED\") . bind (__idem_version)",
            "let __idem_version : i64 = v ;",
            "UPDATE {table} SET {status} = ?, trade_no = ?, paid_at = CURRENT_TIMESTAMP, {version} = {version} + 1 WHERE {key} = ? AND {status} IN (?, ?) AND {version} = ?",
            "transition_commit (__idem_tx)",
        ] {
            assert!(out.contains(expected), "missing `{expected}` in\n{out}");
        }
    }

    #[test]
    fn a_bad_attribute_keeps_the_fn_callable() {
        let out = expand(
            quote!(fro = "WAIT_PAY", to = "WAIT_PAY"),
            quote! {
                async fn pay(tx: &mut Tx<'_>, order_no: &str) -> Result<Transition<u8, S>, E> {
                    Ok(1)
                }
            },
        );
        // unknown `fro`, missing `from`
        assert_eq!(out.matches("compile_error").count(), 2, "{out}");
        assert!(out.contains("async fn pay (tx : & mut Tx < '_ > , order_no : & str) -> Result < Transition < u8 , S > , E >"), "{out}");
        assert!(!out.contains("__IdemM "), "{out}");
    }
}
