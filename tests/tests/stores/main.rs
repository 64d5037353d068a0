//! The store contract (`tests/contract`) on every backend, one module per store: the same cases
//! on the memory store, SQLite, MariaDB, Postgres, Redis and Redis Cluster, the sharded and
//! encrypted wrappers and the stores `idem::connect` opens from a URL; the `*_tx` modules run the
//! transaction-mode contract; `tokens` the token stores' contract, the `*_transition` and `mysql_pay_callback` modules state transitions on the
//! SQL servers. One test binary: the contract is compiled and linked once.

#[macro_use]
#[path = "../contract/mod.rs"]
mod contract;
// What several stores' modules share.
// A Redis server of a test's own (the cluster's nodes).
#[cfg(feature = "redis")]
#[path = "../support/redis_server.rs"]
mod redis_server;
// A Redis Cluster of three servers of the test's own.
#[cfg(feature = "redis")]
#[path = "../support/redis_cluster.rs"]
mod cluster;
// A Postgres store on a table of the test's own.
#[cfg(feature = "postgres")]
#[path = "../support/postgres.rs"]
mod pg;
// The tables a MariaDB test leaves, dropped.
#[cfg(feature = "mysql")]
#[path = "../support/mysql_leftovers.rs"]
mod leftovers;
// The payment-callback scenario the transition suites run on each SQL server.
#[cfg(any(feature = "mysql", feature = "postgres"))]
#[allow(dead_code)] // its SQLite side is the pay_callback suite's
#[path = "../support/pay_callback.rs"]
mod scenario;

#[cfg(feature = "dynamodb")]
mod dynamo;
#[cfg(feature = "encrypt")]
mod encrypted;
#[cfg(all(feature = "encrypt", feature = "postgres"))]
mod encrypted_postgres;
#[cfg(all(feature = "encrypt", feature = "redis"))]
mod encrypted_redis;
mod memory;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "mysql")]
mod mysql_pay_callback;
#[cfg(feature = "mysql")]
mod mysql_transition;
#[cfg(feature = "mysql")]
mod mysql_tx;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
mod postgres_transition;
#[cfg(feature = "postgres")]
mod postgres_tx;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis")]
mod redis_cluster;
mod sharded;
#[cfg(feature = "mysql")]
mod sharded_mysql;
#[cfg(feature = "postgres")]
mod sharded_postgres;
mod sqlite;
mod sqlite_tx;
mod tokens;
mod url;
