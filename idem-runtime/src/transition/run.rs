//! The one runtime entry point of `#[state_transition]`: the generated code describes the transition
//! (a [`TransitionSpec`]) and calls [`TransitionCall`]'s steps; the connection picks its dialect's
//! statement. A new backend implements [`TransitionConn`] and needs no change in the macro.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};

use tracing::Instrument;

use super::sql::{TransitionShape, TransitionSql};
use super::{StateMachine, Transition};
use crate::IdemError;
use crate::engine::StoreArg;
use crate::engine::snapshot::ErrType;
use crate::metrics::{Outcome, report};
use crate::sql::conn::TransitionConn;
use crate::sql::dialect::Savepoint;
use crate::sql::value::{SqlValue, ToSqlValue};
use crate::store::tx::TransitionTx;

/// One `#[state_transition]` fn: its states, its shape and its statements in every dialect, built
/// at compile time.
pub struct TransitionSpec<M> {
    sql: TransitionSql,
    shape: TransitionShape,
    to: &'static str,
    from: &'static [&'static str],
    machine: PhantomData<fn() -> M>,
}

impl<M: StateMachine> TransitionSpec<M> {
    /// The transition `from` → `to` of `M` with `shape`.
    pub const fn new(
        to: &'static str,
        from: &'static [&'static str],
        shape: TransitionShape,
    ) -> Self {
        TransitionSpec {
            sql: TransitionSql::build::<M>(&shape),
            shape,
            to,
            from,
            machine: PhantomData,
        }
    }

    /// The statements, per dialect.
    pub fn sql(&self) -> &TransitionSql {
        &self.sql
    }

    /// A call of the transition: its steps, its span, its outcome.
    pub fn call(&'static self) -> TransitionCall<M> {
        TransitionCall {
            spec: self,
            outcome: Recorded::default(),
        }
    }
}

/// The key and `set` values of one call, converted for binding before any await (so the fn's
/// future holds only plain values).
pub struct TransitionValues<'a>(Result<(SqlValue<'a>, Vec<SqlValue<'a>>), IdemError>);

impl<'a> TransitionValues<'a> {
    /// The key's value and the `set` values, in the order of the attribute's `set(…)`.
    pub fn new(key: &'a dyn ToSqlValue, set: &[&'a dyn ToSqlValue]) -> Self {
        TransitionValues(key.to_sql_value().and_then(|key| {
            let set = set
                .iter()
                .map(|v: &&'a dyn ToSqlValue| {
                    let v: &'a dyn ToSqlValue = *v;
                    v.to_sql_value()
                })
                .collect::<Result<_, _>>()?;
            Ok((key, set))
        }))
    }
}

/// What the update found.
pub enum TransitionStep<M> {
    /// One row moved: run the body, then [`TransitionCall::finish`].
    Apply(TransitionGuard),
    /// No row moved, and this is why.
    Done(Done<M>),
}

/// Proof that the update moved the row, inside the transition's savepoint (which it names).
pub struct TransitionGuard(Savepoint);

/// Why a transition moved no row.
pub enum Done<M> {
    /// Already in the target state with matching columns.
    AlreadyApplied,
    /// In another state.
    Rejected(M),
    /// In a `from` state at another version.
    VersionConflict(M, i64),
    /// No such row.
    NotFound,
}

impl<M> Done<M> {
    /// As the fn's answer.
    pub fn into_transition<T>(self) -> Transition<T, M> {
        match self {
            Done::AlreadyApplied => Transition::AlreadyApplied,
            Done::Rejected(current) => Transition::Rejected { current },
            Done::VersionConflict(current, version) => {
                Transition::VersionConflict { current, version }
            }
            Done::NotFound => Transition::NotFound,
        }
    }

    fn outcome(&self) -> Outcome {
        match self {
            Done::AlreadyApplied => Outcome::Replayed,
            Done::Rejected(_) => Outcome::WrongState,
            Done::VersionConflict(..) => Outcome::VersionConflict,
            Done::NotFound => Outcome::NotFound,
        }
    }
}

/// One call of a transition: every step records the outcome, and [`TransitionCall::run`] reports it
/// once in the `idem` span, the counters (under the machine's name) and `idem::metrics::observe`.
pub struct TransitionCall<M: 'static> {
    spec: &'static TransitionSpec<M>,
    outcome: Recorded,
}

/// The outcome a step recorded (an atomic, so the fn's future stays `Send`).
#[derive(Default)]
struct Recorded(AtomicUsize);

impl Recorded {
    fn set(&self, outcome: Option<Outcome>) {
        let index = outcome.map_or(0, |o| {
            Outcome::ALL.iter().position(|x| *x == o).unwrap_or(0) + 1
        });
        self.0.store(index, Ordering::Relaxed);
    }

    fn get(&self) -> Option<Outcome> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            i => Outcome::ALL.get(i - 1).copied(),
        }
    }
}

impl<M: StateMachine> TransitionCall<M> {
    /// Runs the whole call (`fut`: update, body, release) in its span and reports how it ended.
    pub async fn run<F: Future>(&self, fut: F) -> F::Output {
        let span = tracing::info_span!(
            "idem",
            biz = M::NAME,
            transition = self.spec.to,
            outcome = tracing::field::Empty,
            attempt = tracing::field::Empty
        );
        async {
            let out = fut.await;
            report(M::NAME, self.outcome.get().unwrap_or(Outcome::Rejected), 0);
            out
        }
        .instrument(span)
        .await
    }

    /// Begins a transaction of its own on the store (`store = "…"`).
    ///
    /// # Errors
    /// [`IdemError::UnknownStore`], [`IdemError::NotSupported`] for a store without a database, or
    /// the store's error.
    pub async fn begin(&self, store: StoreArg<'_>) -> Result<Box<dyn TransitionTx>, IdemError> {
        let store = store.resolve()?;
        store.get().begin_transition().await
    }

    /// Opens the savepoint and runs the update; when no row moved, reads the row to tell why.
    ///
    /// # Errors
    /// A value that cannot be bound, a database error, or a key that matched several rows. The
    /// savepoint is rolled back: nothing stays written.
    pub async fn start<C: TransitionConn + ?Sized>(
        &self,
        conn: &mut C,
        values: TransitionValues<'_>,
        version: Option<i64>,
    ) -> Result<TransitionStep<M>, IdemError> {
        let step = match values.0 {
            Ok((key, set)) => self.try_start(conn, key, set, version).await,
            Err(e) => Err(e),
        };
        match &step {
            Ok(TransitionStep::Done(done)) => self.outcome.set(Some(done.outcome())),
            Ok(TransitionStep::Apply(_)) => {}
            Err(_) => self.outcome.set(Some(Outcome::Rejected)),
        }
        step
    }

    async fn try_start<C: TransitionConn + ?Sized>(
        &self,
        conn: &mut C,
        key: SqlValue<'_>,
        set: Vec<SqlValue<'_>>,
        version: Option<i64>,
    ) -> Result<TransitionStep<M>, IdemError> {
        let spec = self.spec;
        let sql = spec.sql.get(conn.dialect());
        // Update binds: target, set values, key, from states, expected version.
        let mut args = Vec::with_capacity(3 + set.len() + spec.from.len());
        args.push(SqlValue::Text(spec.to.into()));
        args.extend(set.iter().cloned());
        args.push(key.clone());
        args.extend(spec.from.iter().map(|f| SqlValue::Text((*f).into())));
        if spec.shape.versioned {
            args.push(version.map_or(SqlValue::Null, SqlValue::Int));
        }
        let mut read_args = Vec::with_capacity(2 + spec.shape.matches.len());
        read_args.push(SqlValue::Text(spec.to.into()));
        for column in spec.shape.matches {
            if let Some(i) = spec.shape.set.iter().position(|c| c == column) {
                read_args.push(set[i].clone());
            }
        }
        read_args.push(key);
        let savepoint = Savepoint::transition();
        conn.execute_unprepared(&savepoint.open()).await?;
        let mut updated_again = false;
        let row = loop {
            let rows = match conn.execute(sql.update.as_str(), &args).await {
                Ok(rows) => rows,
                Err(e) => return Err(abort(conn, &savepoint, e).await),
            };
            match rows {
                1 => return Ok(TransitionStep::Apply(TransitionGuard(savepoint))),
                0 => {}
                n => {
                    let e = IdemError::store(format!(
                        "the key matched {n} rows of `{}`; the machine's key column `{}` must be unique",
                        M::TABLE,
                        M::KEY_COLUMN
                    ));
                    return Err(abort(conn, &savepoint, e).await);
                }
            }
            // No row moved: read it (locked, in the same transaction) to tell why.
            let row = match conn
                .read_state(sql.read.as_str(), &read_args, M::VERSION_COLUMN.is_some())
                .await
            {
                Ok(row) => row,
                Err(e) => return Err(abort(conn, &savepoint, e).await),
            };
            // Under READ COMMITTED the locking read sees a newer row than the update's snapshot
            // did: a row that moved into a `from` state just now reads as movable. Update once more.
            let movable = row.as_ref().is_some_and(|row| {
                spec.from.contains(&row.status.as_str())
                    && !(spec.shape.versioned && version.is_some() && row.version != version)
            });
            if movable && !updated_again {
                updated_again = true;
                continue;
            }
            break row;
        };
        conn.execute_unprepared(&savepoint.release()).await?;
        let Some(row) = row else {
            return Ok(TransitionStep::Done(Done::NotFound));
        };
        if row.already {
            return Ok(TransitionStep::Done(Done::AlreadyApplied));
        }
        let current = M::parse(&row.status).ok_or_else(|| {
            IdemError::store(format!(
                "column `{}` of `{}` holds `{}`, which is no state of `{}`",
                M::STATUS_COLUMN,
                M::TABLE,
                row.status,
                M::NAME
            ))
        })?;
        if let (Some(expected), Some(version)) = (version, row.version)
            && spec.shape.versioned
            && spec.from.contains(&row.status.as_str())
            && version != expected
        {
            return Ok(TransitionStep::Done(Done::VersionConflict(
                current, version,
            )));
        }
        Ok(TransitionStep::Done(Done::Rejected(current)))
    }

    /// After the body: keeps the move and the body's writes (release the savepoint) when it
    /// returned `Ok`, undoes them when it returned `Err` (which is returned as is).
    ///
    /// # Errors
    /// The body's error, or the database's converted into `E`.
    pub async fn finish<T, E, C: TransitionConn + ?Sized>(
        &self,
        guard: TransitionGuard,
        conn: &mut C,
        err: ErrType<E>,
        out: Result<T, E>,
    ) -> Result<Transition<T, M>, E> {
        match out {
            Ok(value) => match conn.execute_unprepared(&guard.0.release()).await {
                Ok(_) => {
                    self.outcome.set(Some(Outcome::Executed));
                    Ok(Transition::Applied(value))
                }
                Err(e) => {
                    self.outcome.set(Some(Outcome::Rejected));
                    Err(err.from_idem(e))
                }
            },
            Err(error) => {
                self.outcome.set(Some(Outcome::Failed));
                // The body's error is what the caller needs; a failed rollback-to-savepoint also
                // fails the enclosing transaction's commit.
                let _ = abort(conn, &guard.0, IdemError::store("")).await;
                Err(error)
            }
        }
    }

    /// Ends a transaction begun by [`TransitionCall::begin`]: commits when the call succeeded,
    /// rolls back when it failed.
    ///
    /// # Errors
    /// The call's error, or the commit's converted into `E`.
    pub async fn end<T, E>(
        &self,
        tx: Box<dyn TransitionTx>,
        err: ErrType<E>,
        result: Result<Transition<T, M>, E>,
    ) -> Result<Transition<T, M>, E> {
        match result {
            Ok(outcome) => match tx.commit().await {
                Ok(()) => Ok(outcome),
                Err(e) => {
                    self.outcome.set(Some(Outcome::Rejected));
                    Err(err.from_idem(e))
                }
            },
            Err(error) => {
                if let Err(e) = tx.rollback().await {
                    tracing::warn!(error = %e, "could not roll back the transition's transaction");
                }
                Err(error)
            }
        }
    }
}

/// Rolls the savepoint back after `e`, and returns `e`.
async fn abort<C: TransitionConn + ?Sized>(
    conn: &mut C,
    savepoint: &Savepoint,
    e: IdemError,
) -> IdemError {
    if conn.execute_unprepared(&savepoint.rollback()).await.is_ok() {
        let _ = conn.execute_unprepared(&savepoint.release()).await;
    }
    e
}
