//! House rules for the runtime's and the macros' source, counted rather than remembered.
//!
//! Every `.rs` file under `idem-runtime/src` and `idem-macros/src` is parsed with `syn`, and:
//!
//! - no function (free `fn`, method in an `impl`, trait method with a default body, nested `fn`)
//!   is longer than [`MAX_FN_LINES`] lines, counted from the line of its `fn` signature (after
//!   attributes and doc comments) to the line of its closing brace;
//! - no file is longer than [`MAX_FILE_LINES`] lines.
//!
//! A long function that is a table rather than a procedure (a `match` that maps each code to its
//! message, a list of cases) is exempt when a comment line `// table: <why>` sits among the lines
//! directly above it: between its attributes and doc comments, or on the line just before the
//! first of them. The reason must not be empty. A long procedure is split into named steps
//! instead.
//!
//! A file longer than the limit is allowed only through [`LONG_FILES`], each entry with its
//! reason; an entry whose file is no longer long (or no longer there) fails too, so the list only
//! shrinks.
//!
//! `self_test` shows the counter finds a long function, honours the table marker, and refuses an
//! empty one.

use std::fs;
use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::{self, Visit};

/// The longest a function may be, in lines.
const MAX_FN_LINES: usize = 120;

/// The longest a source file may be, in lines.
const MAX_FILE_LINES: usize = 600;

/// The crates whose sources are held to these rules, relative to the repository root.
const CRATES: &[&str] = &["idem-runtime/src", "idem-macros/src"];

/// Files allowed over [`MAX_FILE_LINES`] (path relative to the repository root, reason).
const LONG_FILES: &[(&str, &str)] = &[];

/// The repository root (the suite is the member at `tests/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the suite lives in the repository")
        .to_path_buf()
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// A function over the limit, as the failure lists it.
#[derive(Debug, PartialEq, Eq)]
struct LongFn {
    /// Line of the `fn` signature (1-based).
    line: usize,
    name: String,
    lines: usize,
}

/// What one file breaks: functions over the limit, and table markers without a reason.
#[derive(Debug, Default, PartialEq, Eq)]
struct Findings {
    long: Vec<LongFn>,
    /// Lines (1-based) of `// table:` markers with nothing after the colon.
    empty_markers: Vec<usize>,
}

/// Walks one file's syntax tree and measures every function with a body.
struct Counter<'a> {
    /// The file's lines, to read the comments above a function (comments are not in the tree).
    source: Vec<&'a str>,
    findings: Findings,
}

impl Counter<'_> {
    /// Measures one function: `attrs` are its attributes (doc comments included), `sig` where its
    /// signature starts, `end` where its body ends.
    fn measure(&mut self, name: &syn::Ident, attrs: &[syn::Attribute], sig: usize, end: usize) {
        let lines = end + 1 - sig;
        if lines <= MAX_FN_LINES {
            return;
        }
        // The lines above the signature that belong to it: its attributes and doc comments, the
        // comments between them, and the one line just before the first of them.
        let first = attrs
            .iter()
            .map(|attr| attr.span().start().line)
            .chain([sig])
            .min()
            .unwrap_or(sig);
        let mut table = false;
        for line in first.saturating_sub(1).max(1)..sig {
            let text = self.source.get(line - 1).map_or("", |text| text.trim());
            if let Some(reason) = text.strip_prefix("// table:") {
                if reason.trim().is_empty() {
                    self.findings.empty_markers.push(line);
                } else {
                    table = true;
                }
            }
        }
        if !table {
            self.findings.long.push(LongFn {
                line: sig,
                name: name.to_string(),
                lines,
            });
        }
    }
}

/// Where a signature starts: its visibility when it has one (`pub(crate) async fn` may break
/// lines), else the signature itself.
fn sig_line(vis: Option<&syn::Visibility>, sig: &syn::Signature) -> usize {
    let sig = sig.span().start().line;
    match vis {
        Some(syn::Visibility::Inherited) | None => sig,
        Some(vis) => vis.span().start().line.min(sig),
    }
}

impl<'ast> Visit<'ast> for Counter<'_> {
    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        let start = sig_line(Some(&item.vis), &item.sig);
        let end = item.block.span().end().line;
        self.measure(&item.sig.ident, &item.attrs, start, end);
        visit::visit_item_fn(self, item);
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        let start = sig_line(Some(&item.vis), &item.sig);
        let end = item.block.span().end().line;
        self.measure(&item.sig.ident, &item.attrs, start, end);
        visit::visit_impl_item_fn(self, item);
    }

    fn visit_trait_item_fn(&mut self, item: &'ast syn::TraitItemFn) {
        if let Some(body) = &item.default {
            let start = sig_line(None, &item.sig);
            let end = body.span().end().line;
            self.measure(&item.sig.ident, &item.attrs, start, end);
        }
        visit::visit_trait_item_fn(self, item);
    }
}

/// Parses `source` and measures its functions.
fn check_source(source: &str) -> Result<Findings, syn::Error> {
    let file = syn::parse_file(source)?;
    let mut counter = Counter {
        source: source.lines().collect(),
        findings: Findings::default(),
    };
    counter.visit_file(&file);
    Ok(counter.findings)
}

/// A file's path relative to the repository root, with `/` whichever the platform.
fn relative(root: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(root).expect("a file under the root");
    rel.components()
        .map(|part| part.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

#[test]
fn no_function_over_120_lines() {
    let root = root();
    let mut failures = Vec::new();
    let mut files_seen = 0usize;
    for krate in CRATES {
        for path in rust_files(&root.join(krate)) {
            let rel = relative(&root, &path);
            let source = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
            let findings = check_source(&source)
                .unwrap_or_else(|e| panic!("{rel}:{}: {e}", e.span().start().line));
            files_seen += 1;
            for long in findings.long {
                failures.push(format!(
                    "{rel}:{} {} {} lines",
                    long.line, long.name, long.lines
                ));
            }
            for line in findings.empty_markers {
                failures.push(format!("{rel}:{line} `// table:` without a reason"));
            }
        }
    }
    assert!(
        files_seen > 50,
        "found only {files_seen} files: wrong root?"
    );
    assert!(
        failures.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them into named steps, or mark a table with \
         `// table: <why>` above it):\n{}",
        failures.join("\n")
    );
}

#[test]
fn no_file_over_600_lines() {
    let root = root();
    let mut failures = Vec::new();
    let mut allowed_and_long = Vec::new();
    for krate in CRATES {
        for path in rust_files(&root.join(krate)) {
            let rel = relative(&root, &path);
            let source = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
            let lines = source.lines().count();
            if lines <= MAX_FILE_LINES {
                continue;
            }
            if LONG_FILES.iter().any(|(allowed, _)| *allowed == rel) {
                allowed_and_long.push(rel);
            } else {
                failures.push(format!("{rel} {lines} lines"));
            }
        }
    }
    for (allowed, reason) in LONG_FILES {
        assert!(
            !reason.trim().is_empty(),
            "{allowed}: an allowed long file needs a reason"
        );
        if !allowed_and_long.iter().any(|rel| rel == allowed) {
            failures.push(format!(
                "{allowed} is allowed over {MAX_FILE_LINES} lines ({reason}) but is not: \
                 take it off LONG_FILES"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "files over {MAX_FILE_LINES} lines (split them, or allow one in LONG_FILES with a \
         reason):\n{}",
        failures.join("\n")
    );
}

/// The counter on small sources: it must see a long function, and take only a real table marker.
#[test]
fn self_test() {
    let body = |n: usize| "    let _ = 0;\n".repeat(n);
    // 1 signature line + 119 body lines + 1 closing brace = 121 lines.
    let long = format!("/// Doc.\n#[inline]\npub fn long() {{\n{}}}\n", body(119));
    let findings = check_source(&long).unwrap();
    assert_eq!(
        findings.long,
        vec![LongFn {
            line: 3,
            name: "long".into(),
            lines: 121,
        }]
    );

    // Exactly the limit passes.
    let fits = format!("fn fits() {{\n{}}}\n", body(118));
    assert_eq!(check_source(&fits).unwrap(), Findings::default());

    // Methods, trait defaults and nested functions are measured too.
    let method = format!(
        "struct S;\nimpl S {{\n    fn m(&self) {{\n{}    }}\n}}\n",
        body(125)
    );
    assert_eq!(check_source(&method).unwrap().long[0].name, "m");
    let default = format!("trait T {{\n    fn d() {{\n{}    }}\n}}\n", body(125));
    assert_eq!(check_source(&default).unwrap().long[0].name, "d");
    let nested = format!(
        "fn outer() {{\n    fn inner() {{\n{}    }}\n}}\n",
        body(125)
    );
    let names: Vec<_> = check_source(&nested)
        .unwrap()
        .long
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert_eq!(names, ["outer", "inner"]);

    // A table marker above the attributes, or between them, exempts the function.
    let above = format!(
        "// table: one arm per code\n/// Doc.\nfn t() {{\n{}}}\n",
        body(125)
    );
    assert_eq!(check_source(&above).unwrap(), Findings::default());
    let between = format!(
        "/// Doc.\n// table: one arm per code\n#[inline]\nfn t() {{\n{}}}\n",
        body(125)
    );
    assert_eq!(check_source(&between).unwrap(), Findings::default());

    // A marker without a reason is refused, and does not exempt.
    let empty = format!("// table:\nfn t() {{\n{}}}\n", body(125));
    let findings = check_source(&empty).unwrap();
    assert_eq!(findings.empty_markers, [1]);
    assert_eq!(findings.long.len(), 1);

    // A marker two lines away, past a blank line, belongs to something else.
    let far = format!("// table: not this one\n\nfn t() {{\n{}}}\n", body(125));
    assert_eq!(check_source(&far).unwrap().long.len(), 1);
}
