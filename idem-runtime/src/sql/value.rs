//! Values a state transition binds (`key`, `set(col = …)`), in a form every backend can bind.

use std::borrow::Cow;
use std::sync::Arc;

use crate::IdemError;

/// A value bound to a SQL statement, the same for every backend.
#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue<'a> {
    /// `NULL`.
    Null,
    /// A boolean.
    Bool(bool),
    /// A signed 64-bit integer.
    Int(i64),
    /// A double.
    Float(f64),
    /// Text.
    Text(Cow<'a, str>),
    /// Bytes.
    Bytes(Cow<'a, [u8]>),
}

/// A value `#[state_transition]` can bind for `key = …` or `set(col = …)`.
///
/// Implemented for strings, integers, floats, `bool`, bytes, `Option` of them (`None` is `NULL`),
/// references and smart pointers to them, and every `#[derive(StateMachine)]` enum (its stored
/// name). Implement it for your own types by writing their stored form.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be bound to a SQL column by `#[state_transition]`",
    label = "not bindable",
    note = "`key` and `set(…)` values are bound as text, integers, floats, booleans, bytes or NULL: pass such a value (e.g. `x.to_string()`), or implement `idem::state_machine::ToSqlValue` for `{Self}`"
)]
pub trait ToSqlValue {
    /// The value to bind.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a value SQL cannot hold (an integer over `i64::MAX`).
    fn to_sql_value(&self) -> Result<SqlValue<'_>, IdemError>;
}

impl ToSqlValue for str {
    fn to_sql_value(&self) -> Result<SqlValue<'_>, IdemError> {
        Ok(SqlValue::Text(Cow::Borrowed(self)))
    }
}

impl ToSqlValue for String {
    fn to_sql_value(&self) -> Result<SqlValue<'_>, IdemError> {
        Ok(SqlValue::Text(Cow::Borrowed(self)))
    }
}

impl ToSqlValue for Cow<'_, str> {
    fn to_sql_value(&self) -> Result<SqlValue<'_>, IdemError> {
        Ok(SqlValue::Text(Cow::Borrowed(self)))
    }
}

impl ToSqlValue for [u8] {
    fn to_sql_value(&self) -> Result<SqlValue<'_>, IdemError> {
        Ok(SqlValue::Bytes(Cow::Borrowed(self)))
    }
}

impl ToSqlValue for Vec<u8> {
    fn to_sql_value(&self) -> Result<SqlValue<'_>, IdemError> {
        Ok(SqlValue::Bytes(Cow::Borrowed(self)))
    }
}

impl ToSqlValue for bool {
    fn to_sql_value(&self) -> Result<SqlValue<'_>, IdemError> {
        Ok(SqlValue::Bool(*self))
    }
}

impl ToSqlValue for f64 {
    fn to_sql_value(&self) -> Result<SqlValue<'_>, IdemError> {
        Ok(SqlValue::Float(*self))
    }
}

impl ToSqlValue for f32 {
    fn to_sql_value(&self) -> Result<SqlValue<'_>, IdemError> {
        Ok(SqlValue::Float(f64::from(*self)))
    }
}

macro_rules! integers {
    ($($t:ty),*) => {$(
        impl ToSqlValue for $t {
            fn to_sql_value(&self) -> Result<SqlValue<'_>, IdemError> {
                i64::try_from(*self).map(SqlValue::Int).map_err(|_| IdemError::InvalidOptions {
                    reason: format!("the integer {self} does not fit a signed 64-bit SQL column"),
                })
            }
        }
    )*};
}
integers!(
    i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize
);

impl<T: ToSqlValue> ToSqlValue for Option<T> {
    fn to_sql_value(&self) -> Result<SqlValue<'_>, IdemError> {
        match self {
            Some(value) => value.to_sql_value(),
            None => Ok(SqlValue::Null),
        }
    }
}

impl<T: ToSqlValue + ?Sized> ToSqlValue for &T {
    fn to_sql_value(&self) -> Result<SqlValue<'_>, IdemError> {
        (**self).to_sql_value()
    }
}

impl<T: ToSqlValue + ?Sized> ToSqlValue for &mut T {
    fn to_sql_value(&self) -> Result<SqlValue<'_>, IdemError> {
        (**self).to_sql_value()
    }
}

impl<T: ToSqlValue + ?Sized> ToSqlValue for Box<T> {
    fn to_sql_value(&self) -> Result<SqlValue<'_>, IdemError> {
        (**self).to_sql_value()
    }
}

impl<T: ToSqlValue + ?Sized> ToSqlValue for Arc<T> {
    fn to_sql_value(&self) -> Result<SqlValue<'_>, IdemError> {
        (**self).to_sql_value()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_common_types() {
        assert_eq!("a".to_sql_value().unwrap(), SqlValue::Text("a".into()));
        assert_eq!((&&7u32).to_sql_value().unwrap(), SqlValue::Int(7));
        assert_eq!(None::<i64>.to_sql_value().unwrap(), SqlValue::Null);
        assert!(matches!(
            u64::MAX.to_sql_value(),
            Err(IdemError::InvalidOptions { .. })
        ));
    }
}
