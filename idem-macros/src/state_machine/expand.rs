//! Code generation for `#[derive(StateMachine)]`: the `idem::StateMachine` impl, `Display` /
//! `FromStr` (the stored name), the sqlx impls (through the runtime, so the user's crate needs no sqlx
//! features) and the machine's hidden macro, through which `#[state_transition]` checks its states
//! and transition against the machine.

use std::sync::atomic::{AtomicUsize, Ordering};

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::{Ident, Path};

use super::Machine;
use super::description::{Description, MachineInfo};

pub(super) fn expand(machine: &Machine) -> TokenStream {
    let Machine {
        ident,
        table,
        key,
        status,
        version,
        krate,
        states,
    } = machine;
    let krate = crate_path(krate.as_ref());
    let name = ident.to_string();
    let version_const = match version {
        Some(version) => quote!(::core::option::Option::Some(#version)),
        None => quote!(::core::option::Option::None),
    };
    let names: Vec<&str> = states.iter().map(|s| s.name.as_str()).collect();
    let variants: Vec<&Ident> = states.iter().map(|s| &s.variant).collect();
    let terminal: Vec<&str> = states
        .iter()
        .filter(|s| s.terminal)
        .map(|s| s.name.as_str())
        .collect();
    let stored = |variant: &Ident| -> &str {
        states
            .iter()
            .find(|s| &s.variant == variant)
            .map_or("", |s| s.name.as_str())
    };
    let edges: Vec<(&str, &str)> = states
        .iter()
        .flat_map(|s| s.to.iter().map(move |to| (s.name.as_str(), stored(to))))
        .collect();
    let edge_consts = edges.iter().map(|(from, to)| quote!((#from, #to)));
    let description = MachineInfo::Known(Description {
        name: ident.clone(),
        table: table.clone(),
        key: key.clone(),
        status: status.clone(),
        version: version.clone(),
        states: states
            .iter()
            .map(|s| (s.name.clone(), s.variant.clone()))
            .collect(),
        terminal: terminal.iter().map(|name| (*name).to_owned()).collect(),
        edges: edges
            .iter()
            .map(|(from, to)| ((*from).to_owned(), (*to).to_owned()))
            .collect(),
    });
    let common = display_and_sqlx(ident, &krate);
    let machine_macro = machine_macro(ident, &description);
    quote! {
        impl #krate::StateMachine for #ident {
            const NAME: &'static str = #name;
            const TABLE: &'static str = #table;
            const KEY_COLUMN: &'static str = #key;
            const STATUS_COLUMN: &'static str = #status;
            const VERSION_COLUMN: ::core::option::Option<&'static str> = #version_const;
            const STATES: &'static [&'static str] = &[#(#names),*];
            const TERMINAL: &'static [&'static str] = &[#(#terminal),*];
            const EDGES: &'static [(&'static str, &'static str)] = &[#(#edge_consts),*];
            fn as_str(self) -> &'static str {
                match self {
                    #(Self::#variants => #names,)*
                }
            }
            fn parse(name: &str) -> ::core::option::Option<Self> {
                match name {
                    #(#names => ::core::option::Option::Some(Self::#variants),)*
                    _ => ::core::option::Option::None,
                }
            }
        }
        #common
        #machine_macro
    }
}

/// What a derive that found an error still emits, so that the code using the machine (its
/// `#[state_transition]` fns, `Display`, the sqlx impls) adds no errors of its own: one mistake, one
/// error. It is never run: the crate does not compile.
pub(super) fn stub(ident: &Ident, krate: Option<&Path>) -> TokenStream {
    let krate = crate_path(krate);
    let name = ident.to_string();
    let common = display_and_sqlx(ident, &krate);
    let machine_macro = machine_macro(ident, &MachineInfo::Broken);
    quote! {
        impl #krate::StateMachine for #ident {
            const NAME: &'static str = #name;
            const TABLE: &'static str = "";
            const KEY_COLUMN: &'static str = "";
            const STATUS_COLUMN: &'static str = "";
            const VERSION_COLUMN: ::core::option::Option<&'static str> = ::core::option::Option::None;
            const STATES: &'static [&'static str] = &[];
            const TERMINAL: &'static [&'static str] = &[];
            const EDGES: &'static [(&'static str, &'static str)] = &[];
            fn as_str(self) -> &'static str {
                ""
            }
            fn parse(_: &str) -> ::core::option::Option<Self> {
                ::core::option::Option::None
            }
        }
        #common
        #machine_macro
    }
}

/// idem's path in the user's crate (see [`crate_root`](crate::common::wrap::crate_root)).
fn crate_path(krate: Option<&Path>) -> TokenStream {
    crate::common::wrap::crate_root(krate)
}

/// `Display` and `FromStr` through the stored name, binding as a SQL value (its stored name, for
/// `set(status_copy = …)` and the like), and the sqlx impls.
fn display_and_sqlx(ident: &Ident, krate: &TokenStream) -> TokenStream {
    let name = ident.to_string();
    let private = quote!(#krate::__private);
    quote! {
        impl ::core::fmt::Display for #ident {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.pad(#krate::StateMachine::as_str(*self))
            }
        }
        impl ::core::str::FromStr for #ident {
            type Err = #private::UnknownState;
            fn from_str(name: &str) -> ::core::result::Result<Self, Self::Err> {
                <Self as #krate::StateMachine>::parse(name)
                    .ok_or_else(|| #private::UnknownState::new(#name, name))
            }
        }
        impl #private::ToSqlValue for #ident {
            fn to_sql_value(
                &self,
            ) -> ::core::result::Result<#private::SqlValue<'_>, #krate::IdemError> {
                ::core::result::Result::Ok(#private::SqlValue::Text(
                    ::std::borrow::Cow::Borrowed(#krate::StateMachine::as_str(*self)),
                ))
            }
        }
        #private::sql_text!(#ident);
    }
}

/// A process-wide count, to give each machine's macro its own name at the crate root.
static MACHINES: AtomicUsize = AtomicUsize::new(0);

/// The machine's hidden macro, reachable under the enum's own name.
///
/// Types and macros are separate namespaces, so wherever the enum is in scope (declared there,
/// imported with `use path::OrderStatus;`, re-exported, or from another crate) so is its macro, and
/// `#[state_transition]`, which finds the enum in its fn's return type, calls `OrderStatus! { … }`.
/// The macro hands the transition, with the machine's description, to the checker the transition
/// named (idem's hidden `check_transition!`), which reports each mistake at the user's own token:
/// the tokens keep their spans through `macro_rules!`.
///
/// `#[macro_export]` makes the macro usable from other crates; it puts it at the crate root, so its
/// name there must be unique (two enums may share a name in two modules), and `pub use` brings it
/// next to the enum under the enum's name.
fn machine_macro(ident: &Ident, info: &MachineInfo) -> TokenStream {
    let id = MACHINES.fetch_add(1, Ordering::Relaxed);
    let hidden = format_ident!("__idem_machine_{}_{}", ident, id);
    quote! {
        #[doc(hidden)]
        #[macro_export]
        #[allow(non_local_definitions)]
        macro_rules! #hidden {
            (($($checker:tt)*) $($transition:tt)*) => {
                $($checker)*! { #info $($transition)* }
            };
        }
        #[doc(hidden)]
        #[allow(unused_imports, unreachable_pub)]
        pub use #hidden as #ident;
    }
}
