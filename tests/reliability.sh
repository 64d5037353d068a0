#!/usr/bin/env bash
# docs/RELIABILITY.md's tables of measured figures, from one run: the storms of idem-storm (built
# once, release), the model check, and the suites that measure (each prints its tables through
# `idem_suite::doc_table::Table`), then the page's blocks rewritten from what they wrote.
#
#   tests/reliability.sh                      # every part
#   tests/reliability.sh storms chaos         # some parts (the other tables stay as they are)
#
# Parts: storms (retry storms, result ttl, stalled and slow holders), chaos (the fault storm),
# model (the model check's state counts), suites (silent network, holder outage,
# Galera, pg_auto_failover, resharding). The servers are the tests' (IDEM_PG_URL, IDEM_MYSQL_URL,
# IDEM_REDIS_URL, IDEM_DYNAMO_URL); the holder outage restarts the machine's servers
# (IDEM_RESTART_SERVICES=1, which this script sets). Run it alone on the machine: a build or a test
# beside it moves every timing.
#
#   IDEM_DOC_TABLES     where the blocks go (default target/doc-tables-reliability)
#   CARGO_TARGET_DIR    where the builds go (default target/)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export IDEM_DOC_TABLES=${IDEM_DOC_TABLES:-$ROOT/target/doc-tables-reliability}
IDEM_DOC_DATE=$(date -u +%F)
export IDEM_DOC_DATE
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=$TARGET/reliability
ALL=(storms chaos model suites)
if [ $# -gt 0 ]; then PARTS=("$@"); else PARTS=("${ALL[@]}"); fi
# Only this run's blocks go into the page.
rm -rf "$IDEM_DOC_TABLES"
mkdir -p "$IDEM_DOC_TABLES" "$OUT/json"
LOG=$OUT/log.txt
: >"$LOG"

say() { echo "== $* ($(date -u +%T))" >&2; }
FAILED=()
wants() { [[ " ${PARTS[*]} " == *" $1 "* ]]; }

STORM=$TARGET/release/idem-storm
STORM_SHOWN="idem-storm"
if wants storms || wants chaos; then
    say "building idem-storm (cargo build -p idem-storm --release --features redis,postgres,mysql)"
    cargo build -q -p idem-storm --release --features redis,postgres,mysql
fi

# One storm: its JSON summary to $OUT/json/<name>.json. A storm whose audit finds a broken
# invariant exits 1 and still prints its summary (the stalled-holder storms without --recover
# must); exit 2 is a storm that could not run: it is named at the end, and its row left out.
storm() {
    local name=$1
    shift
    echo "idem-storm $*" >>"$LOG"
    local rc=0
    "$STORM" "$@" --json --quiet >"$OUT/json/$name.json" 2>>"$LOG" || rc=$?
    if [ "$rc" -gt 1 ]; then
        FAILED+=("idem-storm $* (exit $rc)")
        rm -f "$OUT/json/$name.json"
    fi
}

if wants storms; then
    rm -f "$OUT"/json/storm-* "$OUT"/json/ttl-* "$OUT"/json/stall-*
    say "retry storms"
    for sm in memory:lease sqlite:lease sqlite:tx sharded:lease sharded:tx redis:lease \
        postgres:lease postgres:tx mysql:lease mysql:tx; do
        s=${sm%:*} m=${sm#*:}
        storm "storm-$s-$m" --store "$s" --mode "$m" -n 20000 -c 64 --seed 7
    done
    say "results kept shorter than their keys"
    for smn in sqlite:lease:20000 sqlite:tx:20000 redis:lease:10000 postgres:lease:10000 \
        mysql:lease:10000; do
        IFS=: read -r s m n <<<"$smn"
        storm "ttl-$s-$m" --store "$s" --mode "$m" -n "$n" -c 64 --dup-rate 0.3 --skew 0 \
            --result-ttl 50ms --seed 7
    done
    say "stalled and slow holders"
    for s in memory sqlite sharded redis postgres mysql; do
        for how in stall slow; do
            for rec in plain recover; do
                extra=()
                [ "$rec" = recover ] && extra=(--recover)
                storm "stall-$s-$how-$rec" --store "$s" -n 2000 -c 64 --dup-rate 0.5 --skew 0 \
                    --lease 200ms --no-heartbeat --seed 11 "--$how-rate" 0.5 "${extra[@]}"
            done
        done
    done
fi

if wants chaos; then
    rm -f "$OUT"/json/chaos-*
    say "fault storms (12 s each)"
    seed=101
    for sm in postgres:lease postgres:tx mysql:lease mysql:tx redis:lease; do
        s=${sm%:*} m=${sm#*:}
        extra=()
        [ "$m" = lease ] && extra=(--recover)
        storm "chaos-$s-$m" --chaos 12s --store "$s" --mode "$m" "${extra[@]}" --workers 3 -c 8 \
            --dup-rate 0.5 --lease 2s --store-timeout 1s --seed "$seed"
        seed=$((seed + 1))
    done
fi

if wants model; then
    say "model check (CI bounds, then the larger ones)"
    rm -f "$OUT"/model-*.txt
    for bounds in ci large; do
        cmd="cargo test -p idem-runtime --lib the_protocol_holds -- --nocapture"
        [ "$bounds" = large ] && cmd="IDEM_MODEL_BOUNDS=large $cmd"
        if bash -c "$cmd" >"$OUT/model-$bounds.log" 2>&1; then
            grep -o 'model check: .*' "$OUT/model-$bounds.log" >"$OUT/model-$bounds.txt" || true
        else
            FAILED+=("$cmd")
        fi
        cat "$OUT/model-$bounds.log" >>"$LOG"
    done
fi

if wants suites; then
    # Each suite writes its own tables (Table::emit) under the command that ran it; a suite that
    # fails is named at the end, and its tables stay as they are.
    suite() {
        local cmd=$1 dir=$OUT/suite
        say "$cmd"
        rm -rf "$dir"
        if IDEM_DOC_TABLES=$dir IDEM_DOC_COMMAND="$cmd" bash -c "$cmd" >>"$LOG" 2>&1; then
            if [ -d "$dir" ]; then cp "$dir"/*.md "$IDEM_DOC_TABLES"/; fi
        else
            FAILED+=("$cmd")
        fi
    }
    export IDEM_REQUIRE_SERVICES=1
    suite "cargo test -p idem-suite --all-features --test silent_network -- --nocapture"
    suite "IDEM_RESTART_SERVICES=1 cargo test -p idem-suite --all-features --test holder_outage -- --test-threads=1 --nocapture"
    suite "cargo test -p idem-suite --all-features --test galera -- --nocapture"
    suite "cargo test -p idem-suite --all-features --test pg_auto_failover -- --nocapture"
    suite "cargo test -p idem-suite --all-features --test reshard -- --nocapture --test-threads 1"
    suite "cargo test -p idem-suite --all-features --test reshard_faults -- --nocapture"
fi

# --- the tables of the storms and the model check -------------------------------------------------
say "writing the tables"
python3 - "$OUT" <<'EOF'
import glob
import json
import os
import re
import sys

out = sys.argv[1]
tables = os.environ["IDEM_DOC_TABLES"]
date = os.environ["IDEM_DOC_DATE"]


def load(name):
    path = os.path.join(out, "json", name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def n(x):
    return f"{x:,}"


def emit(tid, command, head, rows, want=1):
    """Writes the block of one table (tests/src/doc_table.rs writes the same form), unless a run
    it needs is missing: the page's table then stays as it is."""
    if len(rows) < want:
        print(f"table {tid}: {len(rows)} of {want} rows; left as it is", file=sys.stderr)
        return
    line = lambda cells: "|" + "".join(f" {c} |" for c in cells) + "\n"
    block = f"<!-- table: {tid} -->\n`{command}` · {date}\n\n" + line(head)
    block += line(["---"] + ["---:"] * (len(head) - 1))
    block += "".join(line(r) for r in rows) + f"<!-- end: {tid} -->\n"
    print(block)
    with open(os.path.join(tables, tid + ".md"), "w") as f:
        f.write(block)


STORES = ["memory", "sqlite", "sharded", "redis", "postgres", "mysql"]

head = ["store", "mode", "requests", "distinct keys", "executions (ledger)", "replays", "in progress", "double executions", "req/s", "p50 / p99 ms"]
# table: storm
rows = []
for s in STORES:
    for m in ["lease", "tx"]:
        j = load(f"storm-{s}-{m}")
        if j:
            rows.append([s, m, n(j["requests"]), n(j["distinct_keys"]), n(j["executions"]),
                         n(j["replays"]), n(j["in_progress"]), n(j["double_executions"]),
                         f"{j['throughput_rps']:,.0f}", f"{j['p50_ms']:.1f} / {j['p99_ms']:.1f}"])
emit("storm", "idem-storm --store S --mode M -n 20000 -c 64 --seed 7", head, rows, 10)

head = ["store", "mode", "requests", "executions (ledger)", "replays", "result expired", "double executions", "false refusals"]
# table: result-ttl-storm
rows = []
for s in STORES:
    for m in ["lease", "tx"]:
        j = load(f"ttl-{s}-{m}")
        if j:
            rows.append([s, m, n(j["requests"]), n(j["executions"]), n(j["replays"]),
                         n(j["result_expired"]), n(j["double_executions"]), n(j["false_refusals"])])
emit("result-ttl-storm",
     "idem-storm --store S --mode M -n N -c 64 --dup-rate 0.3 --skew 0 --result-ttl 50ms --seed 7",
     head, rows, 5)

head = ["store", "`--stall-rate 0.5`", "`--stall-rate 0.5 --recover`", "`--slow-rate 0.5`", "`--slow-rate 0.5 --recover`", "foreign / split / false successes"]
# table: stall-storm
rows = []
for s in STORES:
    runs = [load(f"stall-{s}-{how}-{rec}") for how in ["stall", "slow"] for rec in ["plain", "recover"]]
    if not all(runs):
        continue
    cells = []
    for j, rec in zip(runs, ["plain", "recover"] * 2):
        d = n(j["double_executions"])
        cells.append(f"{d} ({n(j['recovered'])} recovered)" if rec == "recover" else d)
    wrong = sum(j["foreign_answers"] + j["split_answers"] + j["false_successes"] for j in runs)
    rows.append([s] + cells + [n(wrong)])
emit("stall-storm",
     "idem-storm --store S -n 2000 -c 64 --dup-rate 0.5 --skew 0 --lease 200ms --no-heartbeat --seed 11 --stall-rate 0.5 [--recover]",
     head, rows, len(STORES))

head = ["store", "mode", "calls", "effects (keys)", "faults: kill / pause / silence / restart", "processes", "`store-unavailable` answers", "taken over / recovered", "double executions", "lost successes", "longest call", "over deadline"]
# table: chaos-storm
rows = []
names = {"postgres": "Postgres", "mysql": "MariaDB", "redis": "Redis"}
for s, m in [("postgres", "lease"), ("postgres", "tx"), ("mysql", "lease"), ("mysql", "tx"), ("redis", "lease")]:
    j = load(f"chaos-{s}-{m}")
    if not j:
        continue
    c = j["chaos"]
    faults = " / ".join(str(c["faults"].get(k, 0)) for k in ["kill", "pause", "silence", "restart"])
    took = f"{n(j['takeovers'])} / {n(j['recovered'])}" if m == "lease" else "–"
    rows.append([names[s], "lease + recover" if m == "lease" else "tx", n(j["requests"]),
                 n(j["executions"]), faults, n(c["processes"]),
                 n(j["errors"].get("store-unavailable", 0)), took, n(j["double_executions"]),
                 n(j["foreign_answers"]), f"{c['longest_call_ms']:,.0f} ms", n(c["over_deadline"])])
emit("chaos-storm",
     "idem-storm --chaos 12s --store S --mode M [--recover] --workers 3 -c 8 --dup-rate 0.5 --lease 2s --store-timeout 1s --seed 101…105",
     head, rows, 5)


def seconds(text):
    m = re.fullmatch(r"([0-9.]+)(ns|µs|us|ms|s)", text.strip())
    scale = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]
    return float(m.group(1)) * scale


for tid, file, bounds, env in [
    ("model-check", "model-ci.txt", "3 callers × 2 calls, lease 2 ticks, TTL 3 ticks, clock to 6 ticks", ""),
    ("model-check-large", "model-large.txt", "the same, clock to 8 ticks", "IDEM_MODEL_BOUNDS=large "),
]:
    path = os.path.join(out, file)
    if not os.path.exists(path):
        continue
    text = open(path).read()
    m = re.search(r"model check: (\d+) states \((\d+) unique\) in (\S+)", text)
    if not m:
        continue
    head = ["bounds", "states generated", "unique states", "time"]
    # table: model-check
    # table: model-check-large
    emit(tid, f"{env}cargo test -p idem-runtime --lib the_protocol_holds -- --nocapture", head,
         [[bounds, n(int(m.group(1))), n(int(m.group(2))), f"{seconds(m.group(3)):.1f} s"]])
EOF

python3 tests/benches/doc_tables.py docs/RELIABILITY.md "$IDEM_DOC_TABLES"
if [ ${#FAILED[@]} -gt 0 ]; then
    printf 'failed (see %s):\n' "$LOG" >&2
    printf '  %s\n' "${FAILED[@]}" >&2
    exit 1
fi
