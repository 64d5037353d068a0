//! The option list every macro takes: `name = value`, `name(a, b)` or a bare `name`, separated by `,`.
//!
//! One parser for the three macros, so a misspelled option, a duplicate, a value-less option and a
//! missing comma read and recover the same everywhere. It never stops at the first mistake: each
//! option is parsed on its own, every error is recorded at its token, and parsing resumes at the next
//! top-level `,`. Which values an option accepts is the macro's business: it gets each option as
//! written ([`Given`]) and converts it.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::ParseStream;
use syn::{Expr, Ident, Token};

use super::diag::{self, Errors};
use super::expr_arg::{peel_expr, skip_to_comma};

/// How an option is written.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Form {
    /// `name = value`.
    Value,
    /// `name(a, b, …)`.
    List,
    /// `name` alone.
    Flag,
}

/// One option a macro accepts.
pub(crate) struct OptionDef {
    pub(crate) name: &'static str,
    pub(crate) form: Form,
    /// The option written out, for messages: `biz = "PAY"`.
    pub(crate) example: &'static str,
    /// What the option means, added to the message when it is written in the wrong form (a flag
    /// given a value, say); empty for most options.
    pub(crate) note: &'static str,
}

/// `OptionDef` in one line: `opt("biz", Form::Value, r#"biz = "PAY""#)`.
pub(crate) const fn opt(name: &'static str, form: Form, example: &'static str) -> OptionDef {
    OptionDef {
        name,
        form,
        example,
        note: "",
    }
}

impl OptionDef {
    /// The same option, with what it means said when it is written in the wrong form.
    pub(crate) const fn note(self, note: &'static str) -> OptionDef {
        OptionDef { note, ..self }
    }
}

/// The options of one macro, and how the macro is named in messages (`#[idempotent]`).
pub(crate) struct OptionSet {
    pub(crate) macro_name: &'static str,
    pub(crate) options: &'static [OptionDef],
}

impl OptionSet {
    fn names(&self) -> impl Iterator<Item = &'static str> + Clone + '_ {
        self.options.iter().map(|def| def.name)
    }

    /// `the options are `a`, `b`, …`.
    fn list(&self) -> String {
        format!("the options are {}", diag::backticked(self.names()))
    }
}

/// One option as written, its name already known to the macro.
pub(crate) struct Given {
    /// The option's name, as in its [`OptionDef`].
    pub(crate) name: &'static str,
    /// The name token, for errors about the option as a whole.
    pub(crate) span: Span,
    pub(crate) value: Value,
}

/// What followed an option's name.
pub(crate) enum Value {
    /// `= value`, with the invisible groups of `macro_rules!` fragments looked through.
    Expr(Expr),
    /// `(…)`: the tokens between the parentheses.
    List(TokenStream),
    /// Nothing.
    Flag,
}

/// The options given, in order, with every error found while reading them.
pub(crate) struct Options {
    /// All of the attribute's tokens, to span errors about the attribute as a whole.
    pub(crate) tokens: TokenStream,
    /// Each option once, as written: a duplicate is an error, not a second entry.
    pub(crate) given: Vec<Given>,
    /// Every option named, also those whose value was refused: none of them is "missing".
    pub(crate) seen: Vec<&'static str>,
    /// Options an unknown name was probably meant as (`bizz` for `biz`), or written after a missing
    /// comma: they are not "missing".
    pub(crate) suggested: Vec<&'static str>,
    pub(crate) errors: Errors,
}

impl Options {
    /// Whether `name` was written (valid or not).
    pub(crate) fn has(&self, name: &str) -> bool {
        self.seen.contains(&name)
    }

    /// The required options neither given nor probably meant by a misspelled name.
    pub(crate) fn missing(&self, required: &[&'static str]) -> Vec<&'static str> {
        required
            .iter()
            .copied()
            .filter(|name| !self.has(name) && !self.suggested.contains(name))
            .collect()
    }

    /// One error naming every `required` option that is absent, with what each means and a complete
    /// `example`: "missing `a` and `b` in `#[m]` (`a` is …, `b` is …); write e.g. `…`".
    pub(crate) fn missing_error(
        &self,
        set: &OptionSet,
        required: &[Required],
        example: &str,
    ) -> Option<syn::Error> {
        let names: Vec<&'static str> = required.iter().map(|r| r.name).collect();
        let missing = self.missing(&names);
        if missing.is_empty() {
            return None;
        }
        let meanings: Vec<&str> = required
            .iter()
            .filter(|r| missing.contains(&r.name))
            .map(|r| r.meaning)
            .collect();
        Some(self.error_at(format!(
            "missing {} in `{}` ({}); write e.g. `{example}`",
            diag::backticked_and(missing.iter().copied()),
            set.macro_name,
            meanings.join(", ")
        )))
    }

    /// The span to report something about the whole attribute at: its tokens, else the macro call.
    pub(crate) fn error_at(&self, message: impl std::fmt::Display) -> syn::Error {
        if self.tokens.is_empty() {
            // `#[idempotent]` with no arguments: there is no argument token to point at.
            syn::Error::new(Span::call_site(), message)
        } else {
            syn::Error::new_spanned(self.tokens.clone(), message)
        }
    }
}

/// A required option and what it means, for [`Options::missing_error`]:
/// `` req("biz", "`biz` names the business action") ``.
pub(crate) struct Required {
    pub(crate) name: &'static str,
    pub(crate) meaning: &'static str,
}

/// `Required` in one line.
pub(crate) const fn req(name: &'static str, meaning: &'static str) -> Required {
    Required { name, meaning }
}

/// Reads the whole option list of `set` from `input`.
pub(crate) fn parse(input: ParseStream, set: &OptionSet) -> syn::Result<Options> {
    let mut options = Options {
        tokens: input.fork().parse()?,
        given: Vec::new(),
        seen: Vec::new(),
        suggested: Vec::new(),
        errors: Errors::default(),
    };
    while !input.is_empty() {
        if let Err(error) = parse_one(input, set, &mut options) {
            options.errors.push(error);
            skip_to_comma(input);
        }
        if input.is_empty() {
            break;
        }
        if input.peek(Token![,]) {
            input.parse::<Token![,]>()?;
        } else {
            // `biz = "PAY" key = …`: report once, then go on with the next option after a comma.
            options.errors.at(
                input.span(),
                format!("expected `,` between the options of `{}`", set.macro_name),
            );
            // The option after the missing comma is skipped, but it was written: not "missing".
            if let Ok(name) = input.fork().call(Ident::parse_any)
                && let Some(def) = set.options.iter().find(|def| name == def.name)
            {
                options.suggested.push(def.name);
            }
            skip_to_comma(input);
            if input.peek(Token![,]) {
                input.parse::<Token![,]>()?;
            }
        }
    }
    Ok(options)
}

/// Reads one option and records it (or its errors) in `options`.
fn parse_one(input: ParseStream, set: &OptionSet, options: &mut Options) -> syn::Result<()> {
    if !input.peek(Ident::peek_any) {
        let first = &set.options[0];
        return Err(input.error(format!(
            "expected an option such as `{}`; {}",
            first.example,
            set.list()
        )));
    }
    let name = Ident::parse_any(input)?;
    let written = name.to_string();
    let Some(def) = set.options.iter().find(|def| def.name == written) else {
        let suggestion = diag::did_you_mean(&written, set.names());
        options.suggested.extend(suggestion);
        options.errors.at(
            name.span(),
            format!(
                "unknown option `{written}` in `{}`{} {}",
                set.macro_name,
                diag::did_you_mean_clause(&written, set.names()),
                set.list()
            ),
        );
        skip_to_comma(input);
        return Ok(());
    };
    let duplicate = options.has(def.name);
    options.seen.push(def.name);
    let value = parse_value(input, def, &name)?;
    if duplicate {
        options.errors.at(
            name.span(),
            format!(
                "duplicate option `{}`; each option may be given once, remove this one",
                def.name
            ),
        );
        return Ok(());
    }
    options.given.push(Given {
        name: def.name,
        span: name.span(),
        value,
    });
    Ok(())
}

/// What follows the name, in the form the option takes.
fn parse_value(input: ParseStream, def: &OptionDef, name: &Ident) -> syn::Result<Value> {
    let wrong_form = |what: &str| {
        let note = match def.note {
            "" => String::new(),
            note => format!(" ({note})"),
        };
        syn::Error::new(
            name.span(),
            format!("`{}` {what}, e.g. `{}`{note}", def.name, def.example),
        )
    };
    match def.form {
        Form::Value => {
            if !input.peek(Token![=]) {
                return Err(wrong_form("needs a value"));
            }
            input.parse::<Token![=]>()?;
            Ok(Value::Expr(peel_expr(input.parse()?)))
        }
        Form::List => {
            if !input.peek(syn::token::Paren) {
                return Err(wrong_form("takes a list in parentheses"));
            }
            let content;
            syn::parenthesized!(content in input);
            Ok(Value::List(content.parse()?))
        }
        Form::Flag => {
            if !(input.is_empty() || input.peek(Token![,])) {
                return Err(wrong_form("takes no value; write the name alone"));
            }
            Ok(Value::Flag)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;
    use syn::parse::Parser;

    const SET: OptionSet = OptionSet {
        macro_name: "#[demo]",
        options: &[
            opt("biz", Form::Value, r#"biz = "PAY""#),
            opt("key", Form::Value, r#"key = "req.id""#),
            opt("to", Form::List, "to(Paid)"),
            opt("terminal", Form::Flag, "terminal"),
            opt("crate", Form::Value, r#"crate = "::idem""#),
        ],
    };

    fn read(tokens: TokenStream) -> (Options, Vec<String>) {
        let mut options = (|input: ParseStream| parse(input, &SET))
            .parse2(tokens)
            .expect("the parser records errors instead of failing");
        let errors = std::mem::take(&mut options.errors);
        let messages = match errors.finish() {
            Ok(()) => Vec::new(),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        };
        (options, messages)
    }

    #[test]
    fn reads_every_form() {
        let (options, errors) = read(quote!(biz = "PAY", to(A, B), terminal, crate = ::idem));
        assert!(errors.is_empty(), "{errors:?}");
        let names: Vec<&str> = options.given.iter().map(|g| g.name).collect();
        assert_eq!(names, ["biz", "to", "terminal", "crate"]);
        assert!(matches!(options.given[1].value, Value::List(_)));
        assert!(matches!(options.given[2].value, Value::Flag));
    }

    #[test]
    fn a_suggested_option_is_not_missing() {
        let (options, errors) = read(quote!(bizz = "PAY", to(A)));
        assert_eq!(
            errors,
            [
                "unknown option `bizz` in `#[demo]`; did you mean `biz`? the options are `biz`, `key`, `to`, `terminal`, `crate`"
            ]
        );
        assert_eq!(options.missing(&["biz", "key"]), ["key"]);
    }

    #[test]
    fn reports_wrong_forms_duplicates_and_missing_commas() {
        let (options, errors) =
            read(quote!(biz, to = 1, terminal = 2, key = "a" key = "b", biz = "X", biz = "Y"));
        assert_eq!(
            errors,
            [
                "`biz` needs a value, e.g. `biz = \"PAY\"`",
                "`to` takes a list in parentheses, e.g. `to(Paid)`",
                "`terminal` takes no value; write the name alone, e.g. `terminal`",
                "expected `,` between the options of `#[demo]`",
                "duplicate option `biz`; each option may be given once, remove this one",
                "duplicate option `biz`; each option may be given once, remove this one",
            ]
        );
        // A value-less or refused option is not given, yet not missing either; nor is one written
        // after a missing comma.
        let names: Vec<&str> = options.given.iter().map(|g| g.name).collect();
        assert_eq!(names, ["key"]);
        assert!(options.missing(&["biz", "to", "terminal"]).is_empty());
        let (options, _) = read(quote!(biz = "PAY" key = "a"));
        assert!(options.missing(&["biz", "key"]).is_empty());
        let (_, errors) = read(quote!("PAY"));
        assert!(errors[0].starts_with("expected an option such as `biz = \"PAY\"`"));
    }

    #[test]
    fn looks_through_the_groups_of_macro_rules_fragments() {
        let group = proc_macro2::Group::new(proc_macro2::Delimiter::None, quote!("PAY"));
        let (options, errors) = read(quote!(biz = #group));
        assert!(errors.is_empty());
        let Value::Expr(expr) = &options.given[0].value else {
            panic!("a value")
        };
        assert!(matches!(expr, Expr::Lit(_)), "{expr:?}");
    }
}
