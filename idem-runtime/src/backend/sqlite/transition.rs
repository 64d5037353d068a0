//! State transitions on SQLite: the connections a transition runs on, how its values are bound,
//! and the sqlx impls `#[derive(StateMachine)]` asks for.

use async_trait::async_trait;
use sqlx::sqlite::{SqliteArguments, SqliteConnection};
use sqlx::{Row, Sqlite, Transaction};

use super::db_error;
use crate::IdemError;
use crate::sql::conn::{StateRow, TransitionConn};
use crate::sql::dialect::Dialect;
use crate::sql::value::SqlValue;

/// `sql` with `args` bound in order.
fn query<'a>(
    sql: &'static str,
    args: &'a [SqlValue<'_>],
) -> sqlx::query::Query<'a, Sqlite, SqliteArguments> {
    args.iter().fold(sqlx::query(sql), |q, arg| match arg {
        SqlValue::Null => q.bind(None::<i64>),
        SqlValue::Bool(b) => q.bind(*b),
        SqlValue::Int(i) => q.bind(*i),
        SqlValue::Float(f) => q.bind(*f),
        SqlValue::Text(t) => q.bind(t.as_ref()),
        SqlValue::Bytes(b) => q.bind(b.as_ref()),
    })
}

#[async_trait]
impl TransitionConn for SqliteConnection {
    fn dialect(&self) -> Dialect {
        Dialect::SQLite
    }

    async fn execute(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
    ) -> Result<u64, IdemError> {
        let done = query(sql, args).execute(self).await.map_err(db_error)?;
        Ok(done.rows_affected())
    }

    async fn execute_unprepared(&mut self, sql: &str) -> Result<(), IdemError> {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(self)
            .await
            .map_err(db_error)?;
        Ok(())
    }

    async fn read_state(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
        versioned: bool,
    ) -> Result<Option<StateRow>, IdemError> {
        let Some(row) = query(sql, args)
            .fetch_optional(self)
            .await
            .map_err(db_error)?
        else {
            return Ok(None);
        };
        let already: i64 = row.try_get(1).map_err(db_error)?;
        Ok(Some(StateRow {
            status: row.try_get(0).map_err(db_error)?,
            already: already == 1,
            version: if versioned {
                Some(row.try_get(2).map_err(db_error)?)
            } else {
                None
            },
        }))
    }
}

#[async_trait]
impl TransitionConn for Transaction<'_, Sqlite> {
    fn dialect(&self) -> Dialect {
        Dialect::SQLite
    }

    async fn execute(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
    ) -> Result<u64, IdemError> {
        TransitionConn::execute(&mut **self, sql, args).await
    }

    async fn execute_unprepared(&mut self, sql: &str) -> Result<(), IdemError> {
        TransitionConn::execute_unprepared(&mut **self, sql).await
    }

    async fn read_state(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
        versioned: bool,
    ) -> Result<Option<StateRow>, IdemError> {
        TransitionConn::read_state(&mut **self, sql, args, versioned).await
    }
}
