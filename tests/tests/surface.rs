//! The crate root stays small enough to hold in one's head: at most [`MAX_ROOT_NAMES`] names.
//!
//! What `idem::` offers at its root is the runtime's root (`idem-runtime/src/lib.rs`, which the
//! facade re-exports with `pub use idem_runtime::*`) plus what the facade adds (`src/lib.rs`: the
//! macros, the re-exported `sqlx` and `aws_sdk_dynamodb`). Both files are read with `syn`, every
//! feature's items included (a feature-gated store counts as if it were on): each name a `pub use`
//! brings in, each `pub` item declared there, and each `#[macro_export]` macro of the runtime,
//! which lands at the root wherever it is written. Not counted: modules (they are where the rest
//! goes), and items or re-exports marked `#[doc(hidden)]` (what generated code reaches). A name in
//! two namespaces (the `StateMachine` trait and its derive) counts once.
//!
//! Reading the source rather than the built crate counts what a user of any feature set can see,
//! without building every feature combination; `counts_what_it_should` shows the reader counts
//! and refuses what it should.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use syn::{Attribute, Item, UseTree, Visibility};

/// The most names the crate root may hold.
const MAX_ROOT_NAMES: usize = 60;

/// The repository root (the suite is the member at `tests/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the suite lives in the repository")
        .to_path_buf()
}

fn parse(path: &Path) -> syn::File {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `#[doc(hidden)]` among the attributes.
fn hidden(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("doc")
            && a.parse_args::<syn::Ident>()
                .is_ok_and(|arg| arg == "hidden")
    })
}

fn has(attrs: &[Attribute], name: &str) -> bool {
    attrs.iter().any(|a| a.path().is_ident(name))
}

/// The names a use tree brings in, each with the path it names (a glob brings in another crate's
/// root: `globs` gets its path).
fn use_names(
    tree: &UseTree,
    prefix: &str,
    names: &mut Vec<(String, String)>,
    globs: &mut Vec<String>,
) {
    match tree {
        UseTree::Path(p) => use_names(&p.tree, &format!("{prefix}{}::", p.ident), names, globs),
        UseTree::Name(n) => names.push((n.ident.to_string(), format!("{prefix}{}", n.ident))),
        UseTree::Rename(r) => names.push((r.rename.to_string(), format!("{prefix}{}", r.ident))),
        UseTree::Glob(_) => globs.push(prefix.trim_end_matches("::").to_owned()),
        UseTree::Group(g) => g
            .items
            .iter()
            .for_each(|t| use_names(t, prefix, names, globs)),
    }
}

/// What one root file puts at the crate root: visible names (name → what it is), the paths its
/// re-exports name, the modules it declares, and the paths it glob-imports.
#[derive(Default)]
struct Root {
    names: BTreeMap<String, &'static str>,
    reexported: BTreeSet<String>,
    modules: BTreeSet<String>,
    globs: Vec<String>,
}

fn read_root(file: &syn::File) -> Root {
    let mut root = Root::default();
    for item in &file.items {
        let (vis, attrs, name, kind) = match item {
            Item::Mod(m) => {
                if matches!(m.vis, Visibility::Public(_)) && !hidden(&m.attrs) {
                    root.modules.insert(m.ident.to_string());
                }
                continue;
            }
            Item::Use(u) => {
                if !matches!(u.vis, Visibility::Public(_)) || hidden(&u.attrs) {
                    continue;
                }
                let mut names = Vec::new();
                use_names(&u.tree, "", &mut names, &mut root.globs);
                for (name, path) in names {
                    root.names.insert(name, "re-export");
                    root.reexported.insert(path);
                }
                continue;
            }
            Item::Macro(m) => {
                if has(&m.attrs, "macro_export") && !hidden(&m.attrs) {
                    let name = m.ident.as_ref().expect("a macro_rules has a name");
                    root.names.insert(name.to_string(), "macro");
                }
                continue;
            }
            Item::Fn(i) => (&i.vis, &i.attrs, i.sig.ident.to_string(), "fn"),
            Item::Struct(i) => (&i.vis, &i.attrs, i.ident.to_string(), "struct"),
            Item::Enum(i) => (&i.vis, &i.attrs, i.ident.to_string(), "enum"),
            Item::Trait(i) => (&i.vis, &i.attrs, i.ident.to_string(), "trait"),
            Item::Const(i) => (&i.vis, &i.attrs, i.ident.to_string(), "const"),
            Item::Static(i) => (&i.vis, &i.attrs, i.ident.to_string(), "static"),
            Item::Type(i) => (&i.vis, &i.attrs, i.ident.to_string(), "type"),
            Item::Union(i) => (&i.vis, &i.attrs, i.ident.to_string(), "union"),
            _ => continue,
        };
        if matches!(vis, Visibility::Public(_)) && !hidden(attrs) {
            root.names.insert(name, kind);
        }
    }
    root
}

/// `#[macro_export]` macros anywhere in these items (they land at the crate root).
fn exported_macros(items: &[Item], out: &mut BTreeSet<String>) {
    for item in items {
        match item {
            Item::Macro(m) if has(&m.attrs, "macro_export") && !hidden(&m.attrs) => {
                out.insert(
                    m.ident
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                );
            }
            Item::Mod(m) => {
                if let Some((_, items)) = &m.content {
                    exported_macros(items, out);
                }
            }
            _ => {}
        }
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The names `idem::` shows at its root, from the runtime's and the facade's root files; the
/// runtime's modules are the facade's too.
fn root_names(
    runtime: &syn::File,
    facade: &syn::File,
    macros: &BTreeSet<String>,
) -> BTreeMap<String, &'static str> {
    let runtime = read_root(runtime);
    let facade = read_root(facade);
    assert_eq!(
        facade.globs,
        ["idem_runtime"],
        "the facade re-exports the runtime's root and nothing else by glob"
    );
    assert!(
        runtime.globs.is_empty(),
        "a glob at the runtime's root: {:?}",
        runtime.globs
    );
    let mut names = runtime.names;
    for (name, kind) in facade.names {
        // The facade re-exporting one of the runtime's modules (`pub use idem_runtime::admin`)
        // adds a module, not a name; a root fn that shares its name with a module (`store`)
        // still counts.
        let module = runtime.modules.contains(&name)
            && facade.reexported.contains(&format!("idem_runtime::{name}"));
        if !module {
            names.entry(name).or_insert(kind);
        }
    }
    for m in macros {
        names.entry(m.clone()).or_insert("macro");
    }
    names
}

#[test]
fn the_crate_root_holds_at_most_sixty_names() {
    let root = root();
    let runtime = parse(&root.join("idem-runtime/src/lib.rs"));
    let facade = parse(&root.join("src/lib.rs"));
    let mut files = Vec::new();
    rust_files(&root.join("idem-runtime/src"), &mut files);
    let mut macros = BTreeSet::new();
    for f in &files {
        exported_macros(&parse(f).items, &mut macros);
    }
    let names = root_names(&runtime, &facade, &macros);
    let listed: Vec<String> = names.iter().map(|(n, k)| format!("{n} ({k})")).collect();
    assert!(
        names.len() <= MAX_ROOT_NAMES,
        "the crate root holds {} names, more than {MAX_ROOT_NAMES}: move the ones a user does not \
         name day to day into a module (see \"The crate's surface\" in docs/DESIGN.md):\n{}",
        names.len(),
        listed.join("\n")
    );
    // Far fewer would mean the reader stopped seeing the root (a renamed file, a new layout).
    assert!(
        names.len() >= 30,
        "only {} names found at the root: {listed:?}",
        names.len()
    );
}

#[test]
fn counts_what_it_should() {
    let runtime: syn::File = syn::parse_quote! {
        pub mod store;
        mod engine;
        #[doc(hidden)]
        pub mod __private;
        pub use engine::{Call, Recovering as Again, steps::{step, MAX_STEPS}};
        pub(crate) use engine::Internal;
        #[doc(hidden)]
        pub use __private::Hidden;
        #[cfg(feature = "sqlite")]
        pub use backend::SqliteStore;
        pub use store::Store;
        pub use registry::store;
        pub mod admin;
        pub const DEFAULT_TTL: u32 = 1;
        pub trait StateMachine {}
        #[doc(hidden)]
        pub fn generated() {}
        fn private() {}
    };
    let facade: syn::File = syn::parse_quote! {
        pub use idem_macros::{StateMachine, idempotent};
        pub use idem_runtime::admin;
        pub use idem_runtime::*;
        pub use idem_runtime::sqlx;
    };
    let macros = BTreeSet::from(["sql_text".to_owned()]);
    let names: Vec<String> = root_names(&runtime, &facade, &macros).into_keys().collect();
    assert_eq!(
        names,
        [
            "Again",
            "Call",
            "DEFAULT_TTL",
            "MAX_STEPS",
            "SqliteStore",
            "StateMachine",
            "Store",
            "idempotent",
            "sql_text",
            "sqlx",
            "step",
            "store",
        ]
    );
}
