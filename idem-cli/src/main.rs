//! `idem`: the operator CLI of idem, as sqlx-cli is for sqlx. It opens any store URL
//! [`idem::connect`] takes (`--url`, or `IDEM_STORE_URL`) and runs what operators otherwise write
//! SQL or Lua for, through [`idem::admin`] and the [`idem::Store`] trait, never around them:
//!
//! | command | what it does |
//! |---|---|
//! | `idem migrate [--print] [URL]` | applies the schema ([`idem::AnyStore::migrate`]), or prints the DDL for the URL's backend without connecting ([`idem::connect::migrations`]); the URL here or as `--url` |
//! | `idem inspect BIZ KEY [--show-result]` | a record's status, attempt, fence, lease end and expiry, fingerprint, sizes, and for an HTTP layer record the method and route it came from; the result with `--show-result` |
//! | `idem stuck [--biz B] [--limit N]` | PROCESSING records whose lease ended, with the method and route of HTTP layer records ([`idem::admin::stuck_all`]); not those under a live lease, which no store lists (`inspect` shows one, `stats` counts them) |
//! | `idem release BIZ KEY --reason TEXT [--force]` | ends a stuck claim's lease (fenced), so the next call takes it over and asks its recover fn ([`idem::admin::release`]); with `--force` a live one too, and says so |
//! | `idem inspect HTTP KEY --principal P` (or `--http`), the same on `release` and for `GRPC` | KEY is the `Idempotency-Key` caller P sent to the HTTP (or gRPC) layer: the record is found under the layer's hash of both ([`idem::key::http_record_key`]) |
//! | `idem release … --mark-failed` | a fenced move to FAILED instead: the next call runs the body again without asking recover; only when the effect is known not to have happened ([`idem::admin::mark_failed`]) |
//! | `idem sweep [--batch N] [--tokens]` | deletes expired records (and submit tokens) ([`idem::admin::sweep`]) |
//! | `idem stats` | records per business type and status, and per method and route for HTTP layer records ([`idem::Store::stats`]) |
//!
//! Exit status: `0` done; `1` refused, not found, or lost a race (a `release` that another attempt
//! beat, a `release` of a success or of a live lease, an `inspect` of an absent key); `2` usage (a
//! bad flag or value, as clap reports it, or a store URL idem cannot open, such as a `postgres://`
//! URL on another server's port); `3` a store error (the
//! server is unreachable, the table is missing, the store cannot do what was asked).
//!
//! Times are shown as RFC 3339 UTC and relative to this machine's clock ("in 12s", "ended 3m
//! ago"); the store judges leases by its own clock, which may differ from this one.

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches as _, Parser, Subcommand};
use idem::admin::{self, Release};
use idem::{AnyStore, IdemError, Store};

#[cfg(test)]
mod printed;
mod record;
mod reshard;
mod table;
mod time;
use record::{LayerKey, inspect, release, stuck};
use table::stats;
use time::store_timeout;

const LONG_ABOUT: &str = "\
The operator CLI of idem: inspect a key, list and release stuck claims, sweep expired records, \
count records per status, apply or print the schema, on any store URL idem can open \
(memory:, sqlite:PATH, mysql://, mariadb://, postgres://, redis://, redis+cluster://, \
sharded:URL|URL, and dynamodb://TABLE when built with the feature `dynamodb`; options idem_table=NAME, idem_token_table=NAME and idem_prefix=P as for \
idem::connect).

Exit status:
  0  done
  1  refused, not found, or lost a race (release of a success, of a live lease without --force, \
or beaten by a takeover; inspect of an absent key)
  2  usage: a bad flag or value, or a store URL idem cannot open (an unknown scheme or option, \
a server that does not speak the URL's protocol)
  3  store error: unreachable, not migrated, or not supported by the store

Times are RFC 3339 UTC and relative to this machine's clock; the store judges leases by its own.";

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "idem", version, about = "The operator CLI of idem", long_about = LONG_ABOUT)]
struct Cli {
    /// The store, any URL idem::connect takes (its password is never printed)
    #[arg(long, env = "IDEM_STORE_URL", global = true, hide_env_values = true)]
    url: Option<String>,

    /// The longest the command may wait for the store, connecting included: a number and a
    /// unit, ms, s, m or h, from 1ms to 24h (a store that does not answer in time is a store
    /// error, exit 3)
    #[arg(long, global = true, default_value = "60s", value_parser = store_timeout)]
    store_timeout: Duration,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the store's tables and indexes if missing (SQL stores), or print their DDL
    Migrate {
        /// Print the DDL for the URL's backend and tables instead, without connecting
        #[arg(long)]
        print: bool,
        /// The store URL, here instead of --url (`idem migrate --print URL`); it wins over
        /// IDEM_STORE_URL, and --url with another URL is refused
        #[arg(value_name = "URL")]
        store_url: Option<String>,
    },
    /// Show one record: status, attempt, fence, lease end, expiry, fingerprint, sizes
    Inspect {
        /// Business type
        biz: String,
        /// Idempotency key (with --principal or --http: the Idempotency-Key a client sent)
        key: String,
        #[command(flatten)]
        layer: LayerKey,
        /// Also print the stored result (UTF-8 text as is, other bytes as hex)
        #[arg(long)]
        show_result: bool,
    },
    /// List PROCESSING records whose lease ended, oldest lease first
    ///
    /// Records PROCESSING under a lease still running are not listed: no store lists them. A
    /// record whose holder crashed is listed once its lease ends; until then `idem stats` counts
    /// it (PROCESSING) and `idem inspect BIZ KEY` shows it, and `idem release BIZ KEY --reason
    /// TEXT --force` ends its lease early when its holder is known dead.
    Stuck {
        /// Only this business type (default: every business type the store holds)
        #[arg(long)]
        biz: Option<String>,
        /// At most this many records, 1..=10000
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        limit: u64,
    },
    /// End a stuck PROCESSING record's lease (fenced): the next call takes it over and asks its
    /// recover fn before running the body, so an effect that happened is found, not repeated
    ///
    /// Rarely needed: a lease that ends by itself needs no release. The next call with the key
    /// takes an ended lease over by itself (and asks its recover fn first), and a running
    /// reconciler resolves it. Release is for not waiting: with --force it ends a lease that still
    /// runs, when its holder is known dead, so the next call (or the reconciler) recovers the
    /// record now; with --mark-failed the next call runs the body again without asking recover,
    /// for an effect known not to have happened.
    ///
    /// A holder that is in fact still running is not stopped: once the record is taken over (or
    /// marked FAILED), its mark is refused by the fence, and unless recover finds its effect, the
    /// effect may happen twice.
    Release {
        /// Business type
        biz: String,
        /// Idempotency key (with --principal or --http: the Idempotency-Key a client sent)
        key: String,
        #[command(flatten)]
        layer: LayerKey,
        /// Why (1 to 200 bytes, no control characters); logged with the business type and fence
        #[arg(long, value_parser = reason)]
        reason: String,
        /// Release even while the lease is still running: only when its holder is known dead (if it
        /// still runs, its mark is refused once the record is taken over)
        #[arg(long)]
        force: bool,
        /// Mark the record FAILED instead: the next call runs the body AGAIN without asking
        /// recover. WARNING: only when you know its effect did not happen (a worker that died
        /// mid-call may have paid already: release it without this flag)
        #[arg(long)]
        mark_failed: bool,
    },
    /// Delete expired records (and with --tokens expired submit tokens), batch by batch; drop
    /// the results kept past their result ttl (counted with the records)
    Sweep {
        /// Rows per delete statement, 1..=10000
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        batch: u64,
        /// Also sweep the submit tokens of the same store
        #[arg(long)]
        tokens: bool,
    },
    /// Count records per business type and status
    Stats,
    /// Move a sharded store's keys to another list of shards while it serves (grow, shrink,
    /// replace): --url is the list keys are routed over now, TO_URL the new one
    ///
    /// Every process of the service must be given every shard of both lists before the keys
    /// move (deploy the new list first, or run with --plan-only, then deploy): a process that
    /// lacks a shard refuses the keys that move to or from it. Run it again after an
    /// interruption: it goes on from the step the shards hold.
    Reshard {
        /// The new list: a sharded URL (sharded:URL|URL|…)
        #[arg(value_name = "TO_URL", required_unless_present = "status")]
        to: Option<String>,
        /// Keys per page of the copy, 1..=1000
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=1000))]
        batch: u64,
        /// How long to wait after each step for every process to read it: 3s ..= 3600s
        #[arg(long, default_value = "3s", value_parser = reshard::settle)]
        settle: Duration,
        /// Write the planned step only: nothing moves yet
        #[arg(long)]
        plan_only: bool,
        /// Print the layout step the shards hold and change nothing
        #[arg(long, conflicts_with_all = ["plan_only"])]
        status: bool,
    },
}

/// `--reason`, checked as `idem::admin` checks it, before anything is opened.
fn reason(text: &str) -> Result<String, String> {
    admin::check_reason(text)
        .map(|()| text.to_owned())
        .map_err(|e| match e {
            IdemError::InvalidOptions { reason } => reason,
            other => other.to_string(),
        })
}

/// How a command ended: its exit status.
pub(crate) enum Exit {
    Ok,
    /// Refused, not found, lost a race.
    Refused,
    /// A store URL idem cannot open.
    Usage,
    /// The store failed.
    Store,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(match exit {
            Exit::Ok => 0,
            Exit::Refused => 1,
            Exit::Usage => 2,
            Exit::Store => 3,
        })
    }
}

/// The store URL: `migrate`'s own, else `--url` (or `IDEM_STORE_URL`); `migrate URL` with a
/// different `--url` on the command line is refused (IDEM_STORE_URL gives way to it).
fn store_url(cli: &Cli, from_command_line: bool) -> Result<String, clap::Error> {
    let own = match &cli.command {
        Command::Migrate { store_url, .. } => store_url.as_ref(),
        _ => None,
    };
    match (own, &cli.url) {
        (Some(own), Some(url)) if from_command_line && own != url => Err(Cli::command().error(
            clap::error::ErrorKind::ArgumentConflict,
            "two store URLs: give the URL once, as --url URL or after `migrate`",
        )),
        (Some(own), _) => Ok(own.clone()),
        (None, Some(url)) => Ok(url.clone()),
        (None, None) => Err(Cli::command().error(
            clap::error::ErrorKind::MissingRequiredArgument,
            if matches!(cli.command, Command::Migrate { .. }) {
                "the store URL is missing: give it after `migrate` (idem migrate --print URL), as \
                 --url URL, or set IDEM_STORE_URL"
            } else {
                "the store URL is missing: give --url URL or set IDEM_STORE_URL"
            },
        )),
    }
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let from_command_line =
        matches.value_source("url") == Some(clap::parser::ValueSource::CommandLine);
    let url = store_url(&cli, from_command_line).unwrap_or_else(|e| e.exit());
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return Exit::Store.into();
        }
    };
    // A reshard runs as long as its copy and its settle times take.
    let timeout = match cli.command {
        Command::Reshard { .. } => Duration::MAX,
        _ => cli.store_timeout,
    };
    runtime
        .block_on(async {
            match tokio::time::timeout(timeout, run(cli.command, &url)).await {
                Ok(exit) => exit,
                Err(_) => {
                    eprintln!(
                        "error: the store did not answer within --store-timeout {timeout:?} \
                         (unreachable, or a network gone silent); a change it had sent may or may not \
                         have landed: inspect before trying again"
                    );
                    Exit::Store
                }
            }
        })
        .into()
}

/// A store error as the exit status it gives, printed.
fn failed(e: &IdemError) -> Exit {
    eprintln!("error: {e}");
    match e {
        IdemError::InvalidOptions { .. } | IdemError::InvalidKey { .. } => Exit::Usage,
        _ => Exit::Store,
    }
}

async fn run(command: Command, url: &str) -> Exit {
    if let Command::Migrate { print: true, .. } = command {
        return print_migrations(url);
    }
    let store = match idem::connect(url).await {
        Ok(store) => store,
        Err(e) => return failed(&e),
    };
    let done = match command {
        Command::Migrate { .. } => migrate(&store).await,
        Command::Inspect {
            biz,
            key,
            layer,
            show_result,
        } => match layer.record_key(&key) {
            Ok((key, line)) => inspect(&store, &biz, &key, line, show_result).await,
            Err(e) => Err(e),
        },
        Command::Stuck { biz, limit } => stuck(&store, biz.as_deref(), limit).await,
        Command::Release {
            mark_failed,
            biz,
            key,
            layer,
            reason,
            force,
        } => match layer.record_key(&key) {
            Ok((key, line)) => {
                let opts = Release {
                    reason: &reason,
                    force,
                };
                release(&store, &biz, &key, line, opts, mark_failed).await
            }
            Err(e) => Err(e),
        },
        Command::Sweep { batch, tokens } => sweep(&store, batch, tokens).await,
        Command::Stats => stats(&store).await,
        Command::Reshard {
            to,
            batch,
            settle,
            plan_only,
            status,
        } => {
            let asked = reshard::Asked {
                to,
                batch,
                settle,
                plan_only,
                status,
            };
            reshard::reshard(&store, asked).await
        }
    };
    done.unwrap_or_else(|e| failed(&e))
}

fn print_migrations(url: &str) -> Exit {
    match idem::connect::migrations(url) {
        Ok(Some(ddl)) => {
            for statement in ddl {
                println!("{}\n", statement.trim_end());
            }
            Exit::Ok
        }
        Ok(None) => {
            let scheme = url.split(':').next().unwrap_or(url);
            println!("-- a {scheme} store has no DDL: its records need no schema");
            Exit::Ok
        }
        Err(e) => failed(&e),
    }
}

async fn migrate(store: &AnyStore) -> Result<Exit, IdemError> {
    if matches!(store.backend(), "memory" | "redis" | "redis-cluster") {
        println!(
            "nothing to migrate: a {} store has no schema ({})",
            store.backend(),
            store.url()
        );
        return Ok(Exit::Ok);
    }
    store.migrate().await?;
    println!("migrated: {} ({})", store.url(), store.backend());
    Ok(Exit::Ok)
}

/// A spinner on stderr when it is a terminal, nothing otherwise.
pub(crate) fn spinner() -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

async fn sweep(store: &AnyStore, batch: u64, tokens: bool) -> Result<Exit, IdemError> {
    let batch = usize::try_from(batch).unwrap_or(usize::MAX);
    let bar = spinner();
    bar.set_message("sweeping expired records");
    let swept = admin::sweep(store, batch, |total| {
        bar.set_message(format!("deleted {total} expired records"));
    })
    .await;
    bar.finish_and_clear();
    let swept = swept?;
    println!("swept {swept} expired records");
    if tokens {
        let token_store = store.tokens()?;
        let bar = spinner();
        bar.set_message("sweeping expired tokens");
        let swept = admin::sweep_tokens(&*token_store, batch, |total| {
            bar.set_message(format!("deleted {total} expired tokens"));
        })
        .await;
        bar.finish_and_clear();
        println!("swept {} expired tokens", swept?);
    }
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::table;

    #[test]
    fn tables_align() {
        let t = table(
            &["BIZ", "N"],
            &[["PAY".into(), "7".into()], ["ORDER".into(), "12".into()]],
            &[false, true],
        );
        assert_eq!(t, "BIZ     N\nPAY     7\nORDER  12\n");
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
