//! The MySQL store's schema: the shipped migrations as [`MySqlStore::migrate`] applies them, with
//! the store's table names.

use sqlx::AssertSqlSafe;

use super::{MySqlStore, db_error, error_number};
use crate::IdemError;
use crate::sql::dialect::Dialect;
use crate::sql::table::TableName;

impl MySqlStore {
    /// Creates the record table (and the token table) with their indexes if they do not exist,
    /// and adds the indexes of later versions to a table made by an earlier one: the DDL of
    /// `migrations/mysql/` with the store's table names.
    ///
    /// # Errors
    /// The database's error.
    pub async fn migrate(&self) -> Result<(), IdemError> {
        let [records, tokens, stuck, result_until, result_until_index] =
            migrations_named(&self.table, &self.token_table);
        for ddl in [records, tokens] {
            sqlx::raw_sql(AssertSqlSafe(ddl))
                .execute(&self.pool)
                .await
                .map_err(db_error)?;
        }
        // Later columns and indexes, for a table made by an earlier version too. MySQL has no
        // `ADD COLUMN IF NOT EXISTS` nor `CREATE INDEX IF NOT EXISTS`: a column or an index of
        // that name already there (made by an earlier `migrate()`, by hand, or by another service
        // migrating at the same moment) is refused with ER_DUP_FIELDNAME (1060) or ER_DUP_KEYNAME
        // (1061), which is the answer "it exists".
        for ddl in [stuck, result_until, result_until_index] {
            match sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&self.pool).await {
                Err(e) if matches!(error_number(&e), Some(1060 | 1061)) => {}
                done => done.map(drop).map_err(db_error)?,
            }
        }
        Ok(())
    }
}

/// [`MySqlStore::MIGRATIONS`] with the records' table `table` and the tokens' table `tokens` (and
/// their indexes) in place of the defaults: what [`MySqlStore::migrate`] applies (and `idem migrate
/// --print` shows).
pub(crate) fn migrations_named(table: &TableName, tokens: &TableName) -> [String; 5] {
    let [records, token_ddl, stuck, result_until, result_until_index] = MySqlStore::MIGRATIONS;
    let named = |ddl: &str, table: &TableName, default: &str| {
        ddl.replace(
            &format!("`{default}_expire_at`"),
            &Dialect::MySQL.quote_ident(&table.index_name("expire_at")),
        )
        .replace(&format!("`{default}`"), &table.quoted(Dialect::MySQL))
    };
    let stuck = stuck
        .replace(
            "`idem_record_stuck`",
            &Dialect::MySQL.quote_ident(&table.unique_index_name("stuck")),
        )
        .replace("`idem_record`", &table.quoted(Dialect::MySQL));
    let result_until_index = result_until_index
        .replace(
            "`idem_record_result_until`",
            &Dialect::MySQL.quote_ident(&table.unique_index_name("result_until")),
        )
        .replace("`idem_record`", &table.quoted(Dialect::MySQL));
    [
        named(records, table, "idem_record"),
        named(token_ddl, tokens, "idem_token"),
        stuck,
        named(result_until, table, "idem_record"),
        result_until_index,
    ]
}
