//! The fn an attribute wraps: `async`, not `const`, its return type (`Result<T, E>`, a `…::Result<T>`
//! alias, or another one-argument alias the type checker resolves), and the names its parameters bind.

use syn::{FnArg, GenericArgument, Pat, PathArguments, ReturnType, Signature, Type};

use super::diag::Errors;

/// Why a macro needs an `async fn` that is not `const`, for messages.
pub(crate) struct AsyncNeed {
    /// `#[idempotent]`.
    pub(crate) macro_name: &'static str,
    /// What the generated code awaits: "claiming the key and storing the result await the store".
    pub(crate) awaits: &'static str,
    /// What is run-time work: "claiming and storing the result are run-time work".
    pub(crate) run_time: &'static str,
}

/// `async`, not `const`: the macro cannot wrap anything else.
pub(crate) fn check_async(sig: &Signature, need: &AsyncNeed, errors: &mut Errors) {
    let AsyncNeed {
        macro_name,
        awaits: why,
        run_time,
    } = need;
    if let Some(constness) = &sig.constness {
        errors.at(
            constness.span,
            format!("`{macro_name}` cannot wrap a `const fn`: {run_time}; remove `const`"),
        );
    }
    if sig.asyncness.is_none() {
        errors.at(
            sig.fn_token.span,
            format!("`{macro_name}` needs an `async fn`: {why}; add `async` before `fn`"),
        );
    }
}

/// What a macro needs of the fn's return type, for messages.
pub(crate) struct ReturnNeed {
    /// "`#[idempotent]` needs a fn that returns `Result<T, E>` where …": the fix is appended.
    pub(crate) want: &'static str,
    /// Why an `impl Trait` in the `Ok` or error type cannot be wrapped, and what to write instead.
    pub(crate) named: &'static str,
    /// A return type to show in the fix: `Result<Receipt, PayError>`.
    pub(crate) example: &'static str,
}

/// The fn's return type: `Result<T, E>`, or an alias whose `Ok` / `Err` types the type checker finds.
pub(crate) struct ResultShape {
    pub(crate) ret_ty: Type,
    /// The `Ok` type as written; `None` for an alias other than `…::Result<T>` (`ShopResult<T>`).
    pub(crate) ok_ty: Option<Type>,
    /// The error type as written; `None` for a one-argument alias (`anyhow::Result<T>`).
    pub(crate) err_ty: Option<Type>,
}

/// The fn returns `Result<T, E>` (or an alias of it) with named `Ok` and error types; else an error
/// at the return type (or at the fn's name when it has none) saying `need`.
pub(crate) fn check_return(
    sig: &Signature,
    need: &ReturnNeed,
    errors: &mut Errors,
) -> Option<ResultShape> {
    let want = need.want;
    let ret_ty = match &sig.output {
        ReturnType::Type(_, ty) => &**ty,
        ReturnType::Default => {
            errors.at(
                sig.ident.span(),
                format!("{want}; add a return type, e.g. `-> {}`", need.example),
            );
            return None;
        }
    };
    let (ok_ty, err_ty, written) = match result_type(ret_ty) {
        ResultType::Named { ok, err } => (Some(ok), err, vec![Some(ok), err]),
        // The type checker finds `Ok` and `Err` (and says so when it is no `Result`).
        ResultType::Alias { first } => (None, None, vec![Some(first)]),
        ResultType::NotResult => {
            errors.spanned(
                ret_ty,
                format!(
                    "{want}; wrap the return type in `Result`, e.g. `-> {}`",
                    need.example
                ),
            );
            return None;
        }
    };
    let mut concrete = true;
    for ty in written.into_iter().flatten() {
        if let Type::ImplTrait(_) = peel(ty) {
            errors.spanned(ty, need.named);
            concrete = false;
        }
    }
    concrete.then(|| ResultShape {
        ret_ty: ret_ty.clone(),
        ok_ty: ok_ty.cloned(),
        err_ty: err_ty.cloned(),
    })
}

/// What a return type says about `Result`.
pub(crate) enum ResultType<'a> {
    /// `Result<T, E>`, `io::Result<T>`, `anyhow::Result<T>`: a type named `Result`, so its first
    /// argument is the `Ok` type; the error type is written only in the two-argument form.
    Named { ok: &'a Type, err: Option<&'a Type> },
    /// `ShopResult<Receipt>`: a generic type with another name, probably an alias of `Result`. The
    /// generated code lets the type checker find its `Ok` and `Err` types (and say so when it is no
    /// `Result`); `first` is its first type argument, by convention the `Ok` type.
    Alias { first: &'a Type },
    /// `u8`, `()`, `Option<T>`, `Vec<T>`, `&T`, `impl Trait`: certainly not a `Result`.
    NotResult,
}

/// Generic std types that are certainly no alias of `Result`.
const NOT_RESULT: [&str; 19] = [
    "Option",
    "Vec",
    "VecDeque",
    "Box",
    "Rc",
    "Arc",
    "Pin",
    "Cow",
    "HashMap",
    "HashSet",
    "BTreeMap",
    "BTreeSet",
    "Poll",
    "Cell",
    "RefCell",
    "Mutex",
    "RwLock",
    "PhantomData",
    "Transition",
];

/// Classifies `ty` (looking through parentheses and the invisible groups of `macro_rules!`).
pub(crate) fn result_type(ty: &Type) -> ResultType<'_> {
    let Type::Path(path) = peel(ty) else {
        return ResultType::NotResult;
    };
    let Some(last) = path.path.segments.last() else {
        return ResultType::NotResult;
    };
    let PathArguments::AngleBracketed(arguments) = &last.arguments else {
        return ResultType::NotResult;
    };
    if path.qself.is_some() {
        return ResultType::NotResult;
    }
    let types: Vec<&Type> = arguments
        .args
        .iter()
        .filter_map(|argument| match argument {
            GenericArgument::Type(ty) => Some(ty),
            _ => None,
        })
        .collect();
    let name = last.ident.to_string();
    match types.as_slice() {
        [ok] if name == "Result" => ResultType::Named { ok, err: None },
        [ok, err] if name == "Result" => ResultType::Named { ok, err: Some(err) },
        [first, ..] if name != "Result" && !NOT_RESULT.contains(&name.as_str()) => {
            ResultType::Alias { first }
        }
        _ => ResultType::NotResult,
    }
}

/// `ty` without invisible groups and parentheses.
pub(crate) fn peel(ty: &Type) -> &Type {
    match ty {
        Type::Group(group) => peel(&group.elem),
        Type::Paren(paren) => peel(&paren.elem),
        other => other,
    }
}

/// The type arguments of `ty` when it is a path ending in `name<…>` (`Transition<T, S>`).
pub(crate) fn type_arguments<'a>(ty: &'a Type, name: &str) -> Option<Vec<&'a Type>> {
    let Type::Path(path) = peel(ty) else {
        return None;
    };
    let last = path.path.segments.last()?;
    if path.qself.is_some() || last.ident != name {
        return None;
    }
    let PathArguments::AngleBracketed(arguments) = &last.arguments else {
        return None;
    };
    Some(
        arguments
            .args
            .iter()
            .filter_map(|argument| match argument {
                GenericArgument::Type(ty) => Some(ty),
                _ => None,
            })
            .collect(),
    )
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

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn classify(ty: Type) -> &'static str {
        match result_type(&ty) {
            ResultType::Named { err: Some(_), .. } => "named",
            ResultType::Named { err: None, .. } => "named, one argument",
            ResultType::Alias { .. } => "alias",
            ResultType::NotResult => "not a result",
        }
    }

    #[test]
    fn classifies_return_types() {
        assert_eq!(classify(syn::parse_quote!(Result<u8, E>)), "named");
        assert_eq!(
            classify(syn::parse_quote!(std::result::Result<u8, E>)),
            "named"
        );
        assert_eq!(
            classify(syn::parse_quote!(anyhow::Result<u8>)),
            "named, one argument"
        );
        assert_eq!(classify(syn::parse_quote!(ShopResult<Receipt>)), "alias");
        assert_eq!(
            classify(syn::parse_quote!(shop::Outcome<Receipt, E>)),
            "alias"
        );
        for not in [
            quote!(u8),
            quote!(()),
            quote!(Receipt),
            quote!(Option<u8>),
            quote!(Vec<u8>),
            quote!(&'static str),
            quote!(impl Future<Output = u8>),
            quote!(Result),
        ] {
            let ty: Type = syn::parse2(not.clone()).unwrap();
            assert_eq!(classify(ty), "not a result", "{not}");
        }
    }

    #[test]
    fn finds_type_arguments() {
        let ty: Type = syn::parse_quote!(idem::Transition<u8, OrderStatus>);
        let args = type_arguments(&ty, "Transition").unwrap();
        assert_eq!(args.len(), 2);
        assert!(type_arguments(&ty, "Result").is_none());
    }
}
