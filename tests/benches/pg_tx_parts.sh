#!/usr/bin/env bash
# Where a transaction-mode first execution's server time goes on Postgres, without any Rust client:
# pgbench runs the design floor's transaction, then idem's, one difference added at a time, with
# 32 clients on prepared statements, in rounds that alternate the variants.
#
#   design  BEGIN; INSERT; UPDATE; COMMIT on a table with its primary key only
#   +index  the same statements on idem's table with idem's indexes (the sweeper's expiry index,
#           the reconciler's PROCESSING index, the result-ttl index)
#   +stmt   idem's statements: the clock read by the database, the fence, the mark's checks
#   +lock   the claim under the key's advisory lock
#   +save   the claim's savepoint (here a round trip of its own; idem sends it with BEGIN)
#   func    +save with the claim as a PL/pgSQL function instead of under the advisory lock: the
#           plain insert, its lock wait bounded by a `lock_timeout` that the function's own `SET`
#           clause confines to the claim (the caller's setting back at its exit)
#
# The statements mirror the Postgres store's (idem-runtime/src/backend/postgres/statements.rs)
# with literals for its parameters. Usage: tests/benches/pg_tx_parts.sh [seconds] [rounds]
# (IDEM_PG_URL as for the tests; default 10 s, 3 rounds). Run it alone on the machine.
set -euo pipefail
url="${IDEM_PG_URL:-postgres://postgres@127.0.0.1:5432/test}"
secs="${1:-10}"
rounds="${2:-3}"
here="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"; psql "$url" -qc "DROP TABLE IF EXISTS pgparts_rec, pgparts_design; DROP FUNCTION IF EXISTS pgparts_claim(text)" >/dev/null 2>&1 || true' EXIT

m="$here/idem-runtime/migrations/postgres"
psql "$url" -q -v ON_ERROR_STOP=1 -c "DROP TABLE IF EXISTS pgparts_rec, pgparts_design" \
    -c "CREATE TABLE pgparts_design (biz TEXT NOT NULL, idem_key TEXT NOT NULL, status TEXT NOT NULL,
        lease_until BIGINT NOT NULL, expire_at BIGINT NOT NULL, result BYTEA, PRIMARY KEY (biz, idem_key))" \
    >/dev/null 2>&1
# idem's table as migrate() makes it (0003's index is dropped by 0004, so it is left out).
cat "$m/0001_idem_record.sql" "$m/0004_idem_record_processing.sql" "$m/0005_idem_record_result_until.sql" |
    sed 's/idem_record/pgparts_rec/g' | psql "$url" -q -v ON_ERROR_STOP=1 >/dev/null 2>&1

result="'\\x7b224f6b223a7b2269223a312c2273223a2278227d7d'::bytea"
clock="(SELECT FLOOR(EXTRACT(EPOCH FROM k.t) * 1000)::BIGINT AS n, FLOOR(EXTRACT(EPOCH FROM k.t) * 1000000)::BIGINT AS us FROM (SELECT clock_timestamp() AS t) AS k) AS c"
lock="WHERE pg_try_advisory_xact_lock(hashtextextended('BENCH' || chr(31) || :k::text, hashtext('pgparts_rec')))"
cols="(biz_type, idem_key, status, attempt, fence, fingerprint, result, lease_until, created_at, updated_at, expire_at)"
ins_idem() { echo "INSERT INTO pgparts_rec $cols SELECT 'BENCH', :k::text, 'PROCESSING', 1, c.us, NULL, NULL, c.n + 30000, c.n, c.n, c.n + 3600000 FROM $clock $1 ON CONFLICT (biz_type, idem_key) DO NOTHING RETURNING attempt, fence"; echo '\gset'; }
mark_idem="WITH c AS (SELECT FLOOR(EXTRACT(EPOCH FROM k.t) * 1000)::BIGINT AS n FROM (SELECT clock_timestamp() AS t) AS k) UPDATE pgparts_rec AS r SET result = CASE WHEN r.status = 'PROCESSING' THEN $result ELSE r.result END, expire_at = CASE WHEN r.status = 'PROCESSING' THEN GREATEST(r.expire_at, c.n + 3600000) ELSE r.expire_at END, result_until = CASE WHEN r.status = 'PROCESSING' THEN NULL::BIGINT ELSE r.result_until END, status = 'SUCCEEDED', updated_at = c.n FROM c WHERE r.biz_type = 'BENCH' AND r.idem_key = :k::text AND r.fence = :fence AND r.status IN ('PROCESSING', 'SUCCEEDED');"
script() {
    local name="$1"
    shift
    printf '%s\n' '\set k random(1, 4000000000000)' "BEGIN;" "$@" "COMMIT;" > "$work/$name.sql"
}
script design \
    "INSERT INTO pgparts_design (biz, idem_key, status, lease_until, expire_at) VALUES ('BENCH', :k::text, 'PROCESSING', 1000, 2000) ON CONFLICT DO NOTHING;" \
    "UPDATE pgparts_design SET status = 'SUCCEEDED', result = $result, expire_at = 3000 WHERE biz = 'BENCH' AND idem_key = :k::text;"
script +index \
    "INSERT INTO pgparts_rec $cols VALUES ('BENCH', :k::text, 'PROCESSING', 1, 7, NULL, NULL, 1000, 1, 1, 2000) ON CONFLICT DO NOTHING;" \
    "UPDATE pgparts_rec SET status = 'SUCCEEDED', result = $result, expire_at = 3000, updated_at = 2 WHERE biz_type = 'BENCH' AND idem_key = :k::text;"
script +stmt "$(ins_idem '')" "$mark_idem"
script +lock "$(ins_idem "$lock")" "$mark_idem"
script +save "SAVEPOINT idem_claim_1;" "$(ins_idem "$lock")" "$mark_idem"
psql "$url" -q -v ON_ERROR_STOP=1 >/dev/null 2>&1 <<SQL
CREATE OR REPLACE FUNCTION pgparts_claim(p_key text) RETURNS TABLE (o_attempt integer, o_fence bigint)
LANGUAGE plpgsql SET lock_timeout = '3s' AS \$f\$
BEGIN
  RETURN QUERY INSERT INTO pgparts_rec $cols SELECT 'BENCH', p_key, 'PROCESSING', 1, c.us, NULL, NULL,
    c.n + 30000, c.n, c.n, c.n + 3600000 FROM $clock
    ON CONFLICT (biz_type, idem_key) DO NOTHING RETURNING pgparts_rec.attempt, pgparts_rec.fence;
END
\$f\$;
SQL
script func "SAVEPOINT idem_claim_1;" \
    "SELECT o_attempt AS attempt, o_fence AS fence FROM pgparts_claim(:k::text)" '\gset' "$mark_idem"

variants=(design +index +stmt +lock +save func)
declare -A tps
for r in $(seq 1 "$rounds"); do
    # Rotate the order every round.
    order=("${variants[@]:r%6}" "${variants[@]:0:r%6}")
    for v in "${order[@]}"; do
        t=$(pgbench "$url" -n -M prepared -c 32 -j 2 -T "$secs" -f "$work/$v.sql" 2>&1 |
            sed -n 's/^tps = \([0-9.]*\).*/\1/p')
        tps[$v]="${tps[$v]:-} $t"
    done
done
med() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
d=$(echo "${tps[design]}" | med)
# The block the docs are generated from (the form tests/benches/support/mod.rs writes).
dest=/dev/null
if [ -n "${IDEM_DOC_TABLES:-}" ]; then
    mkdir -p "$IDEM_DOC_TABLES"
    dest=$IDEM_DOC_TABLES/pg-tx-parts.md
fi
{
    echo "<!-- table: pg-tx-parts -->"
    echo "\`${IDEM_DOC_COMMAND:-tests/benches/pg_tx_parts.sh $secs $rounds}\` · ${IDEM_DOC_DATE:-(date not given)}"
    echo
    echo "| variant | tps per round | median / design's median |"
    echo "| --- | ---: | ---: |"
    for v in "${variants[@]}"; do
        m=$(echo "${tps[$v]}" | med)
        printf '| %s | %s | %.3f |\n' "$v" "$(echo ${tps[$v]} | sed 's/ /, /g')" "$(echo "$m / $d" | bc -l)"
    done
    echo "<!-- end: pg-tx-parts -->"
} | tee "$dest"
