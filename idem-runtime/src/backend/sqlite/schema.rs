//! The SQLite store's schema: the shipped migrations as [`SqliteStore::migrate`] applies them, with
//! the store's table names.

use sqlx::{AssertSqlSafe, Row};

use super::{DEFAULT_TOKEN_TABLE, SqliteStore, db_error};
use crate::IdemError;
use crate::sql::dialect::Dialect;
use crate::sql::table::TableName;

impl SqliteStore {
    /// Creates the records table (`idem_record` by default) and the tokens table (`idem_token`)
    /// with their indexes if they do not exist, and adds the columns and indexes of later versions
    /// to a table made by an earlier one: the DDL of `migrations/sqlite/` with the store's table
    /// names.
    ///
    /// # Errors
    /// The database's error.
    pub async fn migrate(&self) -> Result<(), IdemError> {
        let [v1, v2, v3, v5, v6, v7] = migrations_named(&self.table, &self.token_table);
        let run = async |ddl: String| {
            sqlx::raw_sql(AssertSqlSafe(ddl))
                .execute(&self.pool)
                .await
                .map_err(db_error)
        };
        run(v1).await?;
        // SQLite has no ADD COLUMN IF NOT EXISTS: a column of a later version is added to a
        // table that has not got it.
        let has = async |column: &str| -> Result<bool, IdemError> {
            let n: i64 = sqlx::query("SELECT COUNT(*) FROM pragma_table_info(?1) WHERE name = ?2")
                .bind(self.table.as_str())
                .bind(column)
                .fetch_one(&self.pool)
                .await
                .and_then(|row| row.try_get(0))
                .map_err(db_error)?;
            Ok(n > 0)
        };
        if !has("fence").await? {
            run(v2).await?;
        }
        run(v3).await?;
        run(v5).await?;
        if !has("result_until").await? {
            run(v6).await?;
        }
        run(v7).await?;
        Ok(())
    }
}

/// [`SqliteStore::MIGRATIONS`] with the records' table `table` and the tokens' table `tokens` in
/// place of the defaults, their indexes named after them (`<table>_expire_at`,
/// `<table>_processing`, `<tokens>_expire_at`), but the superseded fourth: what
/// [`SqliteStore::migrate`] applies (and `idem migrate --print` shows). With the default names,
/// the shipped DDL as it is.
pub(crate) fn migrations_named(table: &TableName, tokens: &TableName) -> [String; 6] {
    let [v1, v2, v3, _stuck, v5, v6, v7] = SqliteStore::MIGRATIONS;
    let records = |ddl: &str| rename(ddl, "idem_record", table);
    [
        records(v1),
        records(v2),
        rename(v3, DEFAULT_TOKEN_TABLE, tokens),
        records(v5),
        records(v6),
        records(v7),
    ]
}

/// `ddl` with the table `default` renamed to `table` (quoted), and its indexes
/// `<default>_expire_at`, `<default>_stuck` and `<default>_processing` to the names [`TableName`]
/// derives from `table`.
fn rename(ddl: &str, default: &str, table: &TableName) -> String {
    if table.as_str() == default {
        return ddl.to_owned();
    }
    let q = |name: &str| Dialect::SQLite.quote_ident(name);
    // The index names contain the table's: they are set aside first, so the table's own
    // replacement does not reach into them.
    let expire = format!("{default}_expire_at");
    let stuck = format!("{default}_stuck");
    let processing = format!("{default}_processing");
    let result_until = format!("{default}_result_until");
    ddl.replace(&expire, "\u{0}expire\u{0}")
        .replace(&stuck, "\u{0}stuck\u{0}")
        .replace(&processing, "\u{0}processing\u{0}")
        .replace(&result_until, "\u{0}result_until\u{0}")
        .replace(default, &table.quoted(Dialect::SQLite))
        .replace("\u{0}expire\u{0}", &q(&table.index_name("expire_at")))
        .replace("\u{0}stuck\u{0}", &q(&table.unique_index_name("stuck")))
        .replace(
            "\u{0}processing\u{0}",
            &q(&table.unique_index_name("processing")),
        )
        .replace(
            "\u{0}result_until\u{0}",
            &q(&table.unique_index_name("result_until")),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_names_keep_the_shipped_ddl() {
        let named = migrations_named(
            &TableName::default_table(),
            &TableName::new(DEFAULT_TOKEN_TABLE).unwrap(),
        );
        let [v1, v2, v3, _superseded, v5, v6, v7] = SqliteStore::MIGRATIONS.map(str::to_owned);
        assert_eq!(named, [v1, v2, v3, v5, v6, v7]);
    }

    #[test]
    fn migrations_take_the_configured_names() {
        let [v1, v2, v3, v4, v5, v6] = migrations_named(
            &TableName::new("orders").unwrap(),
            &TableName::new("orders_tok").unwrap(),
        );
        assert!(
            v1.contains("CREATE TABLE IF NOT EXISTS \"orders\" ("),
            "{v1}"
        );
        assert!(
            v1.contains(
                "CREATE INDEX IF NOT EXISTS \"orders_expire_at\" ON \"orders\" (expire_at)"
            ),
            "{v1}"
        );
        assert!(
            v2.contains("ALTER TABLE \"orders\" ADD COLUMN fence"),
            "{v2}"
        );
        assert!(
            v3.contains("CREATE TABLE IF NOT EXISTS \"orders_tok\" ("),
            "{v3}"
        );
        assert!(
            v3.contains("\"orders_tok_expire_at\" ON \"orders_tok\""),
            "{v3}"
        );
        assert!(
            v4.contains(
                "CREATE INDEX IF NOT EXISTS \"orders_processing\" ON \"orders\" (biz_type, lease_until)\n    \
                 WHERE status = 'PROCESSING';"
            ),
            "{v4}"
        );
        assert!(
            v4.contains("DROP INDEX IF EXISTS \"orders_stuck\";"),
            "{v4}"
        );
        assert!(
            v5.contains("ALTER TABLE \"orders\" ADD COLUMN result_until"),
            "{v5}"
        );
        assert!(
            v6.contains(
                "CREATE INDEX IF NOT EXISTS \"orders_result_until\" ON \"orders\" (result_until)"
            ),
            "{v6}"
        );
        for ddl in [&v1, &v2, &v3, &v4, &v5, &v6] {
            assert!(
                !ddl.contains("idem_record") && !ddl.contains("idem_token"),
                "{ddl}"
            );
        }
    }
}
