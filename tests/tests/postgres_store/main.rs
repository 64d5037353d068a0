//! What only Postgres has: the same-key storm in lease mode and in transactions at every isolation
//! level (claimants rolling back, deadlock and serialization victims running again), the sweeper
//! over 100k expired rows, schema-qualified tables, the bounded wait of a duplicate, the errors that
//! say "run migrate()" or "restart the transaction". Against the local Postgres (`IDEM_PG_URL`);
//! every test on tables of its own.
//!
//! One module per concern: `storms` (many callers, many rows), `waits` (duplicates of an open
//! transaction), `tables` (names, schemas, migrations, limits, the shared pool) and `attribute`
//! (`#[idempotent]` on Postgres).

#[path = "../contract/mod.rs"]
mod contract;
#[path = "../support/postgres.rs"]
mod pg;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use contract::{Effects, PayError, Receipt, biz, server};
use idem::sqlx::{self, AssertSqlSafe, Row};
use idem::{Call, IdemError, PgStore, PgTx, Store, Sweeper, error::Busy, postgres::PgIsolation};
use tokio::sync::Barrier;

mod attribute;
mod storms;
mod tables;
mod waits;
