//! What `#[derive(StateMachine)]` tells `#[state_transition]` about a machine: its name, table,
//! columns, stored state names with their variants, terminal states and declared transitions.
//!
//! The derive writes it into the machine's hidden macro (see `expand.rs`); the macro hands it, with
//! the transition's own tokens, to idem's hidden `check_transition!`, which parses it back here. Both
//! ends are this crate, so the format is private to it:
//!
//! ```text
//! machine {
//!     name = OrderStatus;
//!     table = "orders"; key = "order_no"; status = "status"; version = "version";
//!     state "WAIT_PAY" = WaitPay; state "PAID" = Paid;
//!     terminal "PAID";
//!     edge "WAIT_PAY" => "PAID";
//! }
//! ```
//!
//! or `machine { broken }` when the derive reported an error (the transitions then check nothing, so
//! one mistake gives one error).

use proc_macro2::TokenStream;
use quote::{ToTokens, quote};
use syn::parse::{Parse, ParseStream};
use syn::{Ident, LitStr, Token};

/// A machine as `#[state_transition]` checks against it.
pub(crate) enum MachineInfo {
    Known(Description),
    /// The derive found an error: nothing to check against.
    Broken,
}

pub(crate) struct Description {
    /// The enum's name.
    pub(crate) name: Ident,
    pub(crate) table: String,
    pub(crate) key: String,
    pub(crate) status: String,
    pub(crate) version: Option<String>,
    /// `(stored name, variant)`, in declaration order.
    pub(crate) states: Vec<(String, Ident)>,
    pub(crate) terminal: Vec<String>,
    /// `(from, to)` by stored name.
    pub(crate) edges: Vec<(String, String)>,
}

impl ToTokens for MachineInfo {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        let body = match self {
            MachineInfo::Broken => quote!(broken),
            MachineInfo::Known(description) => {
                let Description {
                    name,
                    table,
                    key,
                    status,
                    version,
                    states,
                    terminal,
                    edges,
                } = description;
                let version = version.iter().map(|version| quote!(version = #version;));
                let states = states
                    .iter()
                    .map(|(stored, variant)| quote!(state #stored = #variant;));
                let edges = edges.iter().map(|(from, to)| quote!(edge #from => #to;));
                quote! {
                    name = #name;
                    table = #table;
                    key = #key;
                    status = #status;
                    #(#version)*
                    #(#states)*
                    #(terminal #terminal;)*
                    #(#edges)*
                }
            }
        };
        tokens.extend(quote!(machine { #body }));
    }
}

impl Parse for MachineInfo {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let keyword: Ident = input.parse()?;
        if keyword != "machine" {
            return Err(syn::Error::new(keyword.span(), "expected `machine { … }`"));
        }
        let content;
        syn::braced!(content in input);
        if content.peek(Ident) && content.fork().parse::<Ident>()? == "broken" {
            content.parse::<Ident>()?;
            return Ok(MachineInfo::Broken);
        }
        let mut description = Description {
            name: Ident::new("Machine", proc_macro2::Span::call_site()),
            table: String::new(),
            key: String::new(),
            status: String::new(),
            version: None,
            states: Vec::new(),
            terminal: Vec::new(),
            edges: Vec::new(),
        };
        while !content.is_empty() {
            let entry: Ident = content.parse()?;
            match entry.to_string().as_str() {
                "name" => {
                    content.parse::<Token![=]>()?;
                    description.name = content.parse()?;
                }
                "state" => {
                    let stored: LitStr = content.parse()?;
                    content.parse::<Token![=]>()?;
                    description.states.push((stored.value(), content.parse()?));
                }
                "terminal" => description
                    .terminal
                    .push(content.parse::<LitStr>()?.value()),
                "edge" => {
                    let from: LitStr = content.parse()?;
                    content.parse::<Token![=>]>()?;
                    let to: LitStr = content.parse()?;
                    description.edges.push((from.value(), to.value()));
                }
                column => {
                    content.parse::<Token![=]>()?;
                    let value = content.parse::<LitStr>()?.value();
                    match column {
                        "table" => description.table = value,
                        "key" => description.key = value,
                        "status" => description.status = value,
                        "version" => description.version = Some(value),
                        _ => return Err(syn::Error::new(entry.span(), "unknown machine entry")),
                    }
                }
            }
            content.parse::<Token![;]>()?;
        }
        Ok(MachineInfo::Known(description))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::Span;

    #[test]
    fn reads_back_what_it_writes() {
        let ident = |name| Ident::new(name, Span::call_site());
        let written = MachineInfo::Known(Description {
            name: ident("OrderStatus"),
            table: "orders".into(),
            key: "order_no".into(),
            status: "status".into(),
            version: Some("version".into()),
            states: vec![
                ("WAIT_PAY".into(), ident("WaitPay")),
                ("PAID".into(), ident("Paid")),
            ],
            terminal: vec!["PAID".into()],
            edges: vec![("WAIT_PAY".into(), "PAID".into())],
        });
        let tokens = written.to_token_stream();
        let MachineInfo::Known(read) = syn::parse2(tokens).unwrap() else {
            panic!("a known machine")
        };
        assert_eq!(read.name, "OrderStatus");
        assert_eq!(
            (read.table.as_str(), read.key.as_str(), read.status.as_str()),
            ("orders", "order_no", "status")
        );
        assert_eq!(read.version.as_deref(), Some("version"));
        assert_eq!(read.states[1].0, "PAID");
        assert_eq!(read.states[1].1, "Paid");
        assert_eq!(read.terminal, ["PAID"]);
        assert_eq!(read.edges, [("WAIT_PAY".to_owned(), "PAID".to_owned())]);

        let broken = MachineInfo::Broken.to_token_stream();
        assert!(matches!(syn::parse2(broken), Ok(MachineInfo::Broken)));
    }
}
