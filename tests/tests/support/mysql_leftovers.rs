//! What earlier runs of the MySQL suites left behind: every test makes tables (and some make
//! databases) named `<prefix>_<pid>_<n>` (`contract::server::unique`), and nothing drops them when
//! a test ends. Once per test process, the suites drop those whose process is no longer running,
//! so the server does not fill up run after run; a concurrent run's tables (its process alive) are
//! left alone.

use idem::sqlx::{self, AssertSqlSafe, MySqlPool};

/// The pid in a name made by `unique`, with an optional `_fx` / `_pay` / `_tok` / `_orders` suffix: `idem_c_4242_7_fx`.
fn pid_of(name: &str) -> Option<u32> {
    let name = name
        .strip_suffix("_fx")
        .or_else(|| name.strip_suffix("_pay"))
        .or_else(|| name.strip_suffix("_tok"))
        .or_else(|| name.strip_suffix("_orders"))
        .unwrap_or(name);
    let mut parts = name.rsplit('_');
    let n = parts.next()?;
    let pid = parts.next()?;
    n.parse::<u32>().ok()?;
    pid.parse().ok()
}

fn gone(pid: u32) -> bool {
    !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Drops leftover `idem_*` tables of the pool's database (once per database and process), and
/// with `databases`, leftover `idem_*` databases of the server.
pub async fn drop_leftovers(pool: &MySqlPool, databases: bool) {
    static CLEANED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    // Only where /proc tells which processes run (Linux); elsewhere nothing is dropped.
    if !std::path::Path::new("/proc/self").exists() {
        return;
    }
    let Ok(Some(db)) = sqlx::query_scalar::<_, Option<String>>("SELECT DATABASE()")
        .fetch_one(pool)
        .await
    else {
        return;
    };
    {
        let mut cleaned = CLEANED.lock().unwrap();
        if cleaned.contains(&db) {
            return;
        }
        cleaned.push(db);
    }
    {
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT CAST(table_name AS CHAR) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name LIKE 'idem\\_%'",
        )
        .fetch_all(pool)
        .await
        .unwrap_or_default();
        for table in tables {
            if pid_of(&table).is_some_and(gone) {
                let _ = sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE IF EXISTS `{table}`")))
                    .execute(pool)
                    .await;
            }
        }
        if !databases {
            return;
        }
        let dbs: Vec<String> = sqlx::query_scalar(
            "SELECT CAST(schema_name AS CHAR) FROM information_schema.schemata \
             WHERE schema_name LIKE 'idem\\_%'",
        )
        .fetch_all(pool)
        .await
        .unwrap_or_default();
        for db in dbs {
            if pid_of(&db).is_some_and(gone) {
                let _ = sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE IF EXISTS `{db}`")))
                    .execute(pool)
                    .await;
            }
        }
    }
}

#[test]
fn finds_the_pid_in_unique_names() {
    assert_eq!(pid_of("idem_c_4242_7"), Some(4242));
    assert_eq!(pid_of("idem_tx_4242_7_fx"), Some(4242));
    assert_eq!(pid_of("idem_my_99_0_pay"), Some(99));
    assert_eq!(pid_of("idem_pay_callback_31_2"), Some(31));
    assert_eq!(pid_of("idem_record"), None);
    assert_eq!(pid_of("idem_token"), None);
    assert_eq!(pid_of("idem_example_pay"), None);
}
