//! The DDL a store URL names, worked out without connecting: [`migrations`], what
//! `idem migrate --print` shows.

use super::{Options, invalid};
use crate::IdemError;

/// The DDL [`AnyStore::migrate`](crate::AnyStore::migrate) applies for the store `url` names, worked out without connecting:
/// the SQL stores' `MIGRATIONS` with the tables of the URL's `idem_table` option (its token table
/// `NAME_tok`), in order; every shard's of a sharded URL, one after the other. `None` for a store
/// without a schema (memory, Redis) or whose table is made by a request, not DDL (DynamoDB). For services that apply migrations with their own tool
/// (`idem migrate --print`).
///
/// # Errors
/// As [`connect`](fn@crate::connect) for a URL it could not open (without its "unreachable" errors).
pub fn migrations(url: &str) -> Result<Option<Vec<String>>, IdemError> {
    let (scheme, rest) = url
        .split_once(':')
        .ok_or_else(|| invalid(url, "it has no scheme"))?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme == "sharded" {
        let mut all = Vec::new();
        for shard in rest.split('|').filter(|s| !s.trim().is_empty()) {
            if let Some(ddl) = migrations(shard.trim())? {
                all.extend(ddl);
            }
        }
        return Ok((!all.is_empty()).then_some(all));
    }
    let (base, options) = Options::split(url)?;
    match scheme.as_str() {
        "memory" => options.none_for("memory").map(|()| None),
        "sqlite" => {
            options.only("SQLite", true, false)?;
            if base.contains('?') {
                return Err(invalid(url, "a `sqlite:` store URL takes no query options"));
            }
            sqlite_migrations(&options)
        }
        "mysql" | "mariadb" => {
            options.only("MySQL", true, false)?;
            mysql_migrations(&options)
        }
        "postgres" | "postgresql" => {
            options.only("Postgres", true, false)?;
            postgres_migrations(&options)
        }
        "redis" | "rediss" => options.only("Redis", false, true).map(|()| None),
        "redis+cluster" => options.only("Redis Cluster", false, true).map(|()| None),
        // A table DynamoDB creates from a request, not from DDL: `migrate()` sends it.
        "dynamodb" => options.none_for("DynamoDB").map(|()| None),
        _ => Err(invalid(url, "its scheme is not one idem knows")),
    }
}

#[cfg(feature = "sqlite")]
fn sqlite_migrations(options: &Options) -> Result<Option<Vec<String>>, IdemError> {
    let (records, tokens) = tables(options)?;
    // Checked as the store checks them when opened (a plain name, no schema).
    for name in [&records, &tokens] {
        crate::backend::sqlite::plain_table(name.as_str())?;
    }
    Ok(Some(
        crate::backend::sqlite::migrations_named(&records, &tokens).to_vec(),
    ))
}

#[cfg(not(feature = "sqlite"))]
fn sqlite_migrations(_: &Options) -> Result<Option<Vec<String>>, IdemError> {
    Err(super::feature_off("sqlite", "sqlite"))
}

/// The records' and tokens' table names of the `idem_table` and `idem_token_table` options
/// (`NAME_tok` for the tokens of `idem_table=NAME` without `idem_token_table`; the default names
/// without either).
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
fn tables(
    options: &Options,
) -> Result<(crate::sql::table::TableName, crate::sql::table::TableName), IdemError> {
    use crate::sql::table::TableName;
    let records = match &options.table {
        Some(t) => TableName::new(t)?,
        None => TableName::default_table(),
    };
    let tokens = match &options.token_table {
        Some(t) => TableName::new(t)?,
        None => records.tokens_table(),
    };
    Ok((records, tokens))
}

#[cfg(feature = "mysql")]
fn mysql_migrations(options: &Options) -> Result<Option<Vec<String>>, IdemError> {
    let (records, tokens) = tables(options)?;
    Ok(Some(
        crate::backend::mysql::migrations_named(&records, &tokens).to_vec(),
    ))
}

#[cfg(not(feature = "mysql"))]
fn mysql_migrations(_: &Options) -> Result<Option<Vec<String>>, IdemError> {
    Err(super::feature_off("mysql", "mysql"))
}

#[cfg(feature = "postgres")]
fn postgres_migrations(options: &Options) -> Result<Option<Vec<String>>, IdemError> {
    let (records, tokens) = tables(options)?;
    Ok(Some(
        crate::backend::postgres::migrations_named(&records, &tokens).to_vec(),
    ))
}

#[cfg(not(feature = "postgres"))]
fn postgres_migrations(_: &Options) -> Result<Option<Vec<String>>, IdemError> {
    Err(super::feature_off("postgres", "postgres"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_worked_out_from_the_url_alone() {
        assert_eq!(migrations("memory:").unwrap(), None);
        #[cfg(feature = "redis")]
        assert_eq!(migrations("redis://h:1/0?idem_prefix=p:").unwrap(), None);
        // A table DynamoDB makes from a request: nothing to print, and no idem_* option taken.
        assert_eq!(
            migrations("dynamodb://records?region=eu-west-1").unwrap(),
            None
        );
        assert!(migrations("dynamodb://records?idem_table=x").is_err());
        #[cfg(feature = "sqlite")]
        {
            assert_eq!(migrations("sqlite:x.db").unwrap().unwrap().len(), 6);
            let ddl = migrations("sqlite:x.db?idem_table=t3").unwrap().unwrap();
            assert!(
                ddl[0].contains("\"t3\"") && ddl[2].contains("\"t3_tok\""),
                "{ddl:?}"
            );
            assert!(
                ddl[3].contains("\"t3_processing\"")
                    && ddl[3].contains("DROP INDEX IF EXISTS \"t3_stuck\""),
                "{ddl:?}"
            );
            let ddl = migrations("sqlite:x.db?idem_token_table=tk")
                .unwrap()
                .unwrap();
            assert!(
                ddl[0].contains("idem_record") && ddl[2].contains("\"tk\""),
                "{ddl:?}"
            );
            assert!(migrations("sqlite:x.db?idem_table=s.t").is_err());
        }
        #[cfg(feature = "postgres")]
        {
            let ddl = migrations("postgres://u:pw@nowhere/db?idem_table=t1")
                .unwrap()
                .unwrap();
            assert!(ddl[0].contains("IF NOT EXISTS \"t1\" "), "{}", ddl[0]);
            assert!(ddl[1].contains("\"t1_tok\""), "{}", ddl[1]);
            assert!(
                ddl.iter()
                    .all(|d| !d.contains("EXISTS idem_") && !d.contains("ON idem_")),
                "{ddl:?}"
            );
            assert!(
                ddl[2].contains("\"t1_processing\"")
                    && ddl[2].contains("DROP INDEX IF EXISTS \"t1_stuck\""),
                "{}",
                ddl[2]
            );
            assert!(
                ddl[3].contains("ALTER TABLE \"t1\" ADD COLUMN IF NOT EXISTS result_until")
                    && ddl[3].contains("\"t1_result_until\" ON \"t1\""),
                "{}",
                ddl[3]
            );
        }
        #[cfg(feature = "mysql")]
        {
            let ddl = migrations("mariadb://root@nowhere/test?idem_table=t2")
                .unwrap()
                .unwrap();
            assert!(
                ddl[0].contains("`t2`") && ddl[1].contains("`t2_tok`"),
                "{ddl:?}"
            );
            assert!(ddl[2].contains("`t2_stuck`"), "{}", ddl[2]);
            assert!(
                ddl[3].contains("ALTER TABLE `t2` ADD COLUMN result_until")
                    && ddl[4].contains("`t2_result_until` ON `t2`"),
                "{ddl:?}"
            );
        }
        assert!(migrations("nope://x").is_err());
        assert!(migrations("memory:?idem_table=t").is_err());
    }
}
