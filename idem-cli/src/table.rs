//! What the CLI prints as tables: `idem stats`, and the aligned table every listing uses.

use std::fmt::Write as _;

use idem::{AnyStore, IdemError, Store, store::Status};

use crate::Exit;

pub(crate) async fn stats(store: &AnyStore) -> Result<Exit, IdemError> {
    let counts = store.stats().await?;
    if counts.is_empty() {
        println!("no records in {}", store.url());
        return Ok(Exit::Ok);
    }
    const ORDER: [Status; 3] = [Status::Processing, Status::Succeeded, Status::Failed];
    // Per business type: the records in each status of ORDER, then the tombstones; under it, for
    // HTTP layer records, the same per method and route (`origin`).
    let mut rows: Vec<(String, [u64; 4], Routes)> = Vec::new();
    for c in counts {
        if rows.last().is_none_or(|(biz, ..)| *biz != c.biz) {
            rows.push((c.biz.clone(), [0; 4], Vec::new()));
        }
        let at = ORDER.iter().position(|s| *s == c.status).unwrap_or(0);
        if let Some((_, n, routes)) = rows.last_mut() {
            n[at] += c.records;
            n[3] += c.tombstones;
            if let Some(origin) = c.origin {
                if routes.last().is_none_or(|(o, _)| *o != origin) {
                    routes.push((origin, [0; 4]));
                }
                if let Some((_, r)) = routes.last_mut() {
                    r[at] += c.records;
                    r[3] += c.tombstones;
                }
            }
        }
    }
    let mut total = [0u64; 4];
    let mut cells: Vec<[String; 6]> = Vec::new();
    for (biz, n, routes) in &rows {
        for (t, v) in total.iter_mut().zip(n) {
            *t += v;
        }
        cells.push(row(biz, n));
        for (origin, r) in routes {
            cells.push(row(&format!("  {origin}"), r));
        }
    }
    cells.push(row("total", &total));
    print!(
        "{}",
        table(
            &[
                "BIZ",
                "PROCESSING",
                "SUCCEEDED",
                "FAILED",
                "TOTAL",
                "TOMBSTONES"
            ],
            &cells,
            &[false, true, true, true, true, true]
        )
    );
    println!(
        "(expired records not yet swept count under their status; an indented row counts an HTTP layer route's records)"
    );
    if total[3] > 0 {
        println!(
            "(TOMBSTONES: succeeded records whose result is no longer kept; repeats are refused \
             as result expired until the record expires)"
        );
    }
    Ok(Exit::Ok)
}

/// The counts of one business type's HTTP layer records per method and route.
type Routes = Vec<(String, [u64; 4])>;

/// One row of `idem stats`: the counts per status, their total, the tombstones.
fn row(biz: &str, n: &[u64; 4]) -> [String; 6] {
    [
        biz.to_owned(),
        n[0].to_string(),
        n[1].to_string(),
        n[2].to_string(),
        n[..3].iter().sum::<u64>().to_string(),
        n[3].to_string(),
    ]
}

/// An aligned table: a header row and rows, numbers right-aligned.
pub(crate) fn table<const N: usize>(
    header: &[&str; N],
    rows: &[[String; N]],
    right: &[bool; N],
) -> String {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            let pad = widths[i].saturating_sub(cell.chars().count());
            if right[i] {
                text.push_str(&" ".repeat(pad));
                text.push_str(cell);
            } else {
                text.push_str(cell);
                text.push_str(&" ".repeat(pad));
            }
        }
        let _ = writeln!(out, "{}", text.trim_end());
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}
