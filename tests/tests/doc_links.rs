//! The documentation's links resolve where it is read.
//!
//! On a code host: every relative link and link definition in `README.md`, `docs/*.md` and
//! `docs/guide/*.md` names a file or folder that exists, every `#anchor` matches a heading of the
//! target page (by the heading slugs a code host such as GitHub makes), and every reference link
//! has its definition. Every guide is reachable from the README.
//!
//! In rustdoc, where the README is the crate's front page and each guide a module under
//! `idem::_guide` (`src/lib.rs`): a relative path would be broken, so those pages use reference
//! links only, and `src/lib.rs` puts a definition of each label that a page defines with a
//! relative path before the page (rustdoc takes the first definition). This checks that each such
//! label has its rustdoc definition, that no rustdoc definition is left over, that no page
//! included in rustdoc has an inline relative link, and that every guide is included.
//!
//! No markdown crate: the pages use a small part of markdown (ATX headings, fenced code, inline and
//! reference links), which the scanner below reads; `self_test` shows it finds broken links.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The repository root (the suite is the member at `tests/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the suite lives in the repository")
        .to_path_buf()
}

/// A link as written: where it is, and where it points.
#[derive(Debug, Clone)]
struct Link {
    line: usize,
    target: String,
    /// `Some(label)` for a reference link, `None` for an inline one.
    label: Option<String>,
}

/// What the scanner finds in one page.
#[derive(Debug, Default)]
struct Page {
    /// Inline links, and reference links resolved through `definitions`.
    links: Vec<Link>,
    /// Reference links whose label has no definition: `(line, label)`.
    undefined: Vec<(usize, String)>,
    /// Link reference definitions, the first of each label: label (normalized) → (line, target).
    definitions: BTreeMap<String, (usize, String)>,
    /// The anchors of the page's headings, as a code host makes them.
    anchors: BTreeSet<String>,
}

/// A label as markdown matches it: case-insensitive, inner whitespace collapsed.
fn normalize(label: &str) -> String {
    label
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// `(character, run length)` of a code fence opening or closing `line`, if it is one.
fn fence(line: &str) -> Option<(char, usize)> {
    let trimmed = line.trim_start();
    let c = trimmed.chars().next()?;
    if c != '`' && c != '~' {
        return None;
    }
    let run = trimmed.chars().take_while(|&x| x == c).count();
    (run >= 3).then_some((c, run))
}

/// The page's lines outside fenced code blocks, with code spans blanked out (their text replaced by
/// `x`, so a link's text that is all code still has text). Lines in code are empty strings.
fn prose_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut open: Option<(char, usize)> = None;
    for line in text.lines() {
        match (open, fence(line)) {
            (None, Some(f)) => {
                open = Some(f);
                out.push(String::new());
            }
            (Some((c, n)), Some((c2, n2)))
                if c == c2 && n2 >= n && line.trim().chars().all(|x| x == c) =>
            {
                open = None;
                out.push(String::new());
            }
            (Some(_), _) => out.push(String::new()),
            (None, None) => out.push(blank_code_spans(line)),
        }
    }
    out
}

/// `line` with the contents of each code span replaced by `x`.
fn blank_code_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '`' {
            let run = chars[i..].iter().take_while(|&&c| c == '`').count();
            // The closing run of the same length.
            let mut j = i + run;
            let mut close = None;
            while j < chars.len() {
                if chars[j] == '`' {
                    let r = chars[j..].iter().take_while(|&&c| c == '`').count();
                    if r == run {
                        close = Some(j);
                        break;
                    }
                    j += r;
                } else {
                    j += 1;
                }
            }
            match close {
                Some(j) => {
                    out.push('x');
                    i = j + run;
                }
                None => {
                    out.extend(&chars[i..i + run]);
                    i += run;
                }
            }
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// The slug a code host gives a heading: its text as rendered, lower-cased, with everything but
/// letters, digits, `-` and `_` dropped and each space made a `-`.
fn slug(heading: &str) -> String {
    // The rendered text: a link's text without its destination, no code or emphasis markers.
    let mut text = String::new();
    let chars: Vec<char> = heading.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == ']' && chars.get(i + 1) == Some(&'(') {
            // Skip the destination.
            match chars[i..].iter().position(|&c| c == ')') {
                Some(end) => i += end + 1,
                None => i += 1,
            }
            continue;
        }
        text.push(chars[i]);
        i += 1;
    }
    let mut slug = String::new();
    for c in text.chars() {
        if c.is_alphanumeric() || c == '-' || c == '_' {
            slug.extend(c.to_lowercase());
        } else if c == ' ' {
            slug.push('-');
        }
    }
    slug
}

/// The heading text of an ATX heading line, if it is one.
fn heading(line: &str) -> Option<&str> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let rest = &line[indent..];
    let level = rest.chars().take_while(|&c| c == '#').count();
    if indent > 3 || !(1..=6).contains(&level) {
        return None;
    }
    let rest = &rest[level..];
    if !(rest.is_empty() || rest.starts_with(' ')) {
        return None;
    }
    // A closing sequence of `#`s goes.
    let text = rest.trim();
    let text = text.trim_end_matches('#');
    Some(text.trim())
}

/// A link reference definition line: `[label]: target`.
fn definition(line: &str) -> Option<(String, String)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let rest = line[indent..].strip_prefix('[')?;
    let close = rest.find("]:")?;
    let label = &rest[..close];
    if label.is_empty() || label.contains('[') || label.contains(']') {
        return None;
    }
    let target = rest[close + 2..].split_whitespace().next()?;
    let target = target.trim_start_matches('<').trim_end_matches('>');
    Some((normalize(label), target.to_owned()))
}

/// Reads a page: its headings, definitions and links.
fn scan(text: &str) -> Page {
    let mut page = Page::default();
    let lines = prose_lines(text);
    let raw: Vec<&str> = text.lines().collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (n, line) in lines.iter().enumerate() {
        if heading(line).is_some() {
            // The heading as written (code spans kept): the anchor comes from its text.
            let base = slug(heading(raw[n]).unwrap_or_default());
            let count = seen.entry(base.clone()).or_insert(0);
            let anchor = if *count == 0 {
                base.clone()
            } else {
                format!("{base}-{count}")
            };
            *count += 1;
            page.anchors.insert(anchor);
        }
        if let Some((label, target)) = definition(line) {
            page.definitions.entry(label).or_insert((n + 1, target));
        }
    }
    // Links may wrap lines: scan the prose as one text, keeping each character's line.
    let mut chars: Vec<(char, usize)> = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        if definition(line).is_some() {
            chars.push(('\n', n + 1));
            continue;
        }
        chars.extend(line.chars().map(|c| (c, n + 1)));
        chars.push(('\n', n + 1));
    }
    let mut i = 0;
    while i < chars.len() {
        let (c, line) = chars[i];
        let escaped = i > 0 && chars[i - 1].0 == '\\';
        if c != '[' || escaped {
            i += 1;
            continue;
        }
        // The link text: up to the matching `]`.
        let mut depth = 0;
        let mut end = None;
        for (j, &(c, _)) in chars.iter().enumerate().skip(i) {
            match c {
                '[' if j == i || chars[j - 1].0 != '\\' => depth += 1,
                ']' if chars[j - 1].0 != '\\' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(j);
                        break;
                    }
                }
                '\n' if j + 1 < chars.len() && chars[j + 1].0 == '\n' => break, // a paragraph ends
                _ => {}
            }
        }
        let Some(end) = end else {
            i += 1;
            continue;
        };
        let text: String = chars[i + 1..end].iter().map(|&(c, _)| c).collect();
        match chars.get(end + 1).map(|&(c, _)| c) {
            Some('(') => {
                let mut depth = 0;
                let mut close = None;
                for (j, &(c, _)) in chars.iter().enumerate().skip(end + 1) {
                    match c {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                close = Some(j);
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                if let Some(close) = close {
                    let inside: String = chars[end + 2..close].iter().map(|&(c, _)| c).collect();
                    if let Some(target) = inside.split_whitespace().next() {
                        let target = target.trim_start_matches('<').trim_end_matches('>');
                        page.links.push(Link {
                            line,
                            target: target.to_owned(),
                            label: None,
                        });
                    }
                    i = close + 1;
                    continue;
                }
            }
            Some('[') => {
                if let Some(close) = chars[end + 1..].iter().position(|&(c, _)| c == ']') {
                    let close = end + 1 + close;
                    let label: String = chars[end + 2..close].iter().map(|&(c, _)| c).collect();
                    let label = if label.trim().is_empty() { text } else { label };
                    let label = normalize(&label);
                    match page.definitions.get(&label) {
                        Some((_, target)) => page.links.push(Link {
                            line,
                            target: target.clone(),
                            label: Some(label),
                        }),
                        None => page.undefined.push((line, label)),
                    }
                    i = close + 1;
                    continue;
                }
            }
            _ => {
                // A shortcut reference `[label]` links only when the label is defined.
                let label = normalize(&text);
                if let Some((_, target)) = page.definitions.get(&label) {
                    page.links.push(Link {
                        line,
                        target: target.clone(),
                        label: Some(label),
                    });
                }
            }
        }
        i += 1;
    }
    page
}

/// Whether `target` leaves the repository (a URL, a mail address).
fn external(target: &str) -> bool {
    let scheme: String = target
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || "+.-".contains(*c))
        .collect();
    !scheme.is_empty() && target[scheme.len()..].starts_with(':')
}

/// `path` with `.` and `..` resolved, without touching the file system; `None` when it leaves
/// the repository.
fn clean(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

/// Checks every page of `pages` (paths relative to `root`); one line per broken link.
fn check(root: &Path, pages: &[PathBuf]) -> Vec<String> {
    let mut scanned: BTreeMap<PathBuf, Page> = BTreeMap::new();
    let mut problems = Vec::new();
    let load = |path: &Path, scanned: &mut BTreeMap<PathBuf, Page>| -> bool {
        if scanned.contains_key(path) {
            return true;
        }
        match fs::read_to_string(root.join(path)) {
            Ok(text) => {
                scanned.insert(path.to_path_buf(), scan(&text));
                true
            }
            Err(_) => false,
        }
    };
    for page in pages {
        if !load(page, &mut scanned) {
            problems.push(format!("{}: cannot be read", page.display()));
        }
    }
    for page in pages {
        let Some(scan) = scanned.get(page) else {
            continue;
        };
        let dir = page.parent().unwrap_or(Path::new(""));
        let mut targets: Vec<(usize, String, &str)> = Vec::new();
        // A reference link's target is checked once, at its definition.
        for link in scan.links.iter().filter(|l| l.label.is_none()) {
            targets.push((link.line, link.target.clone(), "link"));
        }
        for (line, target) in scan.definitions.values() {
            targets.push((*line, target.clone(), "definition"));
        }
        for (line, label) in &scan.undefined {
            problems.push(format!(
                "{}:{line}: the reference link [{label}] has no definition",
                page.display()
            ));
        }
        for (line, target, what) in targets {
            if external(&target) || target.is_empty() {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                Some(page.clone())
            } else {
                clean(&dir.join(path))
            };
            let Some(resolved) = resolved.filter(|r| root.join(r).exists()) else {
                problems.push(format!(
                    "{}:{line}: {what} `{target}`: {} does not exist in the repository",
                    page.display(),
                    dir.join(path).display()
                ));
                continue;
            };
            let Some(anchor) = anchor else { continue };
            if resolved.extension().and_then(|e| e.to_str()) != Some("md") {
                continue;
            }
            if !load(&resolved, &mut scanned) {
                problems.push(format!(
                    "{}:{line}: {what} `{target}`: cannot be read",
                    page.display()
                ));
                continue;
            }
            if !scanned[&resolved].anchors.contains(anchor) {
                problems.push(format!(
                    "{}:{line}: {what} `{target}`: {} has no heading whose anchor is #{anchor}",
                    page.display(),
                    resolved.display()
                ));
            }
        }
    }
    problems
}

/// The pages checked: README.md, docs/*.md, docs/guide/*.md (relative to the root).
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![PathBuf::from("README.md")];
    for dir in ["docs", "docs/guide"] {
        let mut found: Vec<PathBuf> = fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("md"))
            .map(|p| p.strip_prefix(root).unwrap().to_path_buf())
            .collect();
        found.sort();
        pages.extend(found);
    }
    pages
}

#[test]
fn relative_links_and_anchors_resolve() {
    let root = root();
    let problems = check(&root, &pages(&root));
    assert!(
        problems.is_empty(),
        "broken links in the documentation:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_guide_is_reachable_from_the_readme() {
    let root = root();
    let mut seen = BTreeSet::from([PathBuf::from("README.md")]);
    let mut queue = VecDeque::from([PathBuf::from("README.md")]);
    while let Some(page) = queue.pop_front() {
        let Ok(text) = fs::read_to_string(root.join(&page)) else {
            continue;
        };
        let dir = page.parent().unwrap_or(Path::new("")).to_path_buf();
        for link in scan(&text).links {
            if external(&link.target) {
                continue;
            }
            let path = link.target.split('#').next().unwrap_or_default();
            if path.ends_with(".md") {
                let Some(next) = clean(&dir.join(path)) else {
                    continue;
                };
                if seen.insert(next.clone()) {
                    queue.push_back(next);
                }
            }
        }
    }
    let unreachable: Vec<_> = pages(&root)
        .into_iter()
        .filter(|p| p.starts_with("docs/guide") && !seen.contains(p))
        .collect();
    assert!(
        unreachable.is_empty(),
        "guides no link from README.md leads to: {unreachable:?}"
    );
}

/// The rustdoc definitions in `src/lib.rs`: those before the README (`//! [label]: …` lines) and
/// those of the `guide_links!` macro, put before each guide.
fn rustdoc_definitions(lib: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut root = BTreeSet::new();
    let mut guides = BTreeSet::new();
    let mut in_macro = false;
    let mut before_readme = true;
    for line in lib.lines() {
        let trimmed = line.trim();
        if trimmed.contains("include_str!(\"../README.md\")") {
            before_readme = false;
        }
        if trimmed.starts_with("macro_rules! guide_links") {
            in_macro = true;
        } else if in_macro && trimmed.starts_with("\"#") {
            in_macro = false;
        }
        let rest = trimmed.strip_prefix("//! ").filter(|_| before_readme);
        if let Some((label, _)) = rest.and_then(definition) {
            root.insert(label);
        } else if let Some((label, _)) = definition(trimmed).filter(|_| in_macro) {
            guides.insert(label);
        }
    }
    (root, guides)
}

#[test]
fn pages_in_rustdoc_have_their_rustdoc_links() {
    let root = root();
    let lib = fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let (root_defs, guide_defs) = rustdoc_definitions(&lib);
    let mut problems = Vec::new();
    let guides: Vec<PathBuf> = pages(&root)
        .into_iter()
        .filter(|p| p.starts_with("docs/guide"))
        .collect();
    for (pages, defs, whose) in [
        (
            vec![PathBuf::from("README.md")],
            &root_defs,
            "before the README (`//! [label]: …`)",
        ),
        (guides.clone(), &guide_defs, "in `guide_links!`"),
    ] {
        let mut needed = BTreeSet::new();
        for page in &pages {
            let page_scan = scan(&fs::read_to_string(root.join(page)).unwrap());
            for link in &page_scan.links {
                if link.label.is_none() && !external(&link.target) && !link.target.starts_with('#')
                {
                    problems.push(format!(
                        "{}:{}: the inline link `{}` breaks in rustdoc: make it a reference link \
                         and give its label a definition in src/lib.rs",
                        page.display(),
                        link.line,
                        link.target
                    ));
                }
            }
            for (label, (line, target)) in &page_scan.definitions {
                if external(target) || target.starts_with('#') {
                    continue;
                }
                needed.insert(label.clone());
                if !defs.contains(label) {
                    problems.push(format!(
                        "{}:{line}: [{label}] points to `{target}`, which rustdoc cannot follow: \
                         src/lib.rs needs `[{label}]: …` {whose}",
                        page.display()
                    ));
                }
            }
        }
        for label in defs.difference(&needed) {
            problems.push(format!(
                "src/lib.rs: [{label}] {whose} is used by no page: remove it"
            ));
        }
    }
    for guide in &guides {
        let include = format!("include_str!(\"../{}\")", guide.display());
        if !lib.contains(&include) {
            problems.push(format!(
                "src/lib.rs does not include {} in `_guide`",
                guide.display()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The checks find what they are for: a missing file, a missing anchor, an undefined reference.
#[test]
fn self_test() {
    let dir = std::env::temp_dir().join(format!("idem-doc-links-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("docs")).unwrap();
    fs::write(
        dir.join("README.md"),
        "# Title\n\nSee [the guide](docs/a.md#the-first-part), [a gone one](docs/gone.md),\n\
         [a missing part](docs/a.md#nowhere), [ref][r] and [an undefined ref][nope].\n\
         Code is not a link: `[x](nowhere.md)`.\n\n```text\n[y](also-nowhere.md)\n```\n\n\
         [r]: docs/a.md#the-first-part\n",
    )
    .unwrap();
    fs::write(
        dir.join("docs/a.md"),
        "# A\n\n## The `first` part!\n\n[home](../README.md#title)\n",
    )
    .unwrap();
    let problems = check(
        &dir,
        &[PathBuf::from("README.md"), PathBuf::from("docs/a.md")],
    );
    let _ = fs::remove_dir_all(&dir);
    let joined = problems.join("\n");
    assert_eq!(problems.len(), 3, "{joined}");
    assert!(joined.contains("docs/gone.md does not exist"), "{joined}");
    assert!(
        joined.contains("no heading whose anchor is #nowhere"),
        "{joined}"
    );
    assert!(joined.contains("[nope] has no definition"), "{joined}");
    assert_eq!(
        slug("The `#[idempotent]` attribute"),
        "the-idempotent-attribute"
    );
    assert_eq!(
        slug("Retry storms (`idem-storm`)"),
        "retry-storms-idem-storm"
    );
}
