#!/usr/bin/env bash
# Every bench once, one after the other, then docs/BENCHMARKS.md's tables rewritten from what they
# printed: the page then holds one run's figures, each table under its command and date.
#
#   tests/benches/all.sh                                  # every bench at full scale
#   IDEM_BENCH_SCALE=0.3 IDEM_BENCH_ROUNDS=5 tests/benches/all.sh
#   tests/benches/all.sh redis postgres                   # some of them (the other tables stay)
#
# Run it alone on the machine (a build or a test run beside it moves every figure). The servers are
# the tests' (IDEM_PG_URL, IDEM_MYSQL_URL, IDEM_REDIS_URL, IDEM_DYNAMO_URL, IDEM_AMQP_URL,
# IDEM_NATS_URL, IDEM_KAFKA_URL); IDEM_BENCH_RECORDS sizes the background passes' store (default
# 10^6). A bench whose server does not answer prints one skip line and
# its table stays as it is. `redis-peers` builds the `idempotent` crate's program and a venv with
# Powertools (SKIP_POWERTOOLS=1 leaves Powertools out); `pg-tx-parts` needs pgbench.
set -euo pipefail
cd "$(dirname "$0")/../.."
export IDEM_DOC_TABLES=${IDEM_DOC_TABLES:-$PWD/target/doc-tables}
IDEM_DOC_DATE=$(date -u +%F)
export IDEM_DOC_DATE
FEATURES=sqlite,mysql,postgres,redis,dynamodb,axum,grpc,rabbitmq,nats,kafka
ALL=(throughput http grpc redis postgres mysql dynamodb messaging passes pg-tx-parts redis-peers)
if [ $# -gt 0 ]; then BENCHES=("$@"); else BENCHES=("${ALL[@]}"); fi
rm -rf "$IDEM_DOC_TABLES"
mkdir -p "$IDEM_DOC_TABLES"

# The settings a command ran with, as the docs show them in front of it.
settings=""
for var in IDEM_BENCH_SCALE IDEM_BENCH_ROUNDS IDEM_BENCH_RECORDS; do
    if [ -n "${!var:-}" ]; then settings+="$var=${!var} "; fi
done

cargo bench -q -p idem-suite --features "$FEATURES" --no-run
for bench in "${BENCHES[@]}"; do
    echo "== $bench ($(date -u +%T))" >&2
    case $bench in
    pg-tx-parts)
        IDEM_DOC_COMMAND="tests/benches/pg_tx_parts.sh 10 3" tests/benches/pg_tx_parts.sh 10 3
        ;;
    redis-peers)
        # idem's program runs `Call::run` alone here (its floors are the redis bench's), the redis
        # bench built above.
        IDEM_BENCH_BIN=$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/redis-* | grep -v '\.d$' | head -1)
        export IDEM_BENCH_BIN
        IDEM_DOC_COMMAND="$settings${SKIP_POWERTOOLS:+SKIP_POWERTOOLS=1 }SKIP_REFERENCE=1 IDEM_BENCH_ONLY=idem-call tests/benches/redis_peers.sh" \
            SKIP_REFERENCE=1 IDEM_BENCH_ONLY=idem-call tests/benches/redis_peers.sh
        ;;
    *)
        cmd="cargo bench -p idem-suite --features $FEATURES --bench $bench"
        IDEM_DOC_COMMAND="$settings$cmd" $cmd
        ;;
    esac
done
python3 tests/benches/doc_tables.py docs/BENCHMARKS.md "$IDEM_DOC_TABLES"
