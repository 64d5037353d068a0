//! State transitions on MySQL and MariaDB: the connections a transition runs on, how its values are bound,
//! and the sqlx impls `#[derive(StateMachine)]` asks for.

use sqlx::mysql::{MySqlArguments, MySqlConnection, MySqlRow};
use sqlx::{MySql, Row};

use super::db_error;
use crate::IdemError;
use crate::sql::dialect::Dialect;
use crate::sql::value::SqlValue;

/// `sql` with `args` bound in order.
fn query<'a>(
    sql: &'static str,
    args: &'a [SqlValue<'_>],
) -> sqlx::query::Query<'a, MySql, MySqlArguments> {
    args.iter().fold(sqlx::query(sql), |q, arg| match arg {
        SqlValue::Null => q.bind(None::<i64>),
        SqlValue::Bool(b) => q.bind(*b),
        SqlValue::Int(i) => q.bind(*i),
        SqlValue::Float(f) => q.bind(*f),
        SqlValue::Text(t) => q.bind(t.as_ref()),
        SqlValue::Bytes(b) => q.bind(b.as_ref()),
    })
}

/// An integer column as `i64`.
fn int_at(row: &MySqlRow, i: usize) -> Result<i64, IdemError> {
    row.try_get(i).map_err(db_error)
}

// Not listed in the "other types implement" help of a wrong `tx`: the compile errors read the
// same whichever backends are built.
crate::sql::conn::sqlx_transition_conn!(
    MySqlConnection,
    MySql,
    Dialect::MySQL,
    #[diagnostic::do_not_recommend]
);
