//! The tables of figures the docs are generated from: a bench or a suite prints each as a block
//! that `tests/benches/doc_tables.py` copies into its page as it is:
//!
//! ```text
//! <!-- table: redis -->
//! `cargo bench -p idem-suite --bench redis --features redis,sqlite` · 2026-12-07
//!
//! | workload | … |
//! | --- | ---: |
//! | … | … |
//! <!-- end: redis -->
//! ```
//!
//! With `IDEM_DOC_TABLES=<dir>` set (as `tests/benches/all.sh` and `tests/reliability.sh` do) it
//! also writes the block to `<dir>/<id>.md`; `IDEM_DOC_COMMAND` and `IDEM_DOC_DATE` name the
//! command and the day it ran. `tests/tests/doc_tables.rs` checks that every table in the docs
//! still has the columns its [`Table::new`] declares.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::sync::Mutex;

/// A ratio as the tables show it: three decimals, `–` when it was not measured.
pub fn r3(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "–".to_owned()
    }
}

/// A rate (calls/s, messages/s) with thousands separators, `–` when it was not measured.
pub fn rate(x: f64) -> String {
    if !x.is_finite() {
        return "–".to_owned();
    }
    let digits = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A duration as the suites' tables show it: milliseconds below a second, else seconds.
pub fn secs(d: std::time::Duration) -> String {
    if d < std::time::Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

/// The rows several tests of one test binary give one table, each test its own: see
/// [`Table::emit_shared`].
pub struct SharedRows(Mutex<BTreeMap<String, Vec<String>>>);

impl SharedRows {
    /// No rows yet; for a `static`.
    pub const fn new() -> SharedRows {
        SharedRows(Mutex::new(BTreeMap::new()))
    }
}

impl Default for SharedRows {
    fn default() -> SharedRows {
        SharedRows::new()
    }
}

/// One table of figures, printed as a block the docs are generated from.
pub struct Table {
    id: &'static str,
    head: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table named `id` (unique across the benches) with the columns `head`. The first column
    /// is left-aligned, the others right-aligned.
    pub fn new(id: &'static str, head: &[&'static str]) -> Table {
        Table {
            id,
            head: head.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; it must have one cell per column.
    pub fn row<S: Display>(&mut self, cells: impl IntoIterator<Item = S>) {
        let row: Vec<String> = cells.into_iter().map(|c| c.to_string()).collect();
        assert_eq!(
            row.len(),
            self.head.len(),
            "table {}: a row of {} cells under {} columns",
            self.id,
            row.len(),
            self.head.len()
        );
        self.rows.push(row);
    }

    /// Adds `row` to `shared` under `key` and emits the table (this one's rows, then every row
    /// in `shared` in the order of their keys). The tests of one binary run in one process, so
    /// the last of them to finish prints and writes the table with every test's row.
    pub fn emit_shared<S: Display>(
        self,
        shared: &SharedRows,
        key: &str,
        row: impl IntoIterator<Item = S>,
    ) {
        self.gather(shared, key, row).emit();
    }

    /// This table with `row` added to `shared` under `key`, and every row of `shared` in the
    /// order of their keys.
    fn gather<S: Display>(
        mut self,
        shared: &SharedRows,
        key: &str,
        row: impl IntoIterator<Item = S>,
    ) -> Table {
        let mut rows = shared.0.lock().unwrap_or_else(|e| e.into_inner());
        rows.insert(
            key.to_owned(),
            row.into_iter().map(|c| c.to_string()).collect(),
        );
        for row in rows.values() {
            self.row(row);
        }
        self
    }

    /// The block: its markers, the command and date line, and the Markdown table.
    pub fn block(&self) -> String {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let command = env("IDEM_DOC_COMMAND").unwrap_or_else(|| {
            let args: Vec<String> = std::env::args().collect();
            args.join(" ")
        });
        let date = env("IDEM_DOC_DATE").unwrap_or_else(|| "(date not given)".to_owned());
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        let mut out = format!("<!-- table: {} -->\n`{command}` · {date}\n\n", self.id);
        out += &line(&self.head.iter().map(|h| h.to_string()).collect::<Vec<_>>());
        let align: Vec<String> = (0..self.head.len())
            .map(|i| if i == 0 { "---" } else { "---:" }.to_owned())
            .collect();
        out += &line(&align);
        for row in &self.rows {
            out += &line(row);
        }
        out += &format!("<!-- end: {} -->\n", self.id);
        out
    }

    /// Prints the block, and writes it to `$IDEM_DOC_TABLES/<id>.md` when that is set.
    pub fn emit(&self) {
        let block = self.block();
        println!("\n{block}");
        if let Some(dir) = std::env::var_os("IDEM_DOC_TABLES") {
            let dir = std::path::PathBuf::from(dir);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(format!("{}.md", self.id)), block).unwrap();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_rows_come_in_the_order_of_their_keys() {
        let shared = SharedRows::new();
        let table = || Table::new("t", &["a", "b"]);
        let first = table().gather(&shared, "1", ["y", "2"]).block();
        assert!(first.contains("| y | 2 |\n<!-- end: t -->"), "{first}");
        let both = table().gather(&shared, "0", ["x", "1"]).block();
        assert!(
            both.contains("| --- | ---: |\n| x | 1 |\n| y | 2 |\n<!-- end: t -->"),
            "{both}"
        );
    }

    #[test]
    fn durations_below_a_second_in_ms() {
        use std::time::Duration;
        assert_eq!(secs(Duration::from_millis(104)), "104 ms");
        assert_eq!(secs(Duration::from_millis(4010)), "4.01 s");
    }
}
