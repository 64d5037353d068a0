//! Code generation for `#[derive(StateMachine)]`.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};
use syn::Ident;

use super::Machine;

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
    let krate = match krate {
        Some(path) => quote!(#path),
        None => quote!(::idem),
    };
    let name = ident.to_string();
    let version = match version {
        Some(version) => quote!(::core::option::Option::Some(#version)),
        None => quote!(::core::option::Option::None),
    };
    let names: Vec<&str> = states.iter().map(|s| s.name.as_str()).collect();
    let variants: Vec<&Ident> = states.iter().map(|s| &s.variant).collect();
    let terminal = states
        .iter()
        .filter(|s| s.terminal)
        .map(|s| s.name.as_str());
    let stored = |variant: &Ident| -> &str {
        states
            .iter()
            .find(|s| &s.variant == variant)
            .map_or("", |s| s.name.as_str())
    };
    let edges = states.iter().flat_map(|s| {
        s.to.iter().map(move |to| {
            let (from, to) = (s.name.as_str(), stored(to));
            quote!((#from, #to))
        })
    });
    let markers = names.iter().map(|name| Ident::new(name, Span::call_site()));
    let module = format_ident!("__idem_sm_{}", ident);
    quote! {
        impl #krate::StateMachine for #ident {
            const NAME: &'static str = #name;
            const TABLE: &'static str = #table;
            const KEY_COLUMN: &'static str = #key;
            const STATUS_COLUMN: &'static str = #status;
            const VERSION_COLUMN: ::core::option::Option<&'static str> = #version;
            const STATES: &'static [&'static str] = &[#(#names),*];
            const TERMINAL: &'static [&'static str] = &[#(#terminal),*];
            const EDGES: &'static [(&'static str, &'static str)] = &[#(#edges),*];
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
        impl ::core::fmt::Display for #ident {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.pad(#krate::StateMachine::as_str(*self))
            }
        }
        impl ::core::str::FromStr for #ident {
            type Err = #krate::UnknownState;
            fn from_str(name: &str) -> ::core::result::Result<Self, Self::Err> {
                <Self as #krate::StateMachine>::parse(name)
                    .ok_or_else(|| #krate::UnknownState::new(#name, name))
            }
        }
        impl #krate::__private::Machine for #ident {
            type States = #module::__idem_states::States;
        }
        #krate::__private::sqlite_text!(#ident);

        // What `#[state_transition]` resolves: `__IdemMachine` names the one machine of this module
        // (two machines in one module make it ambiguous, and then `machine = …` picks one), and
        // `States` has one const per stored name, so a misspelled name gets rustc's "similar name".
        #[doc(hidden)]
        #[allow(non_snake_case, non_camel_case_types, non_upper_case_globals, missing_docs, unreachable_pub)]
        pub mod #module {
            pub type __IdemMachine = super::#ident;
            pub mod __idem_states {
                pub struct States;
                impl States {
                    #(pub const #markers: () = ();)*
                }
            }
        }
        #[doc(hidden)]
        #[allow(unused_imports)]
        use #module::*;
    }
}
