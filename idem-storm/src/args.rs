//! The command line: what to drive, how hard, and which faults to inject.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

/// Drives an idem store with a retry storm and audits the side effects in an independent ledger.
///
/// Each request calls one idempotent function whose body writes one ledger row. Duplicates repeat
/// an earlier request's key (recent keys more often, so many duplicates are in flight at once).
/// Afterwards the ledger is counted: a key with two rows is a double execution, and every answer
/// must be the run that the ledger holds for its key. Exit status: 0 when every invariant holds,
/// 1 when one breaks, 2 when the storm could not start.
#[derive(Debug, Clone, Parser)]
#[command(name = "idem-storm", version)]
pub struct Args {
    /// The store to drive.
    #[arg(long, value_enum, default_value_t = StoreKind::Sqlite)]
    pub store: StoreKind,

    /// Lease mode (claim, run, mark) or tx mode (claim, business write and mark in one
    /// transaction; SQL stores only).
    #[arg(long, value_enum, default_value_t = Mode::Lease)]
    pub mode: Mode,

    /// Requests to send.
    #[arg(short = 'n', long, default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub requests: u64,

    /// Share of requests that repeat an earlier request's key (0 to 1).
    #[arg(long, default_value_t = 0.123, value_parser = fraction)]
    pub dup_rate: f64,

    /// Requests in flight at once.
    #[arg(short = 'c', long, default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,

    /// How strongly duplicates favour recent requests: a duplicate reaches `x` or more requests
    /// back with probability `(x + 1)^-skew`. Larger values repeat the last few requests
    /// (duplicates that arrive while the first still runs); 0 picks any earlier request alike.
    #[arg(long, default_value_t = 0.3, value_parser = non_negative)]
    pub skew: f64,

    /// The claim's lease (e.g. `2s`, `500ms`).
    #[arg(long, default_value = "2s", value_parser = duration)]
    pub lease: Duration,

    /// How long a record lives (must be longer than the lease).
    #[arg(long, default_value = "10m", value_parser = duration)]
    pub ttl: Duration,

    /// Keep each result for replay only this long, while its key stays used for `--ttl`: a
    /// duplicate later than this is refused as result expired (its body does not run), and the
    /// audit checks that every such refusal is of a key whose effect the ledger holds. At most
    /// `--ttl`; the result is kept as long as the record when not given.
    #[arg(long, value_parser = duration)]
    pub result_ttl: Option<Duration>,

    /// How long a body takes.
    #[arg(long, default_value = "1ms", value_parser = duration)]
    pub body: Duration,

    /// Share of requests whose body fails with a business error before its effect.
    #[arg(long, default_value_t = 0.0, value_parser = fraction)]
    pub error_rate: f64,

    /// Share of requests whose body runs 1.5 leases long (the heartbeat keeps the claim).
    #[arg(long, default_value_t = 0.0, value_parser = fraction)]
    pub slow_rate: f64,

    /// Share of requests whose body stalls 1.5 leases after its effect, before it returns (a
    /// holder paused between its effect and its mark; the heartbeat keeps the claim). Without the
    /// heartbeat another attempt takes over while it stalls and runs the effect again, unless
    /// `--recover` finds it.
    #[arg(long, default_value_t = 0.0, value_parser = fraction)]
    pub stall_rate: f64,

    /// Share of requests whose body panics before its effect.
    #[arg(long, default_value_t = 0.0, value_parser = fraction)]
    pub panic_rate: f64,

    /// Share of requests whose caller gives up (drops the call's future) while the body runs,
    /// before its effect.
    #[arg(long, default_value_t = 0.0, value_parser = fraction)]
    pub drop_rate: f64,

    /// Run without a heartbeat: a slow body then outlives its lease, another attempt takes over and
    /// the slow one's effect happens twice: the storm shows what the heartbeat prevents.
    #[arg(long)]
    pub no_heartbeat: bool,

    /// Make every call with a recover fn that reads the ledger (the business table) when the call
    /// takes over an expired claim: an effect found for the key is the call's answer (the run that
    /// wrote it, as its body returned it) and the body does not run again; no effect, and the body
    /// runs. It finds effects written before the takeover looked; a body taken over before its
    /// effect (`--slow-rate`) still runs twice. Lease mode only.
    #[arg(long)]
    pub recover: bool,

    /// Seed of the request plan (keys, duplicates, faults); random when not given.
    #[arg(long)]
    pub seed: Option<u64>,

    /// SQLite database file for `--store sqlite` (a temporary file when not given).
    #[arg(long, env = "IDEM_STORM_SQLITE")]
    pub sqlite_path: Option<PathBuf>,

    /// Shards of `--store sharded` (SQLite files).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub shards: u32,

    /// Redis URL for `--store redis`.
    #[arg(long, env = "IDEM_REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,

    /// Cluster nodes for `--store redis-cluster`, comma-separated `redis://host:port` URLs.
    #[arg(long, env = "IDEM_REDIS_CLUSTER_NODES", value_delimiter = ',')]
    pub cluster_nodes: Vec<String>,

    /// MySQL / MariaDB URL for `--store mysql`.
    #[arg(
        long,
        env = "IDEM_MYSQL_URL",
        default_value = "mysql://root@127.0.0.1:3306/test"
    )]
    pub mysql_url: String,

    /// Postgres URL for `--store postgres`.
    #[arg(
        long,
        env = "IDEM_PG_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    pub pg_url: String,

    /// Print the summary as JSON on stdout instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Draw throughput, the outcome mix over time and the latency distribution into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,

    /// No progress bar or progress lines.
    #[arg(short, long)]
    pub quiet: bool,
}

/// The stores the storm can drive (those not built in answer with an error naming the feature).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    /// `MemoryStore` (one process).
    Memory,
    /// `SqliteStore` on a file.
    Sqlite,
    /// `ShardedStore` over `--shards` SQLite files.
    Sharded,
    /// `RedisStore` (feature `redis`).
    Redis,
    /// `RedisClusterStore` (feature `redis`).
    RedisCluster,
    /// `MySqlStore` (feature `mysql`).
    Mysql,
    /// `PgStore` (feature `postgres`).
    Postgres,
}

impl StoreKind {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Sqlite => "sqlite",
            StoreKind::Sharded => "sharded",
            StoreKind::Redis => "redis",
            StoreKind::RedisCluster => "redis-cluster",
            StoreKind::Mysql => "mysql",
            StoreKind::Postgres => "postgres",
        }
    }
}

/// How each request runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Claim, run the body, mark (a lease protects the claim).
    Lease,
    /// Claim, the body's write and the mark in one transaction of the store's database.
    Tx,
}

impl Mode {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Lease => "lease",
            Mode::Tx => "tx",
        }
    }
}

impl Args {
    /// Checks what clap cannot: options that contradict each other.
    ///
    /// # Errors
    /// A message naming the flags to change.
    pub fn check(&self) -> Result<(), String> {
        if self.ttl <= self.lease {
            return Err(format!(
                "--ttl ({}) must be longer than --lease ({}): a record must outlive its claim",
                humantime::format_duration(self.ttl),
                humantime::format_duration(self.lease)
            ));
        }
        if let Some(kept) = self.result_ttl
            && (kept < Duration::from_millis(1) || kept > self.ttl)
        {
            return Err(format!(
                "--result-ttl ({}) must be at least 1ms and at most --ttl ({}): a result is kept at most as long as its record",
                humantime::format_duration(kept),
                humantime::format_duration(self.ttl)
            ));
        }
        if self.lease < Duration::from_millis(10) {
            return Err("--lease must be at least 10ms".into());
        }
        let faults =
            self.error_rate + self.slow_rate + self.stall_rate + self.panic_rate + self.drop_rate;
        if faults > 1.0 + 1e-9 {
            let rates = if self.stall_rate > 0.0 {
                "--error-rate, --slow-rate, --stall-rate, --panic-rate and --drop-rate"
            } else {
                "--error-rate, --slow-rate, --panic-rate and --drop-rate"
            };
            return Err(format!(
                "{rates} add up to {faults:.3}; each request gets at most one fault, so they must add up to 1 or less"
            ));
        }
        if self.recover && self.mode == Mode::Tx {
            return Err(
                "--recover needs --mode lease: in tx mode the effect and the mark commit together, so no takeover finds an effect to recover"
                    .into(),
            );
        }
        if self.mode == Mode::Tx
            && matches!(
                self.store,
                StoreKind::Memory | StoreKind::Redis | StoreKind::RedisCluster
            )
        {
            return Err(format!(
                "--mode tx needs a store with transactions (sqlite, sharded, mysql, postgres); `{}` has none",
                self.store.name()
            ));
        }
        if self.store == StoreKind::RedisCluster && self.cluster_nodes.is_empty() {
            return Err(
                "--store redis-cluster needs --cluster-nodes redis://host:port,… (or IDEM_REDIS_CLUSTER_NODES)"
                    .into(),
            );
        }
        Ok(())
    }
}

fn fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("`{s}` is not between 0 and 1"))
    }
}

fn non_negative(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(format!("`{s}` must be a finite number ≥ 0"))
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration like `2s` or `500ms` ({e})"))?;
    if d > Duration::from_secs(30 * 24 * 3600) {
        return Err(format!("`{s}` is longer than 30 days"));
    }
    Ok(d)
}
