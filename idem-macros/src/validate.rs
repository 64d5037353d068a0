//! Checks of the attribute against the fn it is on: the signature (async, returns `Result`), and the
//! expressions of `key`, `fingerprint` and `tx` against the fn's parameters.
//!
//! The output is a [`Spec`]: everything code generation needs, with no `Option` left to unwrap.

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::visit::{self, Visit};
use syn::{
    Expr, ExprAwait, ExprCall, ExprClosure, ExprMacro, ExprMethodCall, ExprPath, FnArg,
    GenericArgument, Ident, ItemFn, LitStr, Local, Pat, Path, PathArguments, ReturnType, Signature,
    Type,
};

use crate::args::{self, ExprArg, IdempotentArgs, InProgress, StoreSpec};
use crate::diag::{self, Errors};

/// Everything the expansion needs, checked.
pub(crate) struct Spec {
    pub(crate) biz: LitStr,
    pub(crate) key: Expr,
    pub(crate) store: StoreSpec,
    pub(crate) ttl_ms: u64,
    pub(crate) lease_ms: u64,
    pub(crate) fingerprint: Option<Expr>,
    /// `on_in_progress = "wait(..)"`, in milliseconds, with the literal's span.
    pub(crate) wait: Option<(u64, Span)>,
    pub(crate) tx: Option<Ident>,
    /// `crate = "…"`, or `None` for `::idem`.
    pub(crate) krate: Option<Path>,
    pub(crate) ret: ResultShape,
}

/// The fn's return type, `Result<T, E>` (or a one-argument alias such as `anyhow::Result<T>`).
pub(crate) struct ResultShape {
    pub(crate) ret_ty: Type,
    pub(crate) ok_ty: Type,
    /// `None` for a one-argument alias: its error type is not written in the signature.
    pub(crate) err_ty: Option<Type>,
}

/// Names that return a new value on every call, so a key built with them changes on every retry.
const FRESH_VALUE_FNS: [&str; 6] = ["new_v4", "now_v7", "new_v7", "random", "thread_rng", "rng"];
/// Clocks: `<clock>::now()` differs on every retry.
const CLOCKS: [&str; 6] = [
    "SystemTime",
    "Instant",
    "Utc",
    "Local",
    "OffsetDateTime",
    "Timestamp",
];

/// Checks `args` against `item`; every error found, in the order the user reads them.
pub(crate) fn check(args: IdempotentArgs, item: &ItemFn) -> syn::Result<Spec> {
    let IdempotentArgs {
        biz,
        key,
        store,
        ttl,
        lease,
        fingerprint,
        on_in_progress,
        tx,
        krate,
        mut errors,
        tokens: _,
    } = args;

    let ret = check_signature(&item.sig, &mut errors);
    let params = parameters(&item.sig);
    let fn_name = item.sig.ident.to_string();
    if let Some(key) = &key {
        check_expr_arg(key, Role::Key, &params, &fn_name, &mut errors);
    }
    if let Some(fingerprint) = &fingerprint {
        check_expr_arg(
            fingerprint,
            Role::Fingerprint,
            &params,
            &fn_name,
            &mut errors,
        );
    }
    if let Some(tx) = &tx {
        check_tx(tx, &params, &fn_name, &mut errors);
        if let Some(InProgress::Wait(wait)) = &on_in_progress {
            // Waiting inside the transaction would hold its locks while the other call needs them.
            errors.at(
                wait.lit.span(),
                "`on_in_progress = \"wait(..)\"` cannot be combined with `tx`: a duplicate in a \
                 transaction already waits on the record's lock and then replays; remove `on_in_progress`",
            );
        }
    }
    if let Some(StoreSpec::Given(expr)) = &store {
        check_store_expr(expr, &params, &mut errors);
    }
    errors.finish()?;

    match (biz, key, store, ret) {
        (Some(biz), Some(key), Some(store), Some(ret)) => Ok(Spec {
            biz,
            key: emitted(key),
            store,
            ttl_ms: ttl.map_or(args::DEFAULT_TTL_MS, |ttl| ttl.millis),
            lease_ms: lease.map_or(args::DEFAULT_LEASE_MS, |lease| lease.millis),
            fingerprint: fingerprint.map(emitted),
            wait: match on_in_progress {
                Some(InProgress::Wait(wait)) => Some((wait.millis, wait.lit.span())),
                Some(InProgress::Reject) | None => None,
            },
            tx,
            krate,
            ret,
        }),
        // Unreachable: a missing option or a bad return type always records an error above.
        _ => Err(syn::Error::new(
            item.sig.ident.span(),
            "internal error in `#[idempotent]`: an option is missing but no error was recorded; please report it",
        )),
    }
}

/// The expression as it goes into the expansion (see [`diag::inside_literal`]).
fn emitted(arg: ExprArg) -> Expr {
    let Some(lit) = &arg.lit else {
        return arg.expr;
    };
    let tokens = diag::inside_literal(
        quote::ToTokens::into_token_stream(arg.expr.clone()),
        lit.span(),
    );
    syn::parse2(tokens).unwrap_or(arg.expr)
}

/// `async`, not `const`, returns `Result`.
fn check_signature(sig: &Signature, errors: &mut Errors) -> Option<ResultShape> {
    if let Some(constness) = &sig.constness {
        errors.at(
            constness.span,
            "`#[idempotent]` cannot wrap a `const fn`: claiming and storing the result are run-time work; remove `const`",
        );
    }
    if sig.asyncness.is_none() {
        errors.at(
            sig.fn_token.span,
            "`#[idempotent]` needs an `async fn`: claiming the key and storing the result await the store; add `async` before `fn`",
        );
    }
    const WANT: &str = "`#[idempotent]` needs a fn that returns `Result<T, E>` where `T: Serialize + \
        DeserializeOwned` (the result is stored and replayed) and `E: From<idem::IdemError>`";
    let ret_ty = match &sig.output {
        ReturnType::Type(_, ty) => ty,
        ReturnType::Default => {
            errors.at(
                sig.ident.span(),
                format!("{WANT}; add a return type, e.g. `-> Result<Receipt, PayError>`"),
            );
            return None;
        }
    };
    let Some((ok_ty, err_ty)) = result_arguments(ret_ty) else {
        errors.spanned(
            ret_ty,
            format!(
                "{WANT}; wrap the return type in `Result`, e.g. `-> Result<Receipt, PayError>`"
            ),
        );
        return None;
    };
    let mut concrete = true;
    for ty in std::iter::once(ok_ty).chain(err_ty) {
        if let Type::ImplTrait(_) = peel(ty) {
            errors.spanned(
                ty,
                "`#[idempotent]` needs a named type here: the result is stored and replayed, which an \
                 `impl Trait` type cannot promise; write the concrete type",
            );
            concrete = false;
        }
    }
    concrete.then(|| ResultShape {
        ret_ty: (**ret_ty).clone(),
        ok_ty: ok_ty.clone(),
        err_ty: err_ty.cloned(),
    })
}

/// `ty` without invisible groups and parentheses.
fn peel(ty: &Type) -> &Type {
    match ty {
        Type::Group(group) => peel(&group.elem),
        Type::Paren(paren) => peel(&paren.elem),
        other => other,
    }
}

/// `(T, Some(E))` for `…::Result<T, E>`, `(T, None)` for a one-argument alias `…::Result<T>`.
fn result_arguments(ty: &Type) -> Option<(&Type, Option<&Type>)> {
    let Type::Path(path) = peel(ty) else {
        return None;
    };
    if path.qself.is_some() {
        return None;
    }
    let last = path.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(arguments) = &last.arguments else {
        return None;
    };
    let types: Vec<&Type> = arguments
        .args
        .iter()
        .filter_map(|argument| match argument {
            GenericArgument::Type(ty) => Some(ty),
            _ => None,
        })
        .collect();
    match types.as_slice() {
        [ok] => Some((ok, None)),
        [ok, err] => Some((ok, Some(err))),
        _ => None,
    }
}

/// The names the fn's parameters bind (`self` for a receiver), in order.
pub(crate) fn parameters(sig: &Signature) -> Vec<String> {
    fn bind(pat: &Pat, names: &mut Vec<String>) {
        match pat {
            Pat::Ident(ident) => {
                names.push(ident.ident.to_string());
                if let Some((_, sub)) = &ident.subpat {
                    bind(sub, names);
                }
            }
            Pat::Tuple(tuple) => tuple.elems.iter().for_each(|pat| bind(pat, names)),
            Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|pat| bind(pat, names)),
            Pat::Struct(strukt) => strukt
                .fields
                .iter()
                .for_each(|field| bind(&field.pat, names)),
            Pat::Slice(slice) => slice.elems.iter().for_each(|pat| bind(pat, names)),
            Pat::Reference(reference) => bind(&reference.pat, names),
            Pat::Paren(paren) => bind(&paren.pat, names),
            Pat::Type(typed) => bind(&typed.pat, names),
            Pat::Or(or) => or.cases.iter().take(1).for_each(|pat| bind(pat, names)),
            _ => {}
        }
    }
    let mut names = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(_) => names.push("self".to_owned()),
            FnArg::Typed(typed) => bind(&typed.pat, &mut names),
        }
    }
    names
}

/// Which option an expression came from, for messages.
#[derive(Clone, Copy)]
enum Role {
    Key,
    Fingerprint,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Key => "key",
            Role::Fingerprint => "fingerprint",
        }
    }

    /// Why a value that changes on every call is wrong here.
    fn stability(self) -> &'static str {
        match self {
            Role::Key => {
                "every retry would get a new key and run again; the key must come from the caller and \
                 stay stable across retries: build it from the request (an order number, a client \
                 request id)"
            }
            Role::Fingerprint => {
                "every retry would look like a different request; the fingerprint must describe the \
                 request and stay stable across retries: hash the request parameter"
            }
        }
    }

    /// What a key or fingerprint that reads no parameter leads to.
    fn constant(self) -> &'static str {
        match self {
            Role::Key => {
                "every call would share one record; build the key from the request, e.g. `key = \"req.order_no\"`"
            }
            Role::Fingerprint => {
                "it would be the same for every request; hash the request, e.g. `fingerprint = \"req\"`"
            }
        }
    }
}

/// Checks a `key` or `fingerprint` expression against the parameters.
fn check_expr_arg(
    arg: &ExprArg,
    role: Role,
    params: &[String],
    fn_name: &str,
    errors: &mut Errors,
) {
    let mut scan = Scan {
        role,
        params,
        locals: Vec::new(),
        in_macro: 0,
        uses_parameter: false,
        reported: false,
        errors: Errors::default(),
    };
    scan.visit_expr(&arg.expr);
    if !scan.uses_parameter && !scan.reported {
        let parameters = if params.is_empty() {
            format!("`{fn_name}` has no parameters, so ")
        } else {
            format!(
                "it reads none of the parameters ({}), so ",
                diag::backticked(params.iter().map(String::as_str))
            )
        };
        scan.errors.spanned(
            arg.error_tokens(),
            format!(
                "`{}` uses no parameter of `{fn_name}`: {parameters}{}",
                role.name(),
                role.constant()
            ),
        );
    }
    errors.append(scan.errors);
}

/// Walks a key or fingerprint expression.
struct Scan<'a> {
    role: Role,
    params: &'a [String],
    /// Names bound inside the expression (closure parameters, `let`s in blocks).
    locals: Vec<String>,
    /// Inside a macro call's arguments: unknown names may be the macro's own syntax, so they are not errors.
    in_macro: usize,
    uses_parameter: bool,
    /// An unknown parameter or a value fresh on every call was reported: "uses no parameter" would only
    /// add noise to it.
    reported: bool,
    errors: Errors,
}

impl Scan<'_> {
    fn is_param(&self, name: &str) -> bool {
        self.params.iter().any(|param| param == name)
    }

    /// A lone `name` used as a value: a parameter, a local, or a typo.
    fn single_name(&mut self, ident: &Ident) {
        let name = ident.to_string();
        if self.is_param(&name) {
            self.uses_parameter = true;
            return;
        }
        let looks_like_a_variable =
            name == "self" || name.starts_with(|c: char| c.is_lowercase() || c == '_');
        if !looks_like_a_variable || self.locals.contains(&name) || self.in_macro > 0 {
            return;
        }
        self.reported = true;
        let params = self.params.iter().map(String::as_str);
        let message = if self.params.is_empty() {
            format!(
                "unknown parameter `{name}` in `{}`; the fn has no parameters: take the request as a \
                 parameter and build the {} from it",
                self.role.name(),
                self.role.name()
            )
        } else {
            format!(
                "unknown parameter `{name}` in `{}`{} the parameters are {}",
                self.role.name(),
                diag::did_you_mean_clause(&name, params.clone()),
                diag::backticked(params),
            )
        };
        self.errors.at(ident.span(), message);
    }

    /// `Uuid::new_v4`, `SystemTime::now`, `rand::random`, …
    fn fresh_path(&mut self, path: &Path) {
        let Some(last) = path.segments.last() else {
            return;
        };
        let last_name = last.ident.to_string();
        let fresh = FRESH_VALUE_FNS.contains(&last_name.as_str())
            || (last_name == "now"
                && path
                    .segments
                    .iter()
                    .any(|segment| CLOCKS.iter().any(|clock| segment.ident == clock)));
        if fresh {
            self.reported = true;
            self.errors.spanned(
                path,
                format!(
                    "`{}` returns a new value on every call, so {}",
                    diag::path_to_string(path),
                    self.role.stability()
                ),
            );
        }
    }

    /// Best effort inside a macro call (`format!("{}-{}", req.a, req.b)`): parse the arguments as
    /// expressions when they are, else look at the raw tokens.
    fn macro_tokens(&mut self, tokens: &TokenStream) {
        let parser = syn::punctuated::Punctuated::<Expr, syn::Token![,]>::parse_terminated;
        self.in_macro += 1;
        match syn::parse::Parser::parse2(parser, tokens.clone()) {
            Ok(arguments) => {
                for argument in &arguments {
                    match argument {
                        // `name = value` in `format!`: `name` is the macro's, not a variable.
                        Expr::Assign(assign) => self.visit_expr(&assign.right),
                        Expr::Lit(syn::ExprLit {
                            lit: syn::Lit::Str(lit),
                            ..
                        }) => self.inline_format_args(&lit.value()),
                        other => self.visit_expr(other),
                    }
                }
            }
            Err(_) => self.raw_tokens(tokens.clone()),
        }
        self.in_macro -= 1;
    }

    /// `format!("{req}")` reads `req`.
    fn inline_format_args(&mut self, format: &str) {
        for piece in format.split('{').skip(1) {
            let name: String = piece
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if self.is_param(&name) {
                self.uses_parameter = true;
            }
        }
    }

    fn raw_tokens(&mut self, tokens: TokenStream) {
        let mut previous_dot = false;
        for token in tokens {
            match &token {
                TokenTree::Group(group) => self.raw_tokens(group.stream()),
                TokenTree::Ident(ident) => {
                    if previous_dot && ident == "await" {
                        self.await_error(ident.span());
                    } else if self.is_param(&ident.to_string()) {
                        self.uses_parameter = true;
                    }
                }
                TokenTree::Literal(_) | TokenTree::Punct(_) => {}
            }
            previous_dot = matches!(&token, TokenTree::Punct(p) if p.as_char() == '.');
        }
    }

    fn await_error(&mut self, span: Span) {
        self.errors.at(
            span,
            format!(
                "`.await` is not allowed in `{}`: it is computed before the claim, from the parameters \
                 alone; await the value before the call and pass it in as a parameter",
                self.role.name()
            ),
        );
    }
}

impl<'ast> Visit<'ast> for Scan<'_> {
    fn visit_expr_path(&mut self, node: &'ast ExprPath) {
        self.fresh_path(&node.path);
        if node.qself.is_none()
            && let Some(ident) = node.path.get_ident()
        {
            self.single_name(ident);
        }
    }

    fn visit_expr_call(&mut self, node: &'ast ExprCall) {
        match &*node.func {
            // The callee of `hash(req)` is a fn, not a parameter.
            Expr::Path(func) => self.fresh_path(&func.path),
            other => self.visit_expr(other),
        }
        for argument in &node.args {
            self.visit_expr(argument);
        }
    }

    fn visit_expr_method_call(&mut self, node: &'ast ExprMethodCall) {
        if FRESH_VALUE_FNS.iter().any(|name| node.method == name) {
            self.reported = true;
            self.errors.at(
                node.method.span(),
                format!(
                    "`.{}()` returns a new value on every call, so {}",
                    node.method,
                    self.role.stability()
                ),
            );
        }
        visit::visit_expr_method_call(self, node);
    }

    fn visit_expr_await(&mut self, node: &'ast ExprAwait) {
        self.await_error(node.await_token.span);
        visit::visit_expr_await(self, node);
    }

    fn visit_expr_macro(&mut self, node: &'ast ExprMacro) {
        self.fresh_path(&node.mac.path);
        self.macro_tokens(&node.mac.tokens);
    }

    fn visit_expr_closure(&mut self, node: &'ast ExprClosure) {
        let bound = self.locals.len();
        for input in &node.inputs {
            let mut names = Vec::new();
            collect_pat(input, &mut names);
            self.locals.extend(names);
        }
        self.visit_expr(&node.body);
        self.locals.truncate(bound);
    }

    fn visit_local(&mut self, node: &'ast Local) {
        if let Some(init) = &node.init {
            self.visit_expr(&init.expr);
        }
        collect_pat(&node.pat, &mut self.locals);
    }

    fn visit_stmt_macro(&mut self, node: &'ast syn::StmtMacro) {
        self.macro_tokens(&node.mac.tokens);
    }
}

/// Names bound by a pattern.
fn collect_pat(pat: &Pat, names: &mut Vec<String>) {
    struct Binder<'a>(&'a mut Vec<String>);
    impl<'ast> Visit<'ast> for Binder<'_> {
        fn visit_pat_ident(&mut self, node: &'ast syn::PatIdent) {
            self.0.push(node.ident.to_string());
            visit::visit_pat_ident(self, node);
        }
    }
    Binder(names).visit_pat(pat);
}

/// `tx = "tx"` must name a parameter.
fn check_tx(tx: &Ident, params: &[String], fn_name: &str, errors: &mut Errors) {
    let name = tx.to_string();
    if params.contains(&name) {
        return;
    }
    let names = params.iter().map(String::as_str);
    let message = if params.is_empty() {
        format!(
            "`tx` names `{name}`, but `{fn_name}` has no parameters; add the transaction as a parameter, \
             e.g. `{name}: &mut sqlx::Transaction<'_, sqlx::Sqlite>`"
        )
    } else {
        format!(
            "`tx` names `{name}`, which is not a parameter of `{fn_name}`{} the parameters are {}; name \
             the `&mut` transaction or connection parameter",
            diag::did_you_mean_clause(&name, names.clone()),
            diag::backticked(names),
        )
    };
    errors.at(tx.span(), message);
}

/// `store = sqlite` (bare) where `store = "sqlite"` was meant.
fn check_store_expr(expr: &Expr, params: &[String], errors: &mut Errors) {
    let Expr::Path(path) = expr else { return };
    let Some(ident) = path.path.get_ident() else {
        return;
    };
    let name = ident.to_string();
    if path.qself.is_some()
        || params.contains(&name)
        || !name.starts_with(|c: char| c.is_lowercase())
    {
        return;
    }
    errors.at(
        ident.span(),
        format!(
            "`store = {name}` names no parameter; to use the store registered as `{name}`, write \
             `store = \"{name}\"`; to pass a store, give an expression such as `store = self.store` or \
             `store = STORE`"
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn check_tokens(args: TokenStream, item: TokenStream) -> Result<Spec, Vec<String>> {
        let args: IdempotentArgs = syn::parse2(args).unwrap();
        let item: ItemFn = syn::parse2(item).unwrap();
        check(args, &item).map_err(|error| error.into_iter().map(|e| e.to_string()).collect())
    }

    fn errors(args: TokenStream, item: TokenStream) -> Vec<String> {
        match check_tokens(args, item) {
            Ok(_) => Vec::new(),
            Err(messages) => messages,
        }
    }

    fn pay_with(key: TokenStream) -> Vec<String> {
        errors(
            quote!(biz = "PAY", key = #key, store = "sqlite"),
            quote!(
                async fn pay(req: &PayReq, user: &User) -> Result<Receipt, PayError> {
                    todo!()
                }
            ),
        )
    }

    #[test]
    fn accepts_a_good_fn() {
        let spec = check_tokens(
            quote!(
                biz = "PAY",
                key = "req.order_no",
                store = "sqlite",
                fingerprint = "req"
            ),
            quote!(
                pub async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
                    todo!()
                }
            ),
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(spec.ttl_ms, args::DEFAULT_TTL_MS);
        assert_eq!(spec.lease_ms, args::DEFAULT_LEASE_MS);
        let ok = &spec.ret.ok_ty;
        assert_eq!(quote!(#ok).to_string(), "Receipt");
        assert!(spec.ret.err_ty.is_some());
        assert!(spec.fingerprint.is_some());
    }

    #[test]
    fn accepts_methods_generics_and_result_aliases() {
        let spec = check_tokens(
            quote!(biz = "PAY", key = "self.tenant", store = self.store),
            quote!(
                async fn pay<T: Into<u64>>(&self, _n: T) -> anyhow::Result<Vec<u8>>
                where
                    T: Send,
                {
                    todo!()
                }
            ),
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert!(spec.ret.err_ty.is_none());
        assert!(
            check_tokens(
                quote!(biz = "PAY", key = (a, b), store = "s"),
                quote!(
                    async fn pay((a, b): (u8, u8)) -> io::Result<u8> {
                        todo!()
                    }
                ),
            )
            .is_ok()
        );
    }

    #[test]
    fn refuses_sync_const_and_non_result_fns() {
        let found = errors(
            quote!(biz = "PAY", key = "req.id", store = "s"),
            quote!(
                const fn pay(req: &Req) -> Result<u8, E> {
                    todo!()
                }
            ),
        );
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].contains("cannot wrap a `const fn`") && found[0].contains("remove `const`")
        );
        assert!(found[1].contains("needs an `async fn`") && found[1].contains("add `async`"));

        let found = errors(
            quote!(biz = "PAY", key = "req.id", store = "s"),
            quote!(
                async fn pay(req: &Req) -> Option<u8> {
                    todo!()
                }
            ),
        );
        assert!(
            found[0].contains("returns `Result<T, E>`")
                && found[0].contains("wrap the return type")
        );

        let found = errors(
            quote!(biz = "PAY", key = "req.id", store = "s"),
            quote!(
                async fn pay(req: &Req) {
                    todo!()
                }
            ),
        );
        assert!(found[0].contains("add a return type"), "{found:?}");

        let found = errors(
            quote!(biz = "PAY", key = "req.id", store = "s"),
            quote!(
                async fn pay(req: &Req) -> Result<impl Serialize, E> {
                    todo!()
                }
            ),
        );
        assert!(found[0].contains("needs a named type"), "{found:?}");
    }

    #[test]
    fn names_an_unknown_parameter_with_a_suggestion() {
        let found = pay_with(quote!("reqq.order_no"));
        assert_eq!(
            found,
            [
                "unknown parameter `reqq` in `key`; did you mean `req`? the parameters are `req`, `user`"
            ]
        );
        let found = pay_with(quote!(order.id));
        assert_eq!(
            found,
            ["unknown parameter `order` in `key`; the parameters are `req`, `user`"]
        );
    }

    #[test]
    fn accepts_keys_over_parameters() {
        assert!(pay_with(quote!("req.order_no")).is_empty());
        assert!(pay_with(quote!("(req.user_id, req.client_req_id)")).is_empty());
        assert!(pay_with(quote!(format!("{}-{}", req.a, user.b))).is_empty());
        assert!(pay_with(quote!(format!("{req}"))).is_empty());
        assert!(pay_with(quote!(hash(&req.order_no))).is_empty());
        assert!(pay_with(quote!(req.items.iter().map(|item| item.id).sum::<u64>())).is_empty());
        assert!(pay_with(quote!(Key::new(req.id, MAX))).is_empty());
    }

    #[test]
    fn refuses_a_key_that_uses_no_parameter() {
        let found = pay_with(quote!("42"));
        assert_eq!(found.len(), 1);
        assert!(
            found[0].starts_with("`key` uses no parameter of `pay`")
                && found[0].contains("every call would share one record"),
            "{found:?}"
        );
        let found = errors(
            quote!(biz = "PAY", key = "CONST", store = "s", fingerprint = "1"),
            quote!(
                async fn tick() -> Result<(), E> {
                    todo!()
                }
            ),
        );
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("`tick` has no parameters"));
        assert!(found[1].starts_with("`fingerprint` uses no parameter"));
    }

    #[test]
    fn refuses_await_in_the_key() {
        let found = pay_with(quote!(req.id().await));
        assert_eq!(found.len(), 1);
        assert!(found[0].starts_with("`.await` is not allowed in `key`"));
        let found = pay_with(quote!(format!("{}", req.id().await)));
        assert!(
            found[0].starts_with("`.await` is not allowed in `key`"),
            "{found:?}"
        );
    }

    #[test]
    fn refuses_values_that_change_on_every_retry() {
        for key in [
            quote!("Uuid::new_v4()"),
            quote!((req.id, uuid::Uuid::now_v7())),
            quote!((req.id, std::time::SystemTime::now())),
            quote!((req.id, chrono::Utc::now().timestamp())),
            quote!((req.id, rand::random::<u64>())),
            quote!((req.id, rand::thread_rng().next_u64())),
            quote!((req.id, req.rng.random::<u64>())),
            quote!(format!("{}{}", req.id, Uuid::new_v4())),
        ] {
            let found = pay_with(key.clone());
            assert_eq!(found.len(), 1, "{key}: {found:?}");
            assert!(
                found[0].contains("returns a new value on every call")
                    && found[0].contains(
                        "the key must come from the caller and stay stable across retries"
                    ),
                "{found:?}"
            );
        }
        assert!(pay_with(quote!((req.id, req.created.now))).is_empty());
    }

    #[test]
    fn checks_the_fingerprint_like_the_key() {
        let found = errors(
            quote!(biz = "PAY", key = "req.id", store = "s", fingerprint = "rq"),
            quote!(
                async fn pay(req: &Req) -> Result<u8, E> {
                    todo!()
                }
            ),
        );
        assert_eq!(
            found,
            [
                "unknown parameter `rq` in `fingerprint`; did you mean `req`? the parameters are `req`"
            ]
        );
    }

    #[test]
    fn checks_that_tx_names_a_parameter() {
        let found = errors(
            quote!(biz = "PAY", key = "req.id", store = "s", tx = "txn"),
            quote!(
                async fn pay(tx: &mut Tx, req: &Req) -> Result<u8, E> {
                    todo!()
                }
            ),
        );
        assert_eq!(found.len(), 1);
        assert!(
            found[0].starts_with(
                "`tx` names `txn`, which is not a parameter of `pay`; did you mean `tx`? the parameters are `tx`, `req`"
            ),
            "{found:?}"
        );
    }

    #[test]
    fn hints_at_a_quoted_store_name() {
        let found = errors(
            quote!(biz = "PAY", key = "req.id", store = sqlite),
            quote!(
                async fn pay(req: &Req) -> Result<u8, E> {
                    todo!()
                }
            ),
        );
        assert!(found[0].contains("write `store = \"sqlite\"`"), "{found:?}");
        assert!(
            errors(
                quote!(biz = "PAY", key = "req.id", store = store),
                quote!(
                    async fn pay(store: &S, req: &Req) -> Result<u8, E> {
                        todo!()
                    }
                ),
            )
            .is_empty()
        );
    }

    #[test]
    fn reports_argument_and_signature_errors_together() {
        let found = errors(
            quote!(biz = "PAY PAY", key = "reqq.id", store = "s"),
            quote!(
                fn pay(req: &Req) -> u8 {
                    todo!()
                }
            ),
        );
        assert_eq!(found.len(), 4, "{found:#?}");
    }
}
