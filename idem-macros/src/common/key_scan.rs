//! The key scanner: checks a `key`, `fingerprint`, `token` or `subject` expression (and the like)
//! against the fn's parameters. It must read a parameter (else every call shares one record), name
//! no unknown parameter, contain no `.await` and call nothing that differs on every retry
//! (`Uuid::new_v4()`, `SystemTime::now()`, …).

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::visit::{self, Visit};
use syn::{
    Expr, ExprAwait, ExprCall, ExprClosure, ExprMacro, ExprMethodCall, ExprPath, Ident, Local, Pat,
    Path,
};

use crate::common::diag::{self, Errors};
use crate::common::expr_arg::ExprArg;

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

/// Which option an expression came from, for messages.
#[derive(Clone, Copy)]
pub(crate) enum Role<'a> {
    /// `#[idempotent(key = …)]`: the idempotency key.
    Key,
    /// `#[idempotent(fingerprint = …)]`.
    Fingerprint,
    /// `#[state_transition(key = …)]`: the row's key.
    RowKey,
    /// `#[state_transition(set(column = …))]`.
    Set(&'a str),
    /// `#[state_transition(version = …)]`: the version the caller read.
    Version,
    /// `#[consume_token(token = …)]`: the submit token the request carries.
    Token,
    /// `#[consume_token(subject = …)]`: who the token was issued to.
    Subject,
    /// `#[idempotent(recover = …)]`: the call asking whether the action already happened.
    Recover,
}

impl Role<'_> {
    /// The option as messages name it: `key`, `set(trade_no = …)`.
    fn name(self) -> String {
        match self {
            Role::Key | Role::RowKey => "key".to_owned(),
            Role::Fingerprint => "fingerprint".to_owned(),
            Role::Set(column) => format!("set({column} = …)"),
            Role::Version => "version".to_owned(),
            Role::Token => "token".to_owned(),
            Role::Subject => "subject".to_owned(),
            Role::Recover => "recover".to_owned(),
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
            Role::RowKey => {
                "every retry would look for another row; the key must come from the caller: build it \
                 from the request (an order number)"
            }
            Role::Set(_) => {
                "a retry would write another value than the first call did; bind values that come from \
                 the caller, and use `now = \"column\"` for the database's current time"
            }
            Role::Version => {
                "the version must be the one the caller read before; pass it in as a parameter"
            }
            Role::Token => {
                "it would never be a token the page was given; the token must come from the request: \
                 read the form field or header the page submitted, e.g. `token = \"form.token\"`"
            }
            Role::Subject => {
                "it would never be the subject the token was issued to; read it from the caller's \
                 session, e.g. `subject = \"session.user_id\"`"
            }
            Role::Recover => {
                "it would look up another action than the one the first attempt ran; pass it what \
                 identifies the action, e.g. `recover = \"find_payment(&req.order_no)\"`"
            }
        }
    }

    /// What an expression that reads no parameter leads to, when that is a mistake.
    fn constant(self) -> Option<&'static str> {
        match self {
            Role::Key => Some(
                "every call would share one record; build the key from the request, e.g. `key = \"req.order_no\"`",
            ),
            Role::Fingerprint => Some(
                "it would be the same for every request; hash the request, e.g. `fingerprint = \"req\"`",
            ),
            Role::RowKey => Some(
                "every call would move the same row; build the key from the request, e.g. `key = \"req.order_no\"`",
            ),
            Role::Token => Some(
                "every call would spend the same token; read it from the request, e.g. `token = \"form.token\"`",
            ),
            Role::Subject => Some(
                "it would be the same for every caller and bind the token to no one; read it from the \
                 caller's session, e.g. `subject = \"session.user_id\"`, or leave `subject` out",
            ),
            Role::Recover => Some(
                "it could not tell which action to look up; pass it what identifies the action, \
                 e.g. `recover = \"find_payment(&req.order_no)\"`",
            ),
            // A constant column value or version is unusual but not wrong.
            Role::Set(_) | Role::Version => None,
        }
    }

    /// When the expression is evaluated, for the `.await` message.
    fn evaluated(self) -> &'static str {
        match self {
            Role::Key | Role::Fingerprint => {
                "it is computed before the claim, from the parameters alone"
            }
            Role::RowKey | Role::Set(_) | Role::Version => {
                "it is bound into the update, from the parameters alone, before the body runs"
            }
            Role::Token | Role::Subject => {
                "it is read before the token is spent, from the parameters alone"
            }
            Role::Recover => "idem awaits the call itself, only when it takes over a claim",
        }
    }
}

/// Checks a `key`, `fingerprint`, `set`, `version`, `token` or `subject` expression against the
/// parameters.
pub(crate) fn check_expr_arg(
    arg: &ExprArg,
    role: Role<'_>,
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
        fn_name,
        in_tuple: 0,
    };
    scan.visit_expr(&arg.expr);
    if let Some(constant) = role.constant()
        && !scan.uses_parameter
        && !scan.reported
    {
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
                "`{}` uses no parameter of `{fn_name}`: {parameters}{constant}",
                role.name(),
            ),
        );
    }
    errors.append(scan.errors);
}

/// Walks a key or fingerprint expression.
struct Scan<'a> {
    role: Role<'a>,
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
    fn_name: &'a str,
    /// Inside a tuple: a part of a composite key, where a caller's id usually goes.
    in_tuple: usize,
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
                 parameter and build the value from it",
                self.role.name(),
            )
        } else {
            let mut message = format!(
                "unknown parameter `{name}` in `{}`{} the parameters are {}",
                self.role.name(),
                diag::did_you_mean_clause(&name, params.clone()),
                diag::backticked(params.clone()),
            );
            // `key = "(user.id, req.client_req_id)"` on a fn that does not take the user: the
            // key was meant to be scoped by its caller.
            if matches!(self.role, Role::Key)
                && self.in_tuple > 0
                && diag::did_you_mean(&name, params).is_none()
            {
                message.push_str(&format!(
                    ". To scope the key by its caller, take the caller as a parameter of `{}` \
                     too: `{name}: &…`",
                    self.fn_name
                ));
            }
            message
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
        let advice = match self.role {
            Role::Recover => "write the call without `.await`",
            _ => "await the value before the call and pass it in as a parameter",
        };
        self.errors.at(
            span,
            format!(
                "`.await` is not allowed in `{}`: {}; {advice}",
                self.role.name(),
                self.role.evaluated()
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

    fn visit_expr_tuple(&mut self, node: &'ast syn::ExprTuple) {
        self.in_tuple += 1;
        visit::visit_expr_tuple(self, node);
        self.in_tuple -= 1;
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
