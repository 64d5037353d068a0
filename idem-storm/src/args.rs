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

    /// Each call's store timeout: the bound on each of its store steps (the claim with its
    /// retries, the mark, each statement of tx mode), past which the call answers
    /// `StoreUnavailable`. 1ms to 30 days; idem's default (10 s) when not given.
    #[arg(long, value_parser = duration)]
    pub store_timeout: Option<Duration>,

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

    /// Run a fault storm for this long instead of sending `-n` requests (`--store postgres`,
    /// `mysql` or `redis`; 1s to 30 days): a private server of that store started from the
    /// machine's binaries (`initdb`/`pg_ctl`, `mariadbd`, `redis-server`), `--workers`
    /// application processes calling it through a TCP proxy, and `--faults` injected at random
    /// and repeatedly until the time is up. Then every key is called again until it answers, and
    /// the ledger is audited as in any storm, plus: every answered call within its deadline.
    #[arg(long, value_parser = duration, help_heading = "Fault storm")]
    pub chaos: Option<Duration>,

    /// Application processes of a fault storm, each with `--concurrency` requests in flight.
    #[arg(long, default_value_t = 3, help_heading = "Fault storm",
          value_parser = clap::value_parser!(u32).range(1..=16))]
    pub workers: u32,

    /// The faults a fault storm injects, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        help_heading = "Fault storm",
        default_value = "kill,pause,silence,restart"
    )]
    pub faults: Vec<ChaosFault>,

    /// A fault storm's worker process (set by the storm itself).
    #[arg(long, hide = true)]
    pub chaos_worker: Option<String>,

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

/// A fault a fault storm (`--chaos`) injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum ChaosFault {
    /// An application process killed (SIGKILL) in the middle of its calls, and a new one started.
    Kill,
    /// The store's server frozen (SIGSTOP) for a while, then resumed (SIGCONT).
    Pause,
    /// The network between the application and the store silent for a while (nothing passes,
    /// nothing closes); then it heals, with what it held delivered late, or with every
    /// connection open during the silence dead for good.
    Silence,
    /// The store's server killed without a shutdown and started again on the same data.
    Restart,
}

impl ChaosFault {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ChaosFault::Kill => "kill",
            ChaosFault::Pause => "pause",
            ChaosFault::Silence => "silence",
            ChaosFault::Restart => "restart",
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
        if self
            .store_timeout
            .is_some_and(|t| t < Duration::from_millis(1))
        {
            return Err("--store-timeout must be at least 1ms".into());
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
        if let Some(chaos) = self.chaos {
            if chaos < Duration::from_secs(1) {
                return Err("--chaos must be at least 1s".into());
            }
            if !matches!(
                self.store,
                StoreKind::Postgres | StoreKind::Mysql | StoreKind::Redis
            ) {
                return Err(format!(
                    "--chaos runs on a private server of postgres, mysql or redis; `{}` has no server to pause or restart",
                    self.store.name()
                ));
            }
            if self.faults.is_empty() {
                return Err("--faults needs at least one of kill, pause, silence, restart".into());
            }
            if self.plot.is_some() {
                return Err(
                    "--plot draws a storm of -n requests, not a fault storm (--chaos)".into(),
                );
            }
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
