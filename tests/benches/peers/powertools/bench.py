"""Powertools for AWS Lambda (Python) on the workload of idem's benches/redis.rs.

`idempotent_function` with `RedisCachePersistenceLayer` on the same Redis (IDEM_REDIS_URL, default
redis://127.0.0.1:6379), a small result (a dataclass of a string and two integers, stored through
`DataclassSerializer`), sequentially: "first" = a new key per call (the in-progress record, the
body, the completed record); "replay" = the same keys again (the stored result returned, the body
not run). No local cache (Powertools' default), so every call goes to Redis.

Prints `calls/s powertools seq <workload> <value>` (median over rounds), the format of idem's bench.
Environment: IDEM_REDIS_URL, IDEM_BENCH_ROUNDS (default 9), IDEM_BENCH_SCALE (default 1).

benches/redis_peers.sh makes the venv ($CARGO_TARGET_DIR/powertools-venv) and installs the pinned
requirements itself; by hand:

    python3 -m venv target/powertools-venv
    target/powertools-venv/bin/pip install -r benches/peers/powertools/requirements.txt
    target/powertools-venv/bin/python benches/peers/powertools/bench.py
"""

import dataclasses
import os
import statistics
import sys
import time
import warnings

import redis

# RedisCachePersistenceLayer is the name the Redis layer is documented under; 3.x marks it
# deprecated in favour of its alias CachePersistenceLayer (the same class).
warnings.simplefilter("ignore", DeprecationWarning)
# Outside Lambda there is no context to register: records carry no in-progress expiry, which
# Powertools says once per call site; the workload never meets an in-progress record.
warnings.filterwarnings("ignore", message="Couldn't determine the remaining time left")

from aws_lambda_powertools.utilities.idempotency import (  # noqa: E402
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.persistence.redis import (  # noqa: E402
    RedisCachePersistenceLayer,
)
from aws_lambda_powertools.utilities.idempotency.serialization.dataclass import (  # noqa: E402
    DataclassSerializer,
)


@dataclasses.dataclass
class Receipt:
    id: str
    amount: int
    seq: int


def main() -> int:
    url = os.environ.get("IDEM_REDIS_URL", "redis://127.0.0.1:6379")
    rounds = int(os.environ.get("IDEM_BENCH_ROUNDS", "9"))
    scale = float(os.environ.get("IDEM_BENCH_SCALE", "1"))
    calls = max(64, int(2000 * scale))

    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.exceptions.RedisError as e:
        print(f"skipped: Redis at {url} is unreachable ({e})")
        return 0

    prefix = f"rbpy{os.getpid()}"
    layer = RedisCachePersistenceLayer(client=client)
    config = IdempotencyConfig(event_key_jmespath="order_id", expires_after_seconds=3600)

    @idempotent_function(
        data_keyword_argument="order",
        persistence_store=layer,
        config=config,
        output_serializer=DataclassSerializer(Receipt),
        key_prefix=prefix,
    )
    def place(order: dict) -> Receipt:
        k = order["order_id"]
        return Receipt(id=f"order-{k}", amount=k * 100 + 7, seq=k)

    def timed(keys: range) -> float:
        t = time.perf_counter()
        for k in keys:
            r = place(order={"order_id": k})
            assert r.seq == k, r
        return len(keys) / (time.perf_counter() - t)

    timed(range(1_000_000_000, 1_000_000_000 + calls // 5))  # warm-up, not counted
    first, replay = [], []
    for rnd in range(rounds):
        keys = range(rnd * calls, (rnd + 1) * calls)
        first.append(timed(keys))
        replay.append(timed(keys))

    # Leave nothing behind (the records would expire within the hour anyway).
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        client.unlink(key)

    print(f"calls/s powertools seq first {statistics.median(first):.0f}")
    print(f"calls/s powertools seq replay {statistics.median(replay):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
