//! What the suites of server-backed stores share: each server's URL, the skip-or-fail rule when
//! it cannot be reached, and names unique to one test so runs do not collide.
//!
//! The environment the suite reads, in one place:
//!
//! | variable | what | default |
//! | --- | --- | --- |
//! | `IDEM_MYSQL_URL` | MariaDB or MySQL ([`mysql_url`]) | `mysql://root@127.0.0.1:3306/test` |
//! | `IDEM_PG_URL` | PostgreSQL ([`pg_url`]) | `postgres://postgres@127.0.0.1:5432/test` |
//! | `IDEM_REDIS_URL` | Redis ([`redis_url`]) | `redis://127.0.0.1:6379` |
//! | `IDEM_AMQP_URL` | RabbitMQ ([`amqp_url`]) | `amqp://guest:guest@127.0.0.1:5672/%2f` |
//! | `IDEM_NATS_URL` | NATS with JetStream ([`nats_url`]) | `nats://127.0.0.1:4222` |
//! | `IDEM_KAFKA_URL` | a Kafka-compatible broker ([`kafka_url`]) | `127.0.0.1:9092` |
//! | `IDEM_DYNAMO_URL` | a DynamoDB-compatible server's endpoint ([`dynamo_url`]) | `http://127.0.0.1:8000` |
//! | `IDEM_REQUIRE_SERVICES=1` | an unreachable server fails its test instead of skipping it ([`required`]) | unset |
//! | `IDEM_RESTART_SERVICES=1` | the fault tests may stop and start the machine's database services | unset |
//!
//! The test binaries' own variables (`IDEM_CRASH_CHILD`, `IDEM_RESHARD_CHILD`, `IDEM_BENCH_*`, …)
//! are set by the test that starts a child process, or by a bench's command line, and described
//! where they are read.

#![allow(dead_code)] // each test binary uses the servers it needs

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};

/// The URL in `var`, or `default` (the local service).
pub fn url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// MariaDB or MySQL: `IDEM_MYSQL_URL`, by default the local server's database `test`.
pub fn mysql_url() -> String {
    url("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
}

/// PostgreSQL: `IDEM_PG_URL`, by default the local server's database `test`.
pub fn pg_url() -> String {
    url("IDEM_PG_URL", "postgres://postgres@127.0.0.1:5432/test")
}

/// Redis: `IDEM_REDIS_URL`, by default the local server.
pub fn redis_url() -> String {
    url("IDEM_REDIS_URL", "redis://127.0.0.1:6379")
}

/// RabbitMQ: `IDEM_AMQP_URL`, by default the local broker's default vhost as guest.
pub fn amqp_url() -> String {
    url("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
}

/// NATS with JetStream: `IDEM_NATS_URL`, by default the local server.
pub fn nats_url() -> String {
    url("IDEM_NATS_URL", "nats://127.0.0.1:4222")
}

/// A Kafka-compatible broker's bootstrap address: `IDEM_KAFKA_URL`, by default the local one.
pub fn kafka_url() -> String {
    url("IDEM_KAFKA_URL", "127.0.0.1:9092")
}

/// A DynamoDB-compatible server's endpoint: `IDEM_DYNAMO_URL`, by default the local one.
pub fn dynamo_url() -> String {
    url("IDEM_DYNAMO_URL", "http://127.0.0.1:8000")
}

/// Whether an unreachable service is a failure (`IDEM_REQUIRE_SERVICES=1`, set by CI) rather than a
/// skip.
pub fn required() -> bool {
    std::env::var("IDEM_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// Runs `connect`; when it fails, prints one skip line (or panics under `IDEM_REQUIRE_SERVICES=1`)
/// and gives `None`.
pub async fn reach<T, E: std::fmt::Display>(
    service: &str,
    url: &str,
    connect: impl Future<Output = Result<T, E>>,
) -> Option<T> {
    match connect.await {
        Ok(value) => Some(value),
        Err(e) if required() => {
            panic!("{service} at {url} is unreachable and IDEM_REQUIRE_SERVICES=1: {e}")
        }
        Err(e) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!("skipped: {service} at {url} is unreachable ({e}); set IDEM_REQUIRE_SERVICES=1 to fail instead")
            });
            None
        }
    }
}

/// A name no other test of this run (or a concurrent run) uses: `prefix_<pid>_<n>`.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
