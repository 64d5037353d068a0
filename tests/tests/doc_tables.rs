//! The tables of figures in docs/BENCHMARKS.md and docs/RELIABILITY.md are generated: each sits
//! between `<!-- table: <id> -->` and `<!-- end: <id> -->`, under a line naming the command that
//! printed it and the day it ran, and `tests/benches/doc_tables.py` rewrites it from that
//! command's output (`tests/benches/all.sh` runs every bench once and then the script). This test
//! holds the docs to that form without running a bench:
//!
//! - every table in the two pages is such a block, unless the line above it says
//!   `<!-- not measured: <what it holds> -->` (a table of choices, of goals, or of the counts a
//!   test asserts rather than figures a run measured);
//! - each block's id is one a bench or a suite declares (`Table::new("<id>", &[…])` in
//!   `tests/benches/*.rs` or `tests/tests/**.rs`, or the `table: <id>` of a bench script or of
//!   `tests/reliability.sh`), and its
//!   header is exactly the columns declared there, every row with as many cells;
//! - the line under the marker names a command in backticks and a date (YYYY-MM-DD);
//! - the pages tell what is true now: no "was", "before", "earlier run" or commit hash.
//!
//! `self_test` shows each check can fail.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use syn::visit::{self, Visit};

/// The pages whose tables are generated.
const PAGES: &[&str] = &["docs/BENCHMARKS.md", "docs/RELIABILITY.md"];

/// Words that tell a history rather than what is true now (matched as whole words, any case).
const HISTORY_WORDS: &[&str] = &["was", "before", "earlier run"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every `Table::new("<id>", &["col", …])` in the Rust sources under `dir`.
fn declared_in_rust(dir: &Path, out: &mut BTreeMap<String, Vec<String>>) {
    struct Finder<'a>(&'a mut BTreeMap<String, Vec<String>>, PathBuf);
    impl<'ast> Visit<'ast> for Finder<'_> {
        fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
            if let syn::Expr::Path(p) = &*call.func {
                let names: Vec<String> = p
                    .path
                    .segments
                    .iter()
                    .map(|s| s.ident.to_string())
                    .collect();
                if names.ends_with(&["Table".to_owned(), "new".to_owned()]) {
                    let id = match call.args.first() {
                        Some(syn::Expr::Lit(syn::ExprLit {
                            lit: syn::Lit::Str(s),
                            ..
                        })) => s.value(),
                        _ => panic!("{}: Table::new needs a literal id", self.1.display()),
                    };
                    let head = match call.args.iter().nth(1) {
                        Some(syn::Expr::Reference(r)) => match &*r.expr {
                            syn::Expr::Array(a) => a
                                .elems
                                .iter()
                                .map(|e| match e {
                                    syn::Expr::Lit(syn::ExprLit {
                                        lit: syn::Lit::Str(s),
                                        ..
                                    }) => s.value(),
                                    _ => panic!(
                                        "{}: table {id}: a column that is not a literal",
                                        self.1.display()
                                    ),
                                })
                                .collect(),
                            _ => panic!(
                                "{}: table {id}: columns not written as &[…]",
                                self.1.display()
                            ),
                        },
                        _ => panic!(
                            "{}: table {id}: columns not written as &[…]",
                            self.1.display()
                        ),
                    };
                    let before = self.0.insert(id.clone(), head);
                    assert!(before.is_none(), "table id {id} is declared twice");
                }
            }
            visit::visit_expr_call(self, call);
        }
    }
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            declared_in_rust(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = fs::read_to_string(&path).unwrap();
            let file = syn::parse_file(&text)
                .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
            Finder(out, path).visit_file(&file);
        }
    }
}

/// The tables the shell scripts directly in `dir` write: for a line holding `table: <id>`, the
/// nearest line above it (else below it) holding a Markdown header (`| a | b |`) or a Python list
/// `head = ["a", "b"]`.
fn declared_in_scripts(dir: &Path, out: &mut BTreeMap<String, Vec<String>>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "sh") {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        for (id, head) in script_tables(&text) {
            let head =
                head.unwrap_or_else(|| panic!("{}: table {id} has no header", path.display()));
            out.insert(id, head);
        }
    }
}

/// The tables one script writes: each `table: <id>` with the header found for it, if any.
fn script_tables(text: &str) -> Vec<(String, Option<Vec<String>>)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.split("table: ").nth(1) else {
            continue;
        };
        let id: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if id.is_empty() || line.contains("end:") {
            continue;
        }
        let head = lines[..i]
            .iter()
            .rev()
            .chain(lines[i..].iter())
            .find_map(|l| {
                if let Some(list) = l.trim().strip_prefix("head = [") {
                    // The quoted names, a comma inside one kept.
                    return Some(
                        list.split('"')
                            .skip(1)
                            .step_by(2)
                            .map(str::to_owned)
                            .collect(),
                    );
                }
                // A header row has a name in every cell (not `"| " + …`, code that writes rows).
                let start = l.find("\"| ")?;
                let row = l[start + 1..].split('"').next()?;
                let head = cells(row);
                (!row.contains("---") && head.iter().all(|c| !c.is_empty())).then_some(head)
            });
        found.push((id, head));
    }
    found
}

/// The cells of a Markdown table row.
fn cells(row: &str) -> Vec<String> {
    let row = row.trim();
    let row = row.strip_prefix('|').unwrap_or(row);
    let row = row.strip_suffix('|').unwrap_or(row);
    row.split(" | ").map(|c| c.trim().to_owned()).collect()
}

/// Everything every source declares: id → columns.
fn declared() -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    declared_in_rust(&root().join("tests/benches"), &mut out);
    declared_in_rust(&root().join("tests/tests"), &mut out);
    declared_in_scripts(&root().join("tests/benches"), &mut out);
    // tests/reliability.sh, which writes RELIABILITY.md's storm and model-check tables.
    declared_in_scripts(&root().join("tests"), &mut out);
    out
}

/// What is wrong with `page` (named `name`) against the declarations; empty when nothing is.
fn problems(name: &str, page: &str, declared: &BTreeMap<String, Vec<String>>) -> Vec<String> {
    let mut found = Vec::new();
    let lines: Vec<&str> = page.lines().collect();
    let mut i = 0;
    let mut in_code = false;
    while i < lines.len() {
        let line = lines[i];
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            i += 1;
            continue;
        }
        if in_code {
            i += 1;
            continue;
        }
        let at = format!("{name}:{}", i + 1);
        if let Some(id) = line
            .strip_prefix("<!-- table: ")
            .and_then(|r| r.strip_suffix(" -->"))
        {
            let Some(head) = declared.get(id) else {
                found.push(format!("{at}: table {id} is declared by no bench or test"));
                i += 1;
                continue;
            };
            let meta = lines.get(i + 1).copied().unwrap_or("");
            let dated = meta.rsplit(" · ").next().is_some_and(|d| {
                d.len() == 10
                    && d.chars().enumerate().all(|(k, c)| {
                        if k == 4 || k == 7 {
                            c == '-'
                        } else {
                            c.is_ascii_digit()
                        }
                    })
            });
            if !meta.starts_with('`') || !meta.contains("` · ") || !dated {
                found.push(format!(
                    "{at}: table {id}: the line under the marker must be `command` · YYYY-MM-DD, not {meta:?}"
                ));
            }
            let end = format!("<!-- end: {id} -->");
            let Some(len) = lines[i..].iter().position(|l| *l == end) else {
                found.push(format!("{at}: table {id} has no end marker"));
                break;
            };
            let rows: Vec<&str> = lines[i..i + len]
                .iter()
                .copied()
                .filter(|l| l.starts_with('|'))
                .collect();
            match rows.first() {
                Some(first) if cells(first) == *head => {}
                Some(first) => found.push(format!(
                    "{at}: table {id}: columns {:?}, declared {:?}",
                    cells(first),
                    head
                )),
                None => found.push(format!("{at}: table {id} holds no table")),
            }
            for row in rows.iter().skip(1) {
                if cells(row).len() != head.len() {
                    found.push(format!(
                        "{at}: table {id}: a row of {} cells under {} columns: {row}",
                        cells(row).len(),
                        head.len()
                    ));
                }
            }
            i += len + 1;
            continue;
        }
        // A table outside a block: allowed only under a `<!-- not measured: … -->` marker.
        if line.starts_with('|') && !lines[..i].last().is_some_and(|l| l.starts_with('|')) {
            let marked = i > 0
                && lines[i - 1]
                    .strip_prefix("<!-- not measured: ")
                    .is_some_and(|r| r.len() > " -->".len() && r.ends_with(" -->"));
            if !marked {
                found.push(format!(
                    "{at}: a table outside a generated block (a table of no measured figures is marked `<!-- not measured: <what> -->`)"
                ));
            }
        }
        let lower = line.to_lowercase();
        for word in HISTORY_WORDS {
            if whole_word(&lower, word) {
                found.push(format!("{at}: {word:?} tells a history: {line}"));
            }
        }
        if let Some(hash) = commit_hash(line) {
            found.push(format!("{at}: {hash} looks like a commit hash"));
        }
        i += 1;
    }
    found
}

/// Whether `word` stands in `text` with no letter on either side.
fn whole_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    })
}

/// A run of 7 to 40 hex digits with at least one letter and one digit, standing alone.
fn commit_hash(line: &str) -> Option<&str> {
    line.split(|c: char| !c.is_ascii_alphanumeric()).find(|w| {
        (7..=40).contains(&w.len())
            && w.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
            && w.chars().any(|c| c.is_ascii_digit())
            && w.chars().any(|c| c.is_ascii_alphabetic())
    })
}

#[test]
fn generated_tables_match_their_sources() {
    let declared = declared();
    assert!(
        declared.len() >= 10,
        "found only {} table declarations: {:?}",
        declared.len(),
        declared.keys()
    );
    let mut all = Vec::new();
    for page in PAGES {
        let text = fs::read_to_string(root().join(page)).unwrap();
        all.extend(problems(page, &text, &declared));
    }
    assert!(all.is_empty(), "{}", all.join("\n"));
}

#[test]
fn every_bench_table_is_in_the_docs() {
    let declared = declared();
    let text = fs::read_to_string(root().join("docs/BENCHMARKS.md")).unwrap();
    let missing: Vec<&String> = declared
        .keys()
        .filter(|id| !text.contains(&format!("<!-- table: {id} -->")))
        .filter(|id| {
            // Tables the suites print belong to RELIABILITY.md.
            let rel = fs::read_to_string(root().join("docs/RELIABILITY.md")).unwrap();
            !rel.contains(&format!("<!-- table: {id} -->"))
        })
        .collect();
    assert!(missing.is_empty(), "declared but in no page: {missing:?}");
}

#[test]
fn self_test() {
    let mut declared = BTreeMap::new();
    declared.insert("t".to_owned(), vec!["a".to_owned(), "b".to_owned()]);
    let good = "<!-- table: t -->\n`cargo bench` · 2026-12-07\n\n| a | b |\n| --- | ---: |\n| x | 1 |\n<!-- end: t -->\n";
    assert!(problems("p", good, &declared).is_empty());
    let cases = [
        (good.replace("| a | b |", "| a | c |"), "columns"),
        (good.replace("| x | 1 |", "| x | 1 | 2 |"), "cells under"),
        (good.replace(" · 2026-12-07", ""), "command"),
        (
            good.replace("table: t", "table: u")
                .replace("end: t", "end: u"),
            "declared by no",
        ),
        (
            format!("{good}\n| a | b |\n| --- | --- |\n"),
            "outside a generated block",
        ),
        (format!("{good}\nThe ratio was 0.9.\n"), "history"),
        (format!("{good}\nMeasured at 1a2b3c4d.\n"), "commit hash"),
        (
            format!("{good}\nBefore the change it ran slower.\n"),
            "history",
        ),
    ];
    for (page, want) in cases {
        let found = problems("p", &page, &declared);
        assert!(
            found.iter().any(|f| f.contains(want)),
            "{want:?} not found in {found:?} for\n{page}"
        );
    }
    let prose = "<!-- not measured: choices -->\n| you need | pick |\n| --- | --- |\n| x | y |\n";
    assert!(problems("p", prose, &declared).is_empty());
    let unnamed = "<!-- not measured:  -->\n| you need | pick |\n| --- | --- |\n| x | y |\n";
    assert!(!problems("p", unnamed, &declared).is_empty());

    // Script headers: an echoed row, a Python list (commas inside names kept), the nearest one
    // above the marker; code that writes rows is no header.
    let script = r#"echo "| a | b |"
echo "<!-- table: one -->"
head = ["x, y", "z"]
line = lambda cells: "| " + " | ".join(cells)
# table: two
# table: three
"#;
    let strings = |v: &[&str]| Some(v.iter().map(|c| c.to_string()).collect::<Vec<_>>());
    assert_eq!(
        script_tables(script),
        vec![
            ("one".to_owned(), strings(&["a", "b"])),
            ("two".to_owned(), strings(&["x, y", "z"])),
            ("three".to_owned(), strings(&["x, y", "z"])),
        ]
    );
    assert_eq!(
        script_tables("# table: lone\n"),
        vec![("lone".to_owned(), None)]
    );
}
