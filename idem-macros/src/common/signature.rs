//! The fn an attribute wraps: `async`, not `const`, returning `Result<T, E>` (or a one-argument alias),
//! and the names its parameters bind.

use syn::{FnArg, GenericArgument, Pat, PathArguments, ReturnType, Signature, Type};

use crate::common::diag::Errors;

/// The fn's return type, `Result<T, E>` (or a one-argument alias such as `anyhow::Result<T>`).
pub(crate) struct ResultShape {
    pub(crate) ret_ty: Type,
    pub(crate) ok_ty: Type,
    /// `None` for a one-argument alias: its error type is not written in the signature.
    pub(crate) err_ty: Option<Type>,
}

/// `async`, not `const`, returns `Result`.
pub(crate) fn check_signature(sig: &Signature, errors: &mut Errors) -> Option<ResultShape> {
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
pub(crate) fn peel(ty: &Type) -> &Type {
    match ty {
        Type::Group(group) => peel(&group.elem),
        Type::Paren(paren) => peel(&paren.elem),
        other => other,
    }
}

/// `(T, Some(E))` for `…::Result<T, E>`, `(T, None)` for a one-argument alias `…::Result<T>`.
pub(crate) fn result_arguments(ty: &Type) -> Option<(&Type, Option<&Type>)> {
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
