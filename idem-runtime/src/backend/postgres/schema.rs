//! The Postgres store's schema: the shipped migrations as [`PgStore::migrate`] applies them, with
//! the store's table names.

use sqlx::AssertSqlSafe;

use super::{PgStore, db_error};
use crate::IdemError;
use crate::sql::dialect::Dialect;
use crate::sql::table::TableName;

impl PgStore {
    /// Creates the records table and the tokens table with their indexes, if they do not exist
    /// (the schema of a schema-qualified name must exist), and adds the indexes of later versions
    /// to tables made by an earlier one. Plain DDL: no triggers, functions or extensions.
    ///
    /// # Errors
    /// The database's error.
    pub async fn migrate(&self) -> Result<(), IdemError> {
        let [records, tokens, processing, result_until] =
            migrations_named(&self.table, &self.token_table);
        for ddl in [records, tokens, processing, result_until] {
            // Two services migrating the same new table at once can collide in the catalog
            // (23505 / 42P07): the loser finds the table made on its second try.
            // Quiet: each `IF NOT EXISTS` that finds its table or index sends a NOTICE ("already
            // exists, skipping"), which sqlx logs at INFO; a migrate that changes nothing says
            // nothing. The setting is reset in the same batch, on the same connection.
            let quiet =
                format!("SET client_min_messages = warning;\n{ddl}\n;RESET client_min_messages;");
            let mut tried = 0;
            loop {
                match sqlx::raw_sql(AssertSqlSafe(quiet.clone()))
                    .execute(&self.pool)
                    .await
                {
                    Ok(_) => break,
                    Err(sqlx::Error::Database(db))
                        if tried < 3 && matches!(db.code().as_deref(), Some("23505" | "42P07")) =>
                    {
                        tried += 1;
                    }
                    Err(e) => return Err(db_error(e)),
                }
            }
        }
        Ok(())
    }
}

/// What [`PgStore::migrate`] applies (and `idem migrate --print` shows): [`PgStore::MIGRATIONS`]
/// but the superseded third, with the records' table `table` and the tokens' table `tokens`.
pub(crate) fn migrations_named(table: &TableName, tokens: &TableName) -> [String; 4] {
    let [records, token_ddl, _stuck, processing, result_until] = PgStore::MIGRATIONS;
    [
        named(records, "idem_record", table),
        named(token_ddl, "idem_token", tokens),
        named(processing, "idem_record", table),
        named(result_until, "idem_record", table),
    ]
}

/// The migration `ddl` with `default` (and its indexes) renamed to `table`, quoted. An index to
/// drop is named with the table's schema (an index lives in its table's schema, which need not be
/// on the search path); an index to create is named without it, as `CREATE INDEX` requires.
fn named(ddl: &str, default: &str, table: &TableName) -> String {
    let index = |suffix: &str| Dialect::Postgres.quote_ident(&table.unique_index_name(suffix));
    let ddl = ddl
        .replace(
            &format!("{default}_expire_at"),
            &Dialect::Postgres.quote_ident(&table.index_name("expire_at")),
        )
        .replace(&format!("{default}_stuck"), &index("stuck"))
        .replace(&format!("{default}_processing"), &index("processing"))
        .replace(&format!("{default}_result_until"), &index("result_until"))
        .replace(
            &format!("ALTER TABLE {default} "),
            &format!("ALTER TABLE {} ", table.quoted(Dialect::Postgres)),
        )
        .replace(
            &format!("IF NOT EXISTS {default} "),
            &format!("IF NOT EXISTS {} ", table.quoted(Dialect::Postgres)),
        )
        .replace(
            &format!("ON {default} "),
            &format!("ON {} ", table.quoted(Dialect::Postgres)),
        );
    match table.as_str().rsplit_once('.') {
        Some((schema, _)) => {
            let drop = format!("DROP INDEX IF EXISTS {}", index("stuck"));
            let qualified = format!(
                "DROP INDEX IF EXISTS {}.{}",
                Dialect::Postgres.quote_ident(schema),
                index("stuck")
            );
            ddl.replace(&drop, &qualified)
        }
        None => ddl,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_take_the_configured_names() {
        let t = TableName::new("shop.order").unwrap();
        let ddl = named(PgStore::MIGRATIONS[0], "idem_record", &t);
        assert!(ddl.contains("CREATE TABLE IF NOT EXISTS \"shop\".\"order\" ("));
        assert!(ddl.contains(
            "CREATE INDEX IF NOT EXISTS \"order_expire_at\" ON \"shop\".\"order\" (expire_at)"
        ));
        assert!(!ddl.contains("CREATE TABLE IF NOT EXISTS idem_record"));
        let ddl = named(PgStore::MIGRATIONS[1], "idem_token", &t);
        assert!(ddl.contains("IF NOT EXISTS \"shop\".\"order\" ("));
        let ddl = named(PgStore::MIGRATIONS[2], "idem_record", &t);
        assert!(ddl.contains(
            "CREATE INDEX IF NOT EXISTS \"order_stuck\" ON \"shop\".\"order\" \
             (biz_type, status, lease_until)"
        ));
        assert!(!ddl.contains("ON idem_record"), "{ddl}");
        // The index over PROCESSING records replaces the one over all; the one to drop is named
        // with its schema.
        let [_, _, ddl, result_until] = migrations_named(&t, &TableName::new("shop.tok").unwrap());
        assert!(
            result_until.contains(
                "ALTER TABLE \"shop\".\"order\" ADD COLUMN IF NOT EXISTS result_until BIGINT;"
            ),
            "{result_until}"
        );
        assert!(
            result_until.contains(
                "CREATE INDEX IF NOT EXISTS \"order_result_until\" ON \"shop\".\"order\" \
                 (result_until)"
            ),
            "{result_until}"
        );
        assert!(
            ddl.contains(
                "CREATE INDEX IF NOT EXISTS \"order_processing\" ON \"shop\".\"order\" \
                 (biz_type, lease_until)\n    WHERE status = 'PROCESSING';"
            ),
            "{ddl}"
        );
        assert!(
            ddl.contains("DROP INDEX IF EXISTS \"shop\".\"order_stuck\";"),
            "{ddl}"
        );
        assert!(
            !ddl.contains("ON idem_record") && !ddl.contains("EXISTS idem_record"),
            "{ddl}"
        );
        let plain = TableName::new("orders").unwrap();
        let [_, _, ddl, _] = migrations_named(&plain, &plain);
        assert!(
            ddl.contains("DROP INDEX IF EXISTS \"orders_stuck\";"),
            "{ddl}"
        );
    }
}
