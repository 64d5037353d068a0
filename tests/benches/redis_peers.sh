#!/usr/bin/env bash
# idem's Redis store against its peers on one Redis, same workload: builds and installs what it needs
# (the idem bench, the `idempotent` crate's program, a venv with Powertools), runs the contenders
# alternately for several rounds, and prints one table with ratios (idem / each contender).
#
#   tests/benches/redis_peers.sh                  # 5 rounds on redis://127.0.0.1:6379
#   ROUNDS=7 IDEM_REDIS_URL=redis://127.0.0.1:6390 tests/benches/redis_peers.sh
#
# Environment:
#   IDEM_REDIS_URL      the Redis (default redis://127.0.0.1:6379); unreachable: one skip line, exit 0
#   ROUNDS              rounds of the runner (default 5): each runs every program once, the order
#                       rotating from round to round; ratios are taken within a round, then the median
#   IDEM_BENCH_ROUNDS   rounds inside each program per run (default 3; each program reports its median)
#   IDEM_BENCH_SCALE    calls per round, as a factor (default 1: 5,000 sequential and 20,000 with 64
#                       tasks for the Rust programs, 2,000 sequential for Python)
#   CARGO_TARGET_DIR    where builds and the venv go (default target/)
#   IDEM_BENCH_BIN      an idem bench binary to use instead of building one (before/after comparisons)
#   SKIP_REFERENCE=1    leave out the redis-benchmark reference figures
#   SKIP_POWERTOOLS=1   leave out Powertools (no Python needed then)
#
# Each program prints `calls/s <contender> <mode> <workload> <value>`; the raw lines of every round
# are kept in $CARGO_TARGET_DIR/redis-peers/results.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
URL=${IDEM_REDIS_URL:-redis://127.0.0.1:6379}
ROUNDS=${ROUNDS:-5}
export IDEM_REDIS_URL=$URL
export IDEM_BENCH_ROUNDS=${IDEM_BENCH_ROUNDS:-3}
export IDEM_BENCH_SCALE=${IDEM_BENCH_SCALE:-1}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=$TARGET/redis-peers
mkdir -p "$OUT"
RESULTS=$OUT/results.txt
LOG=$OUT/log.txt
: >"$RESULTS"
: >"$LOG"

say() { echo "== $*" >&2; }

# Debian packages, when this runs as root with apt-get (otherwise the caller says what is missing).
apt_install() {
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 0
    say "installing $*"
    apt-get update -qq >>"$LOG" 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >>"$LOG" 2>&1 || true
}

# A tool, from its Debian package when it is missing.
need() {
    local tool=$1
    shift
    command -v "$tool" >/dev/null 2>&1 || apt_install "$@"
    command -v "$tool" >/dev/null 2>&1 || { echo "$tool is missing (Debian: $*)" >&2; exit 1; }
}

# --- builds ---------------------------------------------------------------------------------------
if [ -n "${IDEM_BENCH_BIN:-}" ]; then
    IDEM_BIN=$IDEM_BENCH_BIN
else
    say "building the idem bench (cargo bench -p idem-suite --bench redis --features redis --no-run)"
    IDEM_BIN=$(cargo bench -p idem-suite --bench redis --features redis --no-run 2>&1 | tee -a "$LOG" |
        sed -n 's/^ *Executable benches\/redis.rs (\(.*\))$/\1/p')
    [ -x "$IDEM_BIN" ] || { echo "the idem bench did not build; see $LOG" >&2; exit 1; }
fi

# Reachable? The bench prints one skip line when it is not; otherwise it loads idem's claim and
# complete scripts and prints their SHA1s (for the reference EVALSHA below).
SCRIPTS=$(IDEM_BENCH_ONLY=scripts "$IDEM_BIN")
if [[ $SCRIPTS == skipped:* ]]; then
    echo "$SCRIPTS"
    exit 0
fi
CLAIM_SHA=$(awk '$1 == "script" && $2 == "claim" { print $3 }' <<<"$SCRIPTS")
COMPLETE_SHA=$(awk '$1 == "script" && $2 == "complete" { print $3 }' <<<"$SCRIPTS")

say "building tests/benches/peers/idempotent-rs (cargo build --release --locked)"
cargo build --release --locked --manifest-path tests/benches/peers/idempotent-rs/Cargo.toml \
    --target-dir "$TARGET/peers" >>"$LOG" 2>&1 || { echo "the idempotent-rs program did not build; see $LOG" >&2; exit 1; }
PEER_BIN=$TARGET/peers/release/idempotent-rs-peer

CONTENDERS=(idem idempotent-rs)
if [ "${SKIP_POWERTOOLS:-0}" != 1 ]; then
    need python3 python3 python3-venv
    VENV=$TARGET/powertools-venv
    REQ=tests/benches/peers/powertools/requirements.txt
    if ! cmp -s "$REQ" "$VENV/.requirements" 2>/dev/null; then
        say "creating $VENV and installing $REQ"
        if ! python3 -m venv --clear "$VENV" >>"$LOG" 2>&1; then
            apt_install python3-venv
            python3 -m venv --clear "$VENV" >>"$LOG" 2>&1 ||
                { echo "python3 cannot make a venv; see $LOG" >&2; exit 1; }
        fi
        "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQ" >>"$LOG" 2>&1 ||
            { echo "pip install failed; see $LOG" >&2; exit 1; }
        cp "$REQ" "$VENV/.requirements"
    fi
    CONTENDERS+=(powertools)
fi

run_one() {
    case $1 in
    idem) env -u IDEM_DOC_TABLES "$IDEM_BIN" 2>>"$LOG" ;;
    idempotent-rs) "$PEER_BIN" 2>>"$LOG" ;;
    powertools) "$VENV/bin/python" tests/benches/peers/powertools/bench.py 2>>"$LOG" ;;
    esac
}

# --- reference: redis-benchmark on the same server ------------------------------------------------
if [ "${SKIP_REFERENCE:-0}" != 1 ]; then
    need redis-benchmark redis-tools
    need redis-cli redis-tools
    say "reference: redis-benchmark"
    # The last "NNN requests per second" of each test (a custom command's label has colons too).
    rps() { tr '\r' '\n' | grep 'requests per second' | sed 's/.*: \([0-9.]*\) requests per second.*/\1/'; }
    ref() { # label, redis-benchmark arguments
        local label=$1
        shift
        local v
        v=$(redis-benchmark -u "$URL" -q "$@" 2>>"$LOG" | rps | paste -sd' ')
        printf '%-58s %s\n' "$label" "$v"
    }
    {
        echo "reference: redis-benchmark (requests/s; one request = one round trip)"
        for c in 1 50; do
            ref "-c $c -n 100000 -t ping,set,get (PING_INLINE PING_MBULK SET GET)" -c $c -n 100000 -t ping,set,get
        done
        # idem's claim script on new keys (a first execution's first round trip), and on a record
        # that SUCCEEDED (a replay). Keys under a prefix of this run, expiring after 60 s (the
        # records; the stuck index, which the new keys' claims fill, is removed below). KEYS are
        # idem's: the record `<prefix>{<n>:<biz>:<key>}` and the stuck index `<prefix>stuck:<n>:<biz>`.
        KP="rbref$$"
        DONE="$KP:{5:BENCH:done}"
        INDEX="$KP:stuck:5:BENCH"
        FENCE=$(redis-cli -u "$URL" EVALSHA "$CLAIM_SHA" 2 "$DONE" "$INDEX" "" 30000 60000 0 | sed -n 3p)
        redis-cli -u "$URL" EVALSHA "$COMPLETE_SHA" 2 "$DONE" "$INDEX" "$FENCE" \
            '{"Ok":{"id":"order-1","amount":107,"seq":1}}' 60000 "" 0 >/dev/null
        for c in 1 50; do
            ref "-c $c EVALSHA claim, new keys" -c $c -n 50000 -r 1000000000 \
                EVALSHA "$CLAIM_SHA" 2 "$KP:{5:BENCH:__rand_int__}" "$INDEX" "" 30000 60000 0
            ref "-c $c EVALSHA claim, SUCCEEDED record (replay)" -c $c -n 50000 \
                EVALSHA "$CLAIM_SHA" 2 "$DONE" "$INDEX" "" 30000 60000 0
        done
        redis-cli -u "$URL" --scan --pattern "$KP:*" | xargs -r -n 1000 redis-cli -u "$URL" UNLINK >/dev/null
    } | tee "$OUT/reference.txt"
    echo
fi

# --- rounds ---------------------------------------------------------------------------------------
n=${#CONTENDERS[@]}
for ((r = 0; r < ROUNDS; r++)); do
    order=()
    for ((i = 0; i < n; i++)); do order+=("${CONTENDERS[$(((r + i) % n))]}"); done
    say "round $((r + 1))/$ROUNDS: ${order[*]}"
    for who in "${order[@]}"; do
        run_one "$who" | awk -v r="$r" '$1 == "calls/s" { print r, $2, $3, $4, $5 }' >>"$RESULTS"
    done
done

# --- the table ------------------------------------------------------------------------------------
PY=python3
[ -n "${VENV:-}" ] && PY=$VENV/bin/python
echo "Redis: $URL; $ROUNDS rounds (order rotating), each program $IDEM_BENCH_ROUNDS inner rounds, scale $IDEM_BENCH_SCALE"
echo "figures: median calls/s over rounds; ratios: idem-call / contender, per round, then the median"
"$PY" - "$RESULTS" <<'EOF'
import os
import statistics
import sys
from collections import defaultdict

vals = defaultdict(dict)  # (contender, mode, workload) -> {round: calls/s}
for line in open(sys.argv[1]):
    r, who, mode, work, v = line.split()
    vals[(who, mode, work)][int(r)] = float(v)

def med(xs):
    return statistics.median(xs) if xs else float("nan")

def ratio(who, mode, work):
    a, b = vals.get(("idem-call", mode, work), {}), vals.get((who, mode, work), {})
    return med([a[r] / b[r] for r in a if r in b and b[r] > 0])

order = ["idem-call", "idem-macro", "floor", "idempotent-rs", "powertools"]
head = ["contender", "tasks", "first calls/s", "replay calls/s", "idem / it, first", "idem / it, replay"]
rows = []
for mode, tasks in [("seq", "1"), ("c64", "64")]:
    for who in order:
        if (who, mode, "first") not in vals:
            continue
        f = med(list(vals[(who, mode, "first")].values()))
        p = med(list(vals.get((who, mode, "replay"), {}).values()))
        rf, rp = ("–", "–") if who == "idem-call" else (f"{ratio(who, mode, 'first'):.3f}", f"{ratio(who, mode, 'replay'):.3f}")
        rows.append([who, tasks, f"{f:,.0f}", f"{p:,.0f}", rf, rp])

# The block the docs are generated from (tests/benches/support/mod.rs writes the same form).
command = os.environ.get("IDEM_DOC_COMMAND") or "tests/benches/redis_peers.sh"
date = os.environ.get("IDEM_DOC_DATE") or "(date not given)"
line = lambda cells: "| " + " | ".join(cells) + " |\n"
block = f"<!-- table: redis-peers -->\n`{command}` · {date}\n\n" + line(head)
block += line(["---"] + ["---:"] * (len(head) - 1))
block += "".join(line(r) for r in rows) + "<!-- end: redis-peers -->\n"
print(block)
if os.environ.get("IDEM_DOC_TABLES"):
    os.makedirs(os.environ["IDEM_DOC_TABLES"], exist_ok=True)
    with open(os.path.join(os.environ["IDEM_DOC_TABLES"], "redis-peers.md"), "w") as out:
        out.write(block)
EOF
