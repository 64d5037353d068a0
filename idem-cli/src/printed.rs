//! Every `idem …` command the project prints parses with this CLI as built: the commands in the
//! docs (`README.md`, `docs/*.md`, `docs/guide/*.md`: lines of code blocks that start with `idem `
//! or `$ idem `, and inline code that does) and in the library's messages (string literals in
//! `idem-runtime/src` holding `` `idem … ` ``), read from the repository when the test runs.
//!
//! How a printed command is read, before [`Cli::try_parse_from`]:
//!
//! - Placeholders are replaced by a sample value: `<url>` (any `<…>` or `{…}` whose name holds
//!   `url`) by a store URL, `<command>` by `stats`, every other `<…>` (and a format string's
//!   `{…}`) by `1`, which every other argument takes (a business type, a key, a reason, a
//!   number). `&lt;` and `&gt;` are read as `<` and `>`.
//! - A `# …` after the command is a comment, dropped. A line that says `# exit 2` shows a usage
//!   error on purpose: it is not checked.
//! - `[…]` marks optional parts and `…` (or `...`) elided ones: the command is parsed without
//!   them, and each `--flag` they name must be one the command has. A command with `…` in it is
//!   incomplete: only its command name and its flags are checked.
//! - `idem COMMAND` alone names the command: it must exist.
//! - `--help` and `--version` count as parsed.

use std::path::{Path, PathBuf};

use clap::{CommandFactory as _, Parser as _};

use super::Cli;

/// The sample store URL a `<url>` placeholder stands for.
const SAMPLE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A command found, and where.
#[derive(Debug)]
struct Printed {
    place: String,
    command: String,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("idem-cli lives in the workspace")
        .to_owned()
}

/// The Markdown files the docs are: `README.md`, `docs/*.md`, `docs/guide/*.md`.
fn doc_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md")];
    for dir in ["docs", "docs/guide"] {
        let mut found: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|entry| entry.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        found.sort();
        files.extend(found);
    }
    files
}

/// The `.rs` files under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// `text` with the HTML entities a Markdown table may hold decoded.
fn unentity(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// Whether `text` (a code line or span) is an `idem` command: `idem` or `$ idem`, then a flag, a
/// placeholder or a word in lower case (not `idem = { … }`, `idem / floor`).
fn command_text(text: &str) -> Option<&str> {
    let text = text.trim();
    let text = text.strip_prefix("$ ").unwrap_or(text).trim_start();
    let rest = text.strip_prefix("idem ")?;
    let next = rest.trim_start();
    let first = next.chars().next()?;
    (first == '-' || first == '<' || first.is_ascii_lowercase()).then_some(text)
}

/// The commands of a Markdown text: lines of fenced code blocks (joined over a trailing `\`),
/// and inline code spans (also over a line break).
fn markdown_commands(file: &str, text: &str) -> Vec<Printed> {
    let mut found = Vec::new();
    // The text outside code blocks, each code block's lines blanked (so line numbers hold and no
    // span runs across a block).
    let mut prose = String::new();
    let mut fence: Option<&str> = None;
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let trimmed = line.trim_start();
        match fence {
            None if trimmed.starts_with("```") || trimmed.starts_with("~~~") => {
                fence = Some(&trimmed[..3]);
                prose.push('\n');
            }
            None => {
                prose.push_str(line);
                prose.push('\n');
            }
            Some(f) if trimmed.starts_with(f) => {
                fence = None;
                prose.push('\n');
            }
            Some(_) => {
                prose.push('\n');
                let mut joined = line.to_owned();
                while joined.trim_end().ends_with('\\') {
                    let Some((_, next)) = lines.next() else { break };
                    prose.push('\n');
                    let cut = joined
                        .trim_end()
                        .trim_end_matches('\\')
                        .trim_end()
                        .to_owned();
                    joined = format!("{cut} {}", next.trim_start());
                }
                if let Some(command) = command_text(&joined) {
                    found.push(Printed {
                        place: format!("{file}:{}", n + 1),
                        command: command.to_owned(),
                    });
                }
            }
        }
    }
    for (line, span) in code_spans(&prose) {
        if let Some(command) = command_text(&span) {
            found.push(Printed {
                place: format!("{file}:{line}"),
                command: command.to_owned(),
            });
        }
    }
    found
}

/// The inline code spans of Markdown prose, with the line each starts on: a run of backticks up
/// to the next run of as many, within a paragraph; line breaks read as spaces, and `\|` (a pipe
/// in a table cell) as `|`.
fn code_spans(prose: &str) -> Vec<(usize, String)> {
    let bytes = prose.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'`' {
            i += 1;
            continue;
        }
        let open = bytes[i..].iter().take_while(|&&b| b == b'`').count();
        let start = i + open;
        let mut j = start;
        let mut end = None;
        while j < bytes.len() {
            if bytes[j] == b'`' {
                let run = bytes[j..].iter().take_while(|&&b| b == b'`').count();
                if run == open {
                    end = Some(j);
                    break;
                }
                j += run;
            } else if bytes[j..].starts_with(b"\n\n") {
                break;
            } else {
                j += 1;
            }
        }
        match end {
            Some(end) => {
                let line = prose[..i].matches('\n').count() + 1;
                let span = prose[start..end].replace('\n', " ").replace("\\|", "|");
                spans.push((line, span));
                i = end + open;
            }
            None => i = start,
        }
    }
    spans
}

/// The string literals of Rust source, unescaped (`\` at a line's end joins it to the next), with
/// the line each starts on; comments and character literals skipped.
fn string_literals(source: &str) -> Vec<(usize, String)> {
    let chars: Vec<char> = source.chars().collect();
    let line_at = |i: usize| chars[..i].iter().filter(|&&c| c == '\n').count() + 1;
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '\'' {
            // A character literal ('x', '\n', '\''), or a lifetime ('a), which has no closing quote.
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if c == 'r' && (i == 0 || !ident(chars[i - 1])) && matches!(next, Some('#' | '"')) {
            let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                i += 1;
                continue;
            }
            let start = i + 2 + hashes;
            let close: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let rest: String = chars[start..].iter().collect();
            let len = rest.find(&close).unwrap_or(rest.len());
            found.push((line_at(i), rest[..len].to_owned()));
            i = start + rest[..len].chars().count() + close.chars().count();
        } else if c == '"' {
            let line = line_at(i);
            let mut text = String::new();
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                    match chars.get(i) {
                        Some('\n') => {
                            while chars.get(i + 1).is_some_and(|c| c.is_whitespace()) {
                                i += 1;
                            }
                        }
                        Some('n') => text.push('\n'),
                        Some('t') => text.push('\t'),
                        Some(&other) => text.push(other),
                        None => {}
                    }
                } else {
                    text.push(chars[i]);
                }
                i += 1;
            }
            i += 1;
            found.push((line, text));
        } else {
            i += 1;
        }
    }
    found
}

/// The `` `idem …` `` commands in the string literals of Rust source.
fn literal_commands(file: &str, source: &str) -> Vec<Printed> {
    let mut found = Vec::new();
    for (line, literal) in string_literals(source) {
        let mut rest = literal.as_str();
        while let Some(at) = rest.find("`idem ") {
            let after = &rest[at + 1..];
            let end = after.find('`').unwrap_or(after.len());
            found.push(Printed {
                place: format!("{file}:{line}"),
                command: after[..end].to_owned(),
            });
            rest = &after[end..];
        }
    }
    found
}

/// A placeholder's sample value.
fn sample(name: &str) -> &'static str {
    let name = name.to_ascii_lowercase();
    if name.contains("url") {
        SAMPLE_URL
    } else if name == "command" || name == "subcommand" {
        "stats"
    } else {
        "1"
    }
}

/// `command` with its placeholders (`<…>`, `{…}`) replaced by their samples.
fn substitute(command: &str) -> String {
    let mut out = String::new();
    let mut rest = command;
    while let Some(at) = rest.find(['<', '{']) {
        let close = if rest[at..].starts_with('<') {
            '>'
        } else {
            '}'
        };
        let Some(len) = rest[at..].find(close) else {
            break;
        };
        out.push_str(&rest[..at]);
        out.push_str(sample(&rest[at + 1..at + len]));
        rest = &rest[at + len + 1..];
    }
    out.push_str(rest);
    out
}

/// Splits a command line as a shell would (quotes, backslashes), dropping a `# comment`.
fn shell_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                words.extend(word.take());
            }
            '#' if word.is_none() => break,
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return Err("an unclosed '".to_owned()),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => w.extend(chars.next()),
                        Some(c) => w.push(c),
                        None => return Err("an unclosed \"".to_owned()),
                    }
                }
            }
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    Ok(words)
}

/// Whether a word elides something: `…`, `...`.
fn elided(word: &str) -> bool {
    word.contains('…') || word.contains("...")
}

/// Checks one printed command; the error says why it does not parse.
fn check(command: &str) -> Result<(), String> {
    if command.contains("# exit 2") {
        return Ok(());
    }
    let command = command.trim();
    let command = command.strip_prefix("$ ").unwrap_or(command);
    let words = shell_words(&substitute(&unentity(command)))?;
    // The optional (`[…]`) and elided (`…`) parts: out of what is parsed; their flags are checked.
    let mut parsed = Vec::new();
    let mut aside = Vec::new();
    let mut incomplete = false;
    let mut depth = 0usize;
    for word in &words {
        let opens = word.starts_with('[');
        let inner = word.trim_start_matches('[').trim_end_matches(']');
        if opens {
            depth += 1;
        }
        if elided(inner) {
            incomplete = true;
        } else if depth > 0 {
            aside.push(inner.to_owned());
        } else if !inner.is_empty() {
            parsed.push(inner.to_owned());
        }
        if word.ends_with(']') {
            depth = depth.saturating_sub(1);
        }
    }
    let cli = Cli::command();
    // The subcommand: the first word that is not a flag or a global flag's value.
    let mut subcommand = None;
    let mut words_after = parsed.iter().skip(1);
    while let Some(word) = words_after.next() {
        if word == "--url" || word == "--store-timeout" {
            words_after.next();
        } else if !word.starts_with('-') {
            subcommand = Some(word.as_str());
            break;
        }
    }
    let sub = match subcommand {
        Some(name) => Some(
            cli.find_subcommand(name)
                .ok_or_else(|| format!("`{name}` is not a command of idem"))?,
        ),
        None => None,
    };
    // Every flag named must be one the command (or idem itself) has.
    for word in parsed.iter().chain(&aside) {
        let Some(flag) = word.strip_prefix("--") else {
            continue;
        };
        let flag = flag.split('=').next().unwrap_or(flag);
        let known = |c: &clap::Command| c.get_arguments().any(|a| a.get_long() == Some(flag));
        if !(flag == "help" || flag == "version" || known(&cli) || sub.is_some_and(known)) {
            return Err(format!("`--{flag}` is not a flag of this command"));
        }
    }
    // `idem COMMAND` alone names it; an elided command is as complete as it gets.
    if incomplete || (parsed.len() == 2 && sub.is_some()) {
        return Ok(());
    }
    match Cli::try_parse_from(&parsed) {
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            Ok(())
        }
        // clap's message to its usage line, on one line.
        Err(e) => Err(e
            .to_string()
            .lines()
            .take_while(|l| !l.starts_with("Usage:"))
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" ")),
    }
}

/// Every command the docs and the library's messages print.
fn printed() -> Vec<Printed> {
    let root = root();
    let name = |path: &Path| {
        path.strip_prefix(&root)
            .unwrap_or(path)
            .display()
            .to_string()
    };
    let mut found = Vec::new();
    for path in doc_files(&root) {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        found.extend(markdown_commands(&name(&path), &text));
    }
    for path in rust_files(&root.join("idem-runtime/src")) {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        found.extend(literal_commands(&name(&path), &text));
    }
    found
}

#[test]
fn every_printed_command_parses() {
    let found = printed();
    if std::env::var_os("IDEM_LIST_PRINTED").is_some() {
        for p in &found {
            eprintln!("{}: {}", p.place, p.command);
        }
    }
    let messages = found
        .iter()
        .filter(|p| p.place.starts_with("idem-runtime"))
        .count();
    assert!(
        found.len() > 10 && messages > 0,
        "too few commands found ({} in all, {messages} in messages): is the reading broken? {found:#?}",
        found.len()
    );
    let failures: Vec<String> = found
        .iter()
        .filter_map(|p| {
            check(&p.command)
                .err()
                .map(|why| format!("{}: `{}`: {why}", p.place, p.command))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} printed `idem` command(s) do not parse with this CLI (placeholders and `…`: see \
         idem-cli/src/printed.rs):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_check_refuses_what_does_not_parse() {
    for good in [
        "idem migrate --print <url>",
        "$ idem --url <url> migrate --print",
        "idem --url 'mysql://root@127.0.0.1:3306/test?idem_table=t' stats",
        "idem stuck --limit 5   # a comment",
        "idem stuck --limit 0   # exit 2",
        "idem release BIZ KEY --reason \"INC-42: died\" [--force]",
        "idem release … --mark-failed",
        "idem inspect GRPC <idempotency-key> --principal <caller>",
        "idem inspect &lt;biz&gt; &lt;key&gt;",
        "idem release",
        "idem --help",
        "idem --url {url} release {biz} {key} --reason {reason}",
    ] {
        assert_eq!(check(good), Ok(()), "{good}");
    }
    for bad in [
        "idem --url <url> migrate --print --bogus",
        "idem migrate --print <url> <url>",
        "idem release PAY ORD-1",
        "idem inspect HTTP",
        "idem unknown-command",
        "idem stuck --limit many",
        "idem release … --no-such-flag",
        "idem stuck [--no-such-flag]",
        "idem release PAY k --reason \"unclosed",
    ] {
        assert!(check(bad).is_err(), "{bad} was taken");
    }
}

#[test]
fn commands_are_found_where_they_are_printed() {
    let md = "Run `idem migrate\n--print <url>` once.\n\n```sh\n$ idem --url x \\\n  stats\nidem = { package = \"idemkit\" }\n```\n`idem::connect` and `idem stuck`\n";
    let found: Vec<(String, String)> = markdown_commands("x.md", md)
        .into_iter()
        .map(|p| (p.place, p.command))
        .collect();
    assert_eq!(
        found,
        [
            ("x.md:5".to_owned(), "idem --url x stats".to_owned()),
            ("x.md:1".to_owned(), "idem migrate --print <url>".to_owned()),
            ("x.md:9".to_owned(), "idem stuck".to_owned()),
        ]
    );
    let rs = "// \"`idem not-this`\"\nlet c = '\"'; let s: &'static str = \"run `idem migrate \\\n    --print <url>` and `idem stats`\";";
    let found: Vec<String> = literal_commands("x.rs", rs)
        .into_iter()
        .map(|p| format!("{} {}", p.place, p.command))
        .collect();
    assert_eq!(
        found,
        ["x.rs:2 idem migrate --print <url>", "x.rs:2 idem stats"]
    );
}
