//! Diagnostics helpers: an error accumulator, "did you mean" suggestions and message formatting.
//!
//! Every message the macros print follows the same rules: lowercase, names in backticks, say what to do,
//! and carry the span of the offending token.

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::Path;

/// Collects every error found while parsing and checking one macro invocation, so the user sees them all
/// in one build instead of one per build (`syn::Error::combine` keeps each message with its own span).
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    /// Records one more error.
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    /// Records an error at `span` with `message`.
    pub(crate) fn at(&mut self, span: Span, message: impl std::fmt::Display) {
        self.push(syn::Error::new(span, message));
    }

    /// Records an error spanning all of `tokens` (first to last token).
    pub(crate) fn spanned(
        &mut self,
        tokens: impl quote::ToTokens,
        message: impl std::fmt::Display,
    ) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// `Ok(())` when nothing was recorded, else every error combined.
    pub(crate) fn finish(self) -> syn::Result<()> {
        match self.0 {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Moves the errors of `other` into `self`.
    pub(crate) fn append(&mut self, other: Errors) {
        if let Some(error) = other.0 {
            self.push(error);
        }
    }
}

/// The candidate closest to `name`, when it is close enough to be a plausible misspelling.
pub(crate) fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|candidate| (strsim::jaro_winkler(name, candidate), candidate))
        .filter(|(score, candidate)| {
            *score >= 0.8 || strsim::damerau_levenshtein(name, candidate) <= 1
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, candidate)| candidate)
}

/// `"; did you mean `x`?"`, or `";"` when nothing is close: either way the caller goes on with
/// `" the options are …"`.
pub(crate) fn did_you_mean_clause<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> String {
    match did_you_mean(name, candidates) {
        Some(best) => format!("; did you mean `{best}`?"),
        None => ";".to_owned(),
    }
}

/// "`a`, `b`, `c`".
pub(crate) fn backticked<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names
        .into_iter()
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// "`a`", "`a` and `b`", "`a`, `b` and `c`".
pub(crate) fn backticked_and<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<String> = names.into_iter().map(|name| format!("`{name}`")).collect();
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// A path as the user wrote it, without the spaces `to_string` puts around `::`.
pub(crate) fn path_to_string(path: &Path) -> String {
    let segments = path
        .segments
        .iter()
        .map(|segment| segment.ident.to_string())
        .collect::<Vec<_>>()
        .join("::");
    if path.leading_colon.is_some() {
        format!("::{segments}")
    } else {
        segments
    }
}

/// `tokens` with every span moved to `target`'s location, keeping each token's own hygiene.
///
/// Used for paths the macro inserts (`::idem::__private::Storable`), so an error on them is shown at
/// the user's type while name resolution stays as it was.
pub(crate) fn located_at(tokens: TokenStream, target: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut new =
                    proc_macro2::Group::new(group.delimiter(), located_at(group.stream(), target));
                new.set_span(group.span().located_at(target));
                token = TokenTree::Group(new);
            } else {
                token.set_span(token.span().located_at(target));
            }
            token
        })
        .collect()
}

/// `tokens` placed at `location`, resolved as if written at the macro call (call-site hygiene).
///
/// For expressions parsed out of a string literal: every token sits on the literal, so a suggestion
/// rustc would make for one token ("a field with a similar name exists") would replace the whole literal
/// with that token. Tokens that come from the expansion keep the error at the literal but drop such
/// broken suggestions.
pub(crate) fn inside_literal(tokens: TokenStream, location: Span) -> TokenStream {
    located_at(respan(tokens, Span::call_site()), location)
}

/// `tokens` with every span replaced by `span`.
pub(crate) fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut new =
                    proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                new.set_span(span);
                token = TokenTree::Group(new);
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_misspellings_only() {
        let options = ["biz", "key", "store", "ttl", "lease", "on_in_progress"];
        assert_eq!(did_you_mean("bizz", options), Some("biz"));
        assert_eq!(did_you_mean("stor", options), Some("store"));
        assert_eq!(
            did_you_mean("on_inprogress", options),
            Some("on_in_progress")
        );
        assert_eq!(did_you_mean("leese", options), Some("lease"));
        assert_eq!(did_you_mean("zzzzzz", options), None);
        assert_eq!(did_you_mean("reqq", ["req", "user"]), Some("req"));
        assert_eq!(did_you_mean("x", ["req", "user"]), None);
    }

    #[test]
    fn formats_lists_and_paths() {
        assert_eq!(backticked(["req", "user"]), "`req`, `user`");
        assert_eq!(backticked_and(["a"]), "`a`");
        assert_eq!(backticked_and(["a", "b"]), "`a` and `b`");
        assert_eq!(backticked_and(["a", "b", "c"]), "`a`, `b` and `c`");
        assert_eq!(
            did_you_mean_clause("reqq", ["req"]),
            "; did you mean `req`?"
        );
        assert_eq!(did_you_mean_clause("zzz", ["req"]), ";");
        let path: Path = syn::parse_quote!(::uuid::Uuid::new_v4);
        assert_eq!(path_to_string(&path), "::uuid::Uuid::new_v4");
    }

    #[test]
    fn collects_every_error() {
        let mut errors = Errors::default();
        errors.at(Span::call_site(), "first");
        errors.at(Span::call_site(), "second");
        let combined = errors.finish().unwrap_err();
        assert_eq!(combined.into_iter().count(), 2);
    }
}
