#!/usr/bin/env python3
"""Rewrites the generated tables of a docs page from the blocks the benches wrote.

    python3 tests/benches/doc_tables.py docs/BENCHMARKS.md target/doc-tables

A bench run with IDEM_DOC_TABLES=<dir> writes each of its tables to <dir>/<id>.md as a block
(`<!-- table: <id> -->`, the command and date, the Markdown table, `<!-- end: <id> -->`; see
tests/benches/support/mod.rs). Every block of the page whose id has a file in <dir> is replaced by
that file, as it is; the others are left alone and listed, as are files no block of the page asks
for. Exits 1 when a block in <dir> is malformed, 0 otherwise.
"""

import os
import re
import sys

BLOCK = re.compile(r"<!-- table: ([A-Za-z0-9-]+) -->\n.*?<!-- end: \1 -->\n", re.S)


def main(page_path, out_dir):
    with open(page_path, encoding="utf-8") as f:
        page = f.read()
    fresh = {}
    for name in sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []:
        if not name.endswith(".md"):
            continue
        with open(os.path.join(out_dir, name), encoding="utf-8") as f:
            block = f.read()
        ident = name[:-3]
        if not BLOCK.fullmatch(block) or BLOCK.fullmatch(block).group(1) != ident:
            print(f"{out_dir}/{name}: not a block of table {ident}", file=sys.stderr)
            return 1
        fresh[ident] = block
    replaced, kept = [], []

    def swap(m):
        ident = m.group(1)
        if ident in fresh:
            replaced.append(ident)
            return fresh[ident]
        kept.append(ident)
        return m.group(0)

    page = BLOCK.sub(swap, page)
    with open(page_path, "w", encoding="utf-8") as f:
        f.write(page)
    unused = sorted(set(fresh) - set(replaced))
    print(f"{page_path}: {len(replaced)} tables rewritten: {', '.join(replaced) or '-'}")
    if kept:
        print(f"  not in this run, left as they are: {', '.join(kept)}")
    if unused:
        print(f"  written by the run but in no block of this page: {', '.join(unused)}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
