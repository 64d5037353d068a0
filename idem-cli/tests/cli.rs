//! The real `idem` binary against SQLite (a temp file), MariaDB (`IDEM_MYSQL_URL`), Postgres
//! (`IDEM_PG_URL`) and Redis (`IDEM_REDIS_URL`): every command on each, on records made through
//! the library in a table, file or key prefix of the test's own (dropped after, also when the test
//! fails); and `idem release` racing a takeover claim, one winner each time. A server that cannot
//! be reached is one skip line, or a failure under `IDEM_REQUIRE_SERVICES=1`.

#[path = "../../idem-suite/tests/contract/server.rs"]
mod server;

use std::process::{Command, Output};
use std::time::Duration;

use idem::{Acquired, Call, Claim, ClaimOutcome, ClaimRequest, IdemError, Status, Store};

/// One store under test: its URL (with the test's own table or prefix) and how to clean up.
struct Target {
    name: &'static str,
    url: String,
    /// The records' table (SQL servers) or key prefix (Redis), for the DDL and the clean-up.
    place: String,
    _cleanup: Cleanup,
}

/// Drops the test's tables or keys when dropped, even when the test panicked.
enum Cleanup {
    /// The temp folder, deleted with it.
    File(#[allow(dead_code)] tempfile::TempDir),
    MySql {
        base: String,
        table: String,
    },
    Postgres {
        base: String,
        table: String,
    },
    Redis {
        base: String,
        prefix: String,
    },
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let work = match self {
            Cleanup::File(_) => return,
            Cleanup::MySql { base, table } => {
                let (base, table) = (base.clone(), table.clone());
                Box::new(move || drop_tables(&base, &table, true)) as Box<dyn FnOnce() + Send>
            }
            Cleanup::Postgres { base, table } => {
                let (base, table) = (base.clone(), table.clone());
                Box::new(move || drop_tables(&base, &table, false))
            }
            Cleanup::Redis { base, prefix } => {
                let (base, prefix) = (base.clone(), prefix.clone());
                Box::new(move || delete_keys(&base, &prefix))
            }
        };
        // A thread of its own: this may run inside the test's runtime, or while it unwinds.
        let _ = std::thread::spawn(work).join();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn drop_tables(base: &str, table: &str, mysql: bool) {
    use idem::sqlx::{AssertSqlSafe, raw_sql};
    runtime().block_on(async {
        for t in [table.to_owned(), format!("{table}_tok")] {
            let sql = if mysql {
                format!("DROP TABLE IF EXISTS `{t}`")
            } else {
                format!("DROP TABLE IF EXISTS \"{t}\"")
            };
            if mysql {
                if let Ok(pool) = idem::sqlx::MySqlPool::connect(base).await {
                    let _ = raw_sql(AssertSqlSafe(sql)).execute(&pool).await;
                }
            } else if let Ok(pool) = idem::sqlx::PgPool::connect(base).await {
                let _ = raw_sql(AssertSqlSafe(sql)).execute(&pool).await;
            }
        }
    });
}

fn delete_keys(base: &str, prefix: &str) {
    runtime().block_on(async {
        let Ok(client) = ::redis::Client::open(base) else {
            return;
        };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
            return;
        };
        let keys: Vec<String> = ::redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        for key in keys {
            let _: Result<i64, _> = ::redis::cmd("DEL").arg(key).query_async(&mut conn).await;
        }
    });
}

async fn sqlite() -> Option<Target> {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("idem.db").display());
    Some(Target {
        name: "sqlite",
        url,
        place: "idem_record".to_owned(),
        _cleanup: Cleanup::File(dir),
    })
}

async fn mysql() -> Option<Target> {
    let base = server::url("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
    // `idem_<…>_<pid>_<n>`: the MySQL suites drop such tables once this process is gone.
    let table = server::unique("idem_cli");
    let url = format!("{base}?idem_table={table}");
    server::reach("MariaDB", &base, idem::connect(&url)).await?;
    Some(Target {
        name: "mysql",
        url,
        place: table.clone(),
        _cleanup: Cleanup::MySql { base, table },
    })
}

async fn postgres() -> Option<Target> {
    let base = server::url("IDEM_PG_URL", "postgres://postgres@127.0.0.1:5432/test");
    // `idemt_<pid>_<n>`: the Postgres suites drop such tables once this process is gone.
    let table = server::unique("idemt");
    let url = format!("{base}?idem_table={table}");
    server::reach("Postgres", &base, idem::connect(&url)).await?;
    Some(Target {
        name: "postgres",
        url,
        place: table.clone(),
        _cleanup: Cleanup::Postgres { base, table },
    })
}

async fn redis_target() -> Option<Target> {
    let base = server::url("IDEM_REDIS_URL", "redis://127.0.0.1:6379");
    let prefix = format!("{}:", server::unique("idemcli"));
    let url = format!("{base}?idem_prefix={}", prefix.replace(':', "%3A"));
    server::reach("Redis", &base, idem::connect(&url)).await?;
    Some(Target {
        name: "redis",
        url,
        place: prefix.clone(),
        _cleanup: Cleanup::Redis { base, prefix },
    })
}

/// What a run of the binary gave.
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn ran(out: Output) -> Ran {
    Ran {
        code: out.status.code().expect("exited"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn idem_cmd(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.env_remove("IDEM_STORE_URL")
        .arg("--url")
        .arg(url)
        .args(args);
    cmd
}

/// Runs `idem --url URL args…` to its end (off the async threads).
async fn idem(url: &str, args: &[&str]) -> Ran {
    let mut cmd = idem_cmd(url, args);
    tokio::task::spawn_blocking(move || ran(cmd.output().unwrap()))
        .await
        .unwrap()
}

fn req<'a>(biz: &'a str, key: &'a str, lease: Duration, ttl: Duration) -> ClaimRequest<'a> {
    ClaimRequest {
        biz,
        key,
        fingerprint: None,
        lease,
        ttl,
    }
}

async fn acquire(store: &dyn Store, r: &ClaimRequest<'_>) -> (Claim, Acquired) {
    match store.claim(r).await.unwrap() {
        ClaimOutcome::Acquired { claim, how } => (claim, how),
        other => panic!("expected to acquire ({}, {}), got {other:?}", r.biz, r.key),
    }
}

const HOUR: Duration = Duration::from_secs(3600);

/// The fingerprint the HTTP layer keeps for a request to the route `POST /orders/{id}`: the route,
/// then the digest.
const LAYER_FINGERPRINT: &str =
    "POST /orders/{id} 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A PROCESSING record whose lease ended now (its holder gave it up without finishing): stuck.
/// Its fingerprint is an HTTP layer request's, so the listing shows where it came from.
async fn stuck_record(store: &dyn Store, biz: &str, key: &str) -> Claim {
    let mut r = req(biz, key, Duration::from_secs(60), HOUR);
    r.fingerprint = Some(LAYER_FINGERPRINT);
    let (claim, _) = acquire(store, &r).await;
    store.release(biz, key, &claim).await.unwrap();
    claim
}

/// `ms` to the second as RFC 3339 UTC starts it (`2026-12-01T17:14:35`), from `date`.
fn rfc3339_prefix(ms: i64) -> String {
    let out = Command::new("date")
        .args(["-u", "-d", &format!("@{}", ms / 1000), "+%Y-%m-%dT%H:%M:%S"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The numbers of `biz`'s row of `idem stats`: PROCESSING, SUCCEEDED, FAILED, TOTAL, TOMBSTONES.
fn stats_row(out: &str, biz: &str) -> Option<Vec<u64>> {
    out.lines().find_map(|line| {
        let mut cells = line.split_whitespace();
        (cells.next() == Some(biz)).then(|| cells.map(|c| c.parse().unwrap()).collect())
    })
}

/// Every command of the binary on one store, each outcome checked against the store itself.
async fn every_command(t: Target) {
    let url = t.url.as_str();
    let sql = t.name != "redis";
    eprintln!("{}: {}", t.name, url);

    // migrate --print, without connecting: the DDL with the test's table, or none.
    let out = idem(url, &["migrate", "--print"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    if sql {
        assert!(out.stdout.contains("CREATE TABLE IF NOT EXISTS"), "{out:?}");
        assert!(out.stdout.contains(&t.place), "{out:?}");
    } else {
        assert!(out.stdout.contains("no DDL"), "{out:?}");
    }
    // migrate: applied, and the store works afterwards.
    let out = idem(url, &["migrate"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let said = if sql {
        "migrated: "
    } else {
        "nothing to migrate"
    };
    assert!(out.stdout.starts_with(said), "{out:?}");
    let store = idem::connect(url).await.unwrap();

    let out = idem(url, &["stats"]).await;
    assert_eq!(
        (out.code, out.stdout.starts_with("no records")),
        (0, true),
        "{out:?}"
    );

    // The records, made through the library.
    let (a, b) = (server::unique("CLI_A"), server::unique("CLI_B"));
    let done: String = Call::new(a.clone(), "done")
        .fingerprint(&("done", 7))
        .run(&store, async { Ok::<_, IdemError>("receipt-7".to_owned()) })
        .await
        .unwrap();
    assert_eq!(done, "receipt-7");
    let failed: Result<String, IdemError> = Call::new(a.clone(), "failed")
        .run(&store, async { Err(IdemError::store("declined")) })
        .await;
    assert!(failed.is_err());
    let stuck = stuck_record(&store, &a, "stuck").await;
    let (live, _) = acquire(&store, &req(&b, "live", Duration::from_secs(600), HOUR)).await;

    // stats: the aligned table with totals.
    let out = idem(url, &["stats"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.lines().next().unwrap().split_whitespace().eq([
            "BIZ",
            "PROCESSING",
            "SUCCEEDED",
            "FAILED",
            "TOTAL",
            "TOMBSTONES"
        ]),
        "{out:?}"
    );
    assert_eq!(
        stats_row(&out.stdout, &a),
        Some(vec![1, 1, 1, 3, 0]),
        "{out:?}"
    );
    assert!(
        out.stdout.lines().any(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            l.starts_with("  POST /orders/{id} ") && cells[2..] == ["1", "0", "0", "1", "0"]
        }),
        "the stuck layer record counted under its route: {out:?}"
    );
    assert_eq!(
        stats_row(&out.stdout, &b),
        Some(vec![1, 0, 0, 1, 0]),
        "{out:?}"
    );
    assert_eq!(
        stats_row(&out.stdout, "total"),
        Some(vec![2, 1, 1, 4, 0]),
        "{out:?}"
    );

    // inspect.
    let rec = store.load(&a, "done").await.unwrap().unwrap();
    let out = idem(url, &["inspect", &a, "done"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let fp = rec.fingerprint.clone().unwrap();
    for line in [
        "status       SUCCEEDED".to_owned(),
        "attempt      1".to_owned(),
        format!("fence        {}", rec.fence),
        format!("fingerprint  present ({})", &fp[..12]),
        format!(
            "result       {} bytes",
            rec.snapshot.as_ref().unwrap().len()
        ),
        "steps        absent".to_owned(),
    ] {
        assert!(out.stdout.lines().any(|l| l == line), "{line:?} in {out:?}");
    }
    assert!(
        !out.stdout.contains("request "),
        "no route for a record that is not the HTTP layer's: {out:?}"
    );
    let expiry = format!("expires at   {}.", rfc3339_prefix(rec.expire_at_ms));
    let line = out.stdout.lines().find(|l| l.starts_with("expires at"));
    assert!(
        line.is_some_and(|l| l.starts_with(&expiry) && l.ends_with("Z (in 6d23h)")),
        "{expiry:?} in {out:?}"
    );
    assert!(
        !out.stdout.contains("receipt-7"),
        "the result only when asked: {out:?}"
    );
    let out = idem(url, &["inspect", &a, "done", "--show-result"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("receipt-7"), "{out:?}");
    let out = idem(url, &["inspect", &a, "absent"]).await;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.starts_with("no record"), "{out:?}");

    // inspect by what an HTTP layer's client sent: its caller and its Idempotency-Key.
    let layer_key = idem::http_record_key(Some("alice"), "order-77").unwrap();
    Call::new(a.clone(), &layer_key)
        .run(&store, async { Ok::<_, IdemError>(1u8) })
        .await
        .unwrap();
    let out = idem(
        url,
        &["inspect", &a, "\"order-77\"", "--principal", "alice"],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.starts_with(&format!(
            "HTTP layer key \"\\\"order-77\\\"\" of principal \"alice\": record {layer_key}"
        )) && out.stdout.contains("status       SUCCEEDED"),
        "{out:?}"
    );
    let out = idem(url, &["inspect", &a, "order-77", "--principal", "bob"]).await;
    assert_eq!(out.code, 1, "another caller's key: {out:?}");
    assert!(out.stdout.contains("no record"), "{out:?}");
    let out = idem(url, &["inspect", &a, "two words", "--http"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("Idempotency-Key"), "{out:?}");

    // stuck: the ended lease, not the live one.
    let out = idem(url, &["stuck"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let listed: Vec<&str> = out.stdout.lines().skip(1).collect();
    assert!(listed[0].starts_with(&format!("{a}  stuck")), "{out:?}");
    assert!(listed[0].contains(&stuck.fence.to_string()), "{out:?}");
    assert!(
        listed[0].ends_with("ago)  POST /orders/{id}"),
        "the layer record's method and route: {out:?}"
    );
    assert!(
        out.stdout.lines().next().unwrap().ends_with("  REQUEST"),
        "{out:?}"
    );
    let out = idem(url, &["inspect", &a, "stuck"]).await;
    assert!(
        out.stdout
            .lines()
            .any(|l| l == "request      POST /orders/{id}")
            && out
                .stdout
                .lines()
                .any(|l| l == "fingerprint  present (0123456789ab)"),
        "{out:?}"
    );
    assert!(!out.stdout.contains("live"), "{out:?}");
    assert_eq!(
        listed.last(),
        Some(&"1 stuck record (PROCESSING past their lease)")
    );
    let out = idem(url, &["stuck", "--biz", &b, "--limit", "5"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.starts_with("no stuck records"), "{out:?}");
    for bad in ["0", "10001", "x"] {
        let out = idem(url, &["stuck", "--limit", bad]).await;
        assert_eq!(out.code, 2, "{out:?}");
        assert!(out.stderr.contains("--limit"), "{out:?}");
    }
    let out = idem(url, &["stuck", "--limit", "0"]).await;
    assert!(
        out.stderr.contains("1..=10000"),
        "the range is told: {out:?}"
    );

    // release: refusals change nothing.
    let before = store.load(&a, "done").await.unwrap();
    let out = idem(
        url,
        &["release", &a, "done", "--reason", "INC-7", "--force"],
    )
    .await;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stdout.starts_with("refused: the record SUCCEEDED"),
        "{out:?}"
    );
    assert_eq!(
        store.load(&a, "done").await.unwrap(),
        before,
        "a success is never touched"
    );
    let out = idem(url, &["release", &b, "live", "--reason", "INC-7"]).await;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stdout.starts_with("refused: the record is PROCESSING"),
        "{out:?}"
    );
    assert!(out.stdout.contains("--force"), "{out:?}");
    let out = idem(url, &["release", &a, "absent", "--reason", "INC-7"]).await;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.starts_with("not found"), "{out:?}");
    for bad in ["", "two\nlines", &"x".repeat(201)] {
        let out = idem(url, &["release", &a, "stuck", "--reason", bad]).await;
        assert_eq!(out.code, 2, "{bad:?}: {out:?}");
        assert!(out.stderr.contains("1 to 200 bytes"), "{out:?}");
    }
    let out = idem(url, &["release", &a, "stuck"]).await;
    assert_eq!(out.code, 2, "--reason is required: {out:?}");
    let rec = store.load(&a, "stuck").await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.fence),
        (Status::Processing, stuck.fence),
        "unchanged"
    );

    // release: the stuck claim's lease ends, under its fence, and stays PROCESSING; the next call
    // takes it over and asks its recover fn, which finds the effect: the body does not run.
    let out = idem(
        url,
        &["release", &a, "stuck", "--reason", "INC-7: worker died"],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.starts_with(&format!(
            "released: was PROCESSING (attempt 1, fence {}), its lease ended now",
            stuck.fence
        )) && out.stdout.contains("asks its recover fn"),
        "{out:?}"
    );
    let rec = store.load(&a, "stuck").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.fence), (Status::Processing, stuck.fence));
    let (rerun, report) = idem::metrics::observe(
        Call::new(a.clone(), "stuck")
            .recover(|| async { Ok::<_, IdemError>(Some(7u8)) })
            .run(&store, async { Ok::<_, IdemError>(1u8) }),
    )
    .await;
    assert_eq!(rerun.unwrap(), 7, "the recovered result, not a second run");
    let report = report.unwrap();
    assert_eq!(
        (report.outcome, report.attempt),
        (idem::metrics::Outcome::Recovered, 2)
    );
    // --mark-failed of a FAILED record: nothing to do.
    let out = idem(
        url,
        &[
            "release",
            &a,
            "failed",
            "--reason",
            "INC-7",
            "--mark-failed",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.starts_with("already released"), "{out:?}");
    // --force --mark-failed on a live lease: FAILED under its fence, with the warning; its
    // holder's mark is then refused, and the next call runs the body again.
    let out = idem(
        url,
        &[
            "release",
            &b,
            "live",
            "--reason",
            "INC-8",
            "--force",
            "--mark-failed",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.starts_with("marked FAILED: was PROCESSING")
            && out.stdout.contains("WITHOUT asking recover"),
        "{out:?}"
    );
    assert_eq!(
        store.load(&b, "live").await.unwrap().unwrap().status,
        Status::Failed
    );
    let late = store.complete(&b, "live", &live, b"\"late\"", HOUR).await;
    assert!(matches!(late, Err(IdemError::LeaseLost { .. })), "{late:?}");

    // sweep: expired records (and tokens), then none.
    for bad in ["0", "10001"] {
        let out = idem(url, &["sweep", "--batch", bad]).await;
        assert_eq!(out.code, 2, "{out:?}");
        assert!(out.stderr.contains("1..=10000"), "{out:?}");
    }
    let tokens = store.tokens().unwrap();
    let tiny = Duration::from_millis(1);
    // A lease long enough for the mark to land on a slow machine (a 1 ms lease could end before
    // it, and Redis would expire the key), a life of 1 ms: expired once marked.
    let lease = Duration::from_millis(500);
    for key in ["e1", "e2", "e3"] {
        let (c, _) = acquire(&store, &req(&b, key, lease, tiny)).await;
        store.complete(&b, key, &c, b"1", tiny).await.unwrap();
        tokens.issue(tiny, None).await.unwrap();
    }
    // Not an assertion on time: only so the lives (and Redis's keys, which last the lease) are
    // over by every clock.
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let out = idem(url, &["sweep", "--batch", "1", "--tokens"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let count = |what: &str| -> u64 {
        let line = out
            .stdout
            .lines()
            .find(|l| l.ends_with(what))
            .unwrap_or_else(|| panic!("{what} in {out:?}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    if sql {
        // Redis expires them by itself: whatever is left for the sweep.
        assert_eq!(count("expired records"), 3, "{out:?}");
        assert_eq!(count("expired tokens"), 3, "{out:?}");
    }
    assert!(out.stderr.is_empty(), "no spinner off a terminal: {out:?}");
    for key in ["e1", "e2", "e3"] {
        assert!(store.load(&b, key).await.unwrap().is_none(), "{key} swept");
    }
    let out = idem(url, &["sweep"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, "swept 0 expired records\n", "{out:?}");

    // stats again: what the commands did.
    let out = idem(url, &["stats"]).await;
    assert_eq!(
        stats_row(&out.stdout, &a),
        Some(vec![0, 3, 1, 4, 0]),
        "{out:?}"
    );
    assert_eq!(
        stats_row(&out.stdout, &b),
        Some(vec![0, 0, 1, 1, 0]),
        "{out:?}"
    );

    // A result kept 1 ms under a key kept an hour: a tombstone in stats and inspect, whose
    // result a sweep drops.
    let c = server::unique("CLI_C");
    let kept: String = Call::new(c.clone(), "gone")
        .ttl(HOUR)
        .result_ttl(Duration::from_millis(1))
        .run(&store, async { Ok::<_, IdemError>("receipt-9".to_owned()) })
        .await
        .unwrap();
    assert_eq!(kept, "receipt-9");
    // Not an assertion on time: only so the result's 1 ms is over by every clock.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let out = idem(url, &["stats"]).await;
    assert_eq!(
        stats_row(&out.stdout, &c),
        Some(vec![0, 1, 0, 1, 1]),
        "{out:?}"
    );
    assert!(
        out.stdout.contains("TOMBSTONES: succeeded records"),
        "{out:?}"
    );
    let out = idem(url, &["inspect", &c, "gone"]).await;
    let line = out.stdout.lines().find(|l| l.starts_with("result kept"));
    assert!(
        line.is_some_and(
            |l| l.ends_with("(passed: a tombstone, repeats refused as result expired)")
        ),
        "{out:?}"
    );
    let out = idem(url, &["sweep"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let out = idem(url, &["inspect", &c, "gone", "--show-result"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.contains("result kept  no: dropped")
            && out
                .stdout
                .contains("(no result: it was dropped when its result ttl passed)")
            && !out.stdout.contains("receipt-9"),
        "{out:?}"
    );
}

/// `idem release --mark-failed` through the binary while a takeover claims the same ended lease,
/// many times: either the release won (FAILED under the old fence; the claim then ran as a retry)
/// or the takeover did (the release refused or lost, nothing changed by it); never both, and the
/// new holder's mark succeeds.
async fn release_races_a_takeover(t: Target) {
    let url = t.url.as_str();
    let store = idem::connect(url).await.unwrap();
    store.migrate().await.unwrap();
    let biz = server::unique("CLI_RACE");
    const TRIALS: u64 = 12;
    let (mut released, mut beaten) = (0, 0);
    for i in 0..TRIALS {
        let key = format!("k{i}");
        let old = stuck_record(&store, &biz, &key).await;
        let child = idem_cmd(
            url,
            &["release", &biz, &key, "--reason", "race", "--mark-failed"],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
        // Spread the claim over the binary's start, read and write (no assertion on time).
        tokio::time::sleep(Duration::from_millis(i * 2)).await;
        let (new, how) = acquire(&store, &req(&biz, &key, Duration::from_secs(60), HOUR)).await;
        let out = tokio::task::spawn_blocking(move || ran(child.wait_with_output().unwrap()))
            .await
            .unwrap();
        assert!(new.fence > old.fence, "{key}");
        match (out.code, how) {
            (0, Acquired::RetryAfterFailure) => {
                released += 1;
                assert!(out.stdout.starts_with("marked FAILED: "), "{key}: {out:?}");
                assert!(
                    out.stdout.contains(&format!("fence {}", old.fence)),
                    "{out:?}"
                );
            }
            (1, Acquired::TakeOver) => {
                beaten += 1;
                assert!(
                    out.stdout.starts_with("lost the race")
                        || out.stdout.starts_with("refused: the record is PROCESSING"),
                    "{key}: {out:?}"
                );
                assert!(
                    out.stdout.contains(&format!("fence {}", new.fence)),
                    "{out:?}"
                );
            }
            other => panic!("{key}: two winners or none: {other:?}, {out:?}"),
        }
        let rec = store.load(&biz, &key).await.unwrap().unwrap();
        assert_eq!(
            (rec.status, rec.fence),
            (Status::Processing, new.fence),
            "{key}: never FAILED under the new holder's fence"
        );
        store
            .complete(&biz, &key, &new, b"\"new\"", HOUR)
            .await
            .unwrap();
        let late = store.complete(&biz, &key, &old, b"\"old\"", HOUR).await;
        assert!(
            matches!(late, Err(IdemError::LeaseLost { .. })),
            "{key}: {late:?}"
        );
    }
    eprintln!(
        "{}: the release won {released}, the takeover {beaten}",
        t.name
    );
}

macro_rules! on_every_store {
    ($($name:ident => $target:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn every_command() {
                if let Some(t) = super::$target().await {
                    super::every_command(t).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn release_races_a_takeover() {
                if let Some(t) = super::$target().await {
                    super::release_races_a_takeover(t).await;
                }
            }
        }
    )*};
}

on_every_store!(
    sqlite => sqlite,
    mariadb => mysql,
    postgres => postgres,
    redis => redis_target,
);

/// What needs no server: help, a missing or bad URL, an unreachable one, a password kept out.
#[tokio::test]
async fn usage_errors_and_the_exit_codes_are_told() {
    let help = ran(Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("--help")
        .output()
        .unwrap());
    assert_eq!(help.code, 0, "{help:?}");
    for says in [
        "Exit status",
        "  1  refused",
        "  2  usage",
        "  3  store error",
        "IDEM_STORE_URL",
    ] {
        assert!(help.stdout.contains(says), "{says:?} in {help:?}");
    }
    for command in ["migrate", "inspect", "stuck", "release", "sweep", "stats"] {
        assert!(help.stdout.contains(command), "{command} in {help:?}");
    }
    let out = ran(Command::new(env!("CARGO_BIN_EXE_idem"))
        .env_remove("IDEM_STORE_URL")
        .arg("stats")
        .output()
        .unwrap());
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("IDEM_STORE_URL"), "{out:?}");
    // The URL from the environment.
    let dir = tempfile::tempdir().unwrap();
    let out = ran(Command::new(env!("CARGO_BIN_EXE_idem"))
        .env(
            "IDEM_STORE_URL",
            format!("sqlite:{}", dir.path().join("env.db").display()),
        )
        .arg("migrate")
        .output()
        .unwrap());
    assert_eq!(out.code, 0, "{out:?}");
    // A URL idem cannot open: connect's error, naming the schemes.
    let out = idem("gopher://u:hunter2@h/x", &["stats"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    for scheme in [
        "memory:",
        "sqlite:PATH",
        "mysql://",
        "postgres://",
        "redis://",
        "sharded:",
    ] {
        assert!(out.stderr.contains(scheme), "{scheme} in {out:?}");
    }
    assert!(!out.stderr.contains("hunter2"), "{out:?}");
    let out = idem("memory:", &["migrate", "--print"]).await;
    assert_eq!(
        (out.code, out.stdout.contains("no DDL")),
        (0, true),
        "{out:?}"
    );
    // The store timeout: refused out of its range, before anything is opened...
    for bad in ["0s", "5", "25h", "s"] {
        let out = idem("memory:", &["--store-timeout", bad, "stats"]).await;
        assert_eq!(out.code, 2, "--store-timeout {bad}: {out:?}");
        assert!(out.stderr.contains("store-timeout"), "{out:?}");
    }
    // ...and a server that accepts and never answers is a store error once it has run out.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("postgres://postgres@{}/test", silent.local_addr().unwrap());
    let started = std::time::Instant::now();
    let out = idem(&url, &["--store-timeout", "300ms", "stats"]).await;
    let took = started.elapsed();
    assert_eq!(out.code, 3, "{out:?}");
    assert!(out.stderr.contains("--store-timeout"), "{out:?}");
    assert!(
        took < std::time::Duration::from_secs(4),
        "answered after {took:?}"
    );
    drop(silent);
    // Unreachable: a store error, without the password.
    let out = idem("redis://:hunter2@127.0.0.1:1", &["stats"]).await;
    assert_eq!(out.code, 3, "{out:?}");
    assert!(out.stderr.starts_with("error: "), "{out:?}");
    assert!(!out.stderr.contains("hunter2"), "{out:?}");
    // A store that cannot do what is asked: a store error too.
    let out = idem("sharded:memory:|memory:", &["sweep", "--tokens"]).await;
    assert_eq!(out.code, 3, "{out:?}");
    assert!(out.stderr.contains("does not support"), "{out:?}");
}
