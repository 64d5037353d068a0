//! State transitions on Postgres: the connections a transition runs on and how its values are
//! bound (`$n` placeholders; identifiers are quoted `"…"` by the statement builder).

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{PgArgumentBuffer, PgArguments, PgConnection, PgRow, PgTypeInfo};
use sqlx::{Encode, Postgres, Row, Type};

use super::db_error;
use crate::IdemError;
use crate::sql::dialect::Dialect;
use crate::sql::value::SqlValue;

/// A `NULL` of no declared type (`unknown`): Postgres gives it the type of the column it meets, so
/// `set(paid_at = "none")` works on a text, integer or timestamp column alike.
struct UntypedNull;

impl Type<Postgres> for UntypedNull {
    fn type_info() -> PgTypeInfo {
        // 705: `unknown`, which Postgres resolves from the parameter's context.
        PgTypeInfo::with_oid(Oid(705))
    }
}

impl Encode<'_, Postgres> for UntypedNull {
    fn encode_by_ref(&self, _: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        Ok(IsNull::Yes)
    }
}

/// `sql` with `args` bound in order.
fn query<'a>(
    sql: &'static str,
    args: &'a [SqlValue<'_>],
) -> sqlx::query::Query<'a, Postgres, PgArguments> {
    args.iter().fold(sqlx::query(sql), |q, arg| match arg {
        SqlValue::Null => q.bind(UntypedNull),
        SqlValue::Bool(b) => q.bind(*b),
        SqlValue::Int(i) => q.bind(*i),
        SqlValue::Float(f) => q.bind(*f),
        SqlValue::Text(t) => q.bind(t.as_ref()),
        SqlValue::Bytes(b) => q.bind(b.as_ref()),
    })
}

/// An integer column of any width (`SMALLINT`, `INTEGER`, `BIGINT`) as `i64`.
fn int_at(row: &PgRow, i: usize) -> Result<i64, IdemError> {
    row.try_get::<i64, _>(i)
        .or_else(|_| row.try_get::<i32, _>(i).map(i64::from))
        .or_else(|_| row.try_get::<i16, _>(i).map(i64::from))
        .map_err(db_error)
}

// Left out of rustc's list of implementors, as every SQL backend's impls are: the list in the
// "not a transaction" error stays the same whichever backends are built.
crate::sql::conn::sqlx_transition_conn!(
    PgConnection,
    Postgres,
    Dialect::Postgres,
    #[diagnostic::do_not_recommend]
);
