//! The name of a store's table: configurable (each service, or each test, may keep its records in a
//! table of its own) and validated before it is written into any statement.

use super::dialect::Dialect;
use crate::IdemError;

/// A validated table name: `[A-Za-z_][A-Za-z0-9_]*`, optionally `schema.table`, each part at most 63
/// bytes (the shortest limit among MySQL, Postgres and the distributed engines that speak their
/// dialects). Quoted per dialect in every statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName(String);

// Without a server backend only this module's own tests use it.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "mysql", feature = "postgres")),
    allow(dead_code)
)]
impl TableName {
    /// The default table: `idem_record`.
    pub fn default_table() -> Self {
        TableName("idem_record".to_owned())
    }

    /// Checks `name`.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] saying what is wrong.
    pub fn new(name: &str) -> Result<Self, IdemError> {
        let parts: Vec<&str> = name.split('.').collect();
        let ok_part = |part: &str| {
            let mut chars = part.chars();
            matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
                && part.len() <= 63
        };
        if parts.len() <= 2 && parts.iter().all(|part| ok_part(part)) {
            Ok(TableName(name.to_owned()))
        } else {
            Err(IdemError::InvalidOptions {
                reason: format!(
                    "`{}` is not a table name idem can use: write `[A-Za-z_][A-Za-z0-9_]*` (at most 63 \
                     bytes), optionally `schema.table`",
                    name.escape_default()
                ),
            })
        }
    }

    /// The submit tokens' table that goes with this records' table when none is named: `idem_token`
    /// beside the default `idem_record`, else `<table>_tok` in the same schema (its name cut to
    /// fit 63 bytes). The one rule of every store's `with_table`, the Postgres builder, the URL's
    /// `idem_table` option and `idem migrate --print`.
    pub fn tokens_table(&self) -> TableName {
        if self.0 == "idem_record" {
            return TableName("idem_token".to_owned());
        }
        let (schema, table) = match self.0.rsplit_once('.') {
            Some((schema, table)) => (Some(schema), table),
            None => (None, self.0.as_str()),
        };
        // ASCII (checked by `new`): any byte offset is a char boundary.
        let tokens = format!("{}_tok", &table[..table.len().min(63 - 4)]);
        TableName(match schema {
            Some(schema) => format!("{schema}.{tokens}"),
            None => tokens,
        })
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name quoted for `dialect`.
    pub fn quoted(&self, dialect: Dialect) -> String {
        dialect.quote_ident(&self.0)
    }

    /// A name for an index on `column` of this table (`idem_record_expire_at`), unquoted, without
    /// the schema (indexes live in their table's schema).
    pub fn index_name(&self, column: &str) -> String {
        let table = self.0.rsplit('.').next().unwrap_or(&self.0);
        let mut name = format!("{table}_{column}");
        name.truncate(63);
        name
    }

    /// A name for the index `suffix` of this table (`idem_record_stuck`), unquoted, without the
    /// schema, that stays apart from the table's other indexes and from other tables' however long
    /// the table's name: when `<table>_<suffix>` would pass 63 bytes (where [`TableName::index_name`]
    /// cuts the end, so two indexes of one table, or of two tables sharing a long prefix, would get
    /// one name, and Postgres's `CREATE INDEX IF NOT EXISTS` would skip the second), the table
    /// part is shortened and 8 hex digits of a hash of the whole table name go before the suffix.
    pub fn unique_index_name(&self, suffix: &str) -> String {
        use sha2::{Digest, Sha256};

        const MAX: usize = 63;
        let table = self.0.rsplit('.').next().unwrap_or(&self.0);
        if table.len() + 1 + suffix.len() <= MAX {
            return format!("{table}_{suffix}");
        }
        let hash = crate::fingerprint::hex(&Sha256::digest(table.as_bytes())[..4]);
        // Table names are ASCII (checked by `new`), so any byte offset is a char boundary.
        let keep = MAX.saturating_sub(1 + hash.len() + 1 + suffix.len());
        let mut name = format!("{}_{hash}_{suffix}", &table[..keep.min(table.len())]);
        name.truncate(MAX);
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_and_quotes() {
        assert!(TableName::new("idem_record").is_ok());
        assert!(TableName::new("shop.idem_record").is_ok());
        for bad in ["", "1x", "a-b", "a.b.c", "x; DROP TABLE y", &"t".repeat(64)] {
            assert!(
                matches!(TableName::new(bad), Err(IdemError::InvalidOptions { .. })),
                "{bad}"
            );
        }
        let t = TableName::new("shop.order").unwrap();
        assert_eq!(t.quoted(Dialect::MySQL), "`shop`.`order`");
        assert_eq!(t.quoted(Dialect::Postgres), "\"shop\".\"order\"");
        assert_eq!(t.index_name("expire_at"), "order_expire_at");
        assert_eq!(t.unique_index_name("stuck"), "order_stuck");
    }

    #[test]
    fn long_names_get_index_names_of_their_own() {
        let long = |c: &str| TableName::new(&format!("s.{}{c}", "t".repeat(62))).unwrap();
        let (a, b) = (long("a"), long("b"));
        for t in [&a, &b] {
            let stuck = t.unique_index_name("stuck");
            assert!(stuck.len() <= 63 && stuck.ends_with("_stuck"), "{stuck}");
            assert!(TableName::new(&stuck).is_ok(), "{stuck}");
            assert_ne!(stuck, t.index_name("expire_at"));
            assert_ne!(stuck, t.as_str().rsplit('.').next().unwrap());
        }
        assert_ne!(a.unique_index_name("stuck"), b.unique_index_name("stuck"));
        // Just fitting: no hash.
        let fits = TableName::new(&"t".repeat(57)).unwrap();
        assert_eq!(
            fits.unique_index_name("stuck"),
            format!("{}_stuck", "t".repeat(57))
        );
    }
}
