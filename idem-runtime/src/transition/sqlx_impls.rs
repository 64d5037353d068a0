//! sqlx `Type` / `Encode` / `Decode` for a machine (as TEXT, its stored state name) on every SQL
//! backend that is built: `#[derive(StateMachine)]` calls `__idem_sql_text!`, so a machine can be
//! bound and read in the service's own queries, and the user's crate needs no sqlx features.

/// The impls for one database type.
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_sqlx_text {
    ($machine:ty, $db:ty) => {
        impl $crate::sqlx::Type<$db> for $machine {
            fn type_info() -> <$db as $crate::sqlx::Database>::TypeInfo {
                <&str as $crate::sqlx::Type<$db>>::type_info()
            }
            fn compatible(ty: &<$db as $crate::sqlx::Database>::TypeInfo) -> bool {
                <&str as $crate::sqlx::Type<$db>>::compatible(ty)
            }
        }
        impl<'q> $crate::sqlx::Encode<'q, $db> for $machine {
            fn encode_by_ref(
                &self,
                buf: &mut <$db as $crate::sqlx::Database>::ArgumentBuffer,
            ) -> ::core::result::Result<
                $crate::sqlx::encode::IsNull,
                $crate::sqlx::error::BoxDynError,
            > {
                <&str as $crate::sqlx::Encode<'q, $db>>::encode(
                    $crate::StateMachine::as_str(*self),
                    buf,
                )
            }
        }
        impl<'r> $crate::sqlx::Decode<'r, $db> for $machine {
            fn decode(
                value: <$db as $crate::sqlx::Database>::ValueRef<'r>,
            ) -> ::core::result::Result<Self, $crate::sqlx::error::BoxDynError> {
                let name = <&str as $crate::sqlx::Decode<'r, $db>>::decode(value)?;
                <$machine as $crate::StateMachine>::parse(name).ok_or_else(|| {
                    ::std::format!(
                        "`{name}` is no state of `{}`",
                        <$machine as $crate::StateMachine>::NAME
                    )
                    .into()
                })
            }
        }
    };
}

/// What `#[derive(StateMachine)]` calls: the impls for each backend that is built.
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_sql_text {
    ($machine:ty) => {
        $crate::__idem_sqlite_text!($machine);
        $crate::__idem_mysql_text!($machine);
        $crate::__idem_postgres_text!($machine);
    };
}

#[cfg(feature = "sqlite")]
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_sqlite_text {
    ($machine:ty) => {
        $crate::__idem_sqlx_text!($machine, $crate::sqlx::Sqlite);
    };
}

#[cfg(not(feature = "sqlite"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_sqlite_text {
    ($machine:ty) => {};
}

#[cfg(feature = "mysql")]
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_mysql_text {
    ($machine:ty) => {
        $crate::__idem_sqlx_text!($machine, $crate::sqlx::MySql);
    };
}

#[cfg(not(feature = "mysql"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_mysql_text {
    ($machine:ty) => {};
}

#[cfg(feature = "postgres")]
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_postgres_text {
    ($machine:ty) => {
        $crate::__idem_sqlx_text!($machine, $crate::sqlx::Postgres);
    };
}

#[cfg(not(feature = "postgres"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_postgres_text {
    ($machine:ty) => {};
}
