//! The [`Store`](crate::Store) impl every SQL store shares: each record method is the record
//! layer's (`records.rs`) on one of the store's connections. A store passes what it does its own
//! way, its `claim` (the insert step, lock waits and deadlock retries differ per database).

/// `impl Store for $store`: `backend()` is `$backend`; the items in braces (at least `claim`)
/// are the store's own; the rest go through the record layer. The store provides the fields
/// `limits: Limits` and `order` (its [`ClaimOrder`](crate::store::order::ClaimOrder)) and the
/// methods `with_conn` (runs work on a warm or pooled connection), `records(conn)` (its
/// [`RecordConn`](super::records::RecordConn) on that connection), `lease_claims(conn)` (its
/// claim steps in lease mode, with a `complete_many` for batches of marks) and `begin()` (its
/// transaction, where state transitions run).
macro_rules! sql_store {
    ($store:ty, $backend:literal, { $($own:tt)* }) => {
        #[async_trait::async_trait]
        impl $crate::store::Store for $store {
            fn backend(&self) -> &'static str {
                $backend
            }

            fn limits(&self) -> &$crate::store::Limits {
                &self.limits
            }

            $($own)*

            /// One statement inserts every new key (and, once repeats prevail, one reads them
            /// all first); the keys that exist are read in one more. A batch the database picks
            /// as a deadlock victim runs again, as a claim of one key does.
            async fn claim_batch(
                &self,
                batch: &$crate::store::BatchClaim<'_>,
            ) -> Result<Vec<$crate::store::ClaimOutcome>, $crate::IdemError> {
                batch.check()?;
                let reqs: Vec<$crate::store::ClaimRequest<'_>> = batch.requests().collect();
                self.with_conn(async |conn| {
                    $crate::sql::claim::retry_deadlocks!(
                        $backend,
                        $crate::sql::claim::claim_many(
                            &mut self.lease_claims(conn),
                            &reqs,
                            &self.order,
                        )
                        .await
                    )
                })
                .await
            }

            /// Every mark in one round trip.
            async fn complete_batch(
                &self,
                biz: &str,
                marks: &[$crate::store::BatchMark<'_>],
                ttl: ::std::time::Duration,
            ) -> Result<Vec<Result<(), $crate::IdemError>>, $crate::IdemError> {
                $crate::store::batch::check_marks(marks)?;
                if marks.is_empty() {
                    return Ok(Vec::new());
                }
                self.with_conn(async |conn| {
                    self.lease_claims(conn).complete_many(biz, marks, ttl).await
                })
                .await
            }

            async fn complete(
                &self,
                biz: &str,
                key: &str,
                claim: &$crate::store::Claim,
                snapshot: &[u8],
                ttl: ::std::time::Duration,
            ) -> Result<(), $crate::IdemError> {
                self.with_conn(async |conn| {
                    let mut records = self.records(conn);
                    records.complete(biz, key, claim, snapshot, ttl, None).await
                })
                .await
            }

            async fn complete_keeping(
                &self,
                biz: &str,
                key: &str,
                claim: &$crate::store::Claim,
                snapshot: &[u8],
                ttl: ::std::time::Duration,
                result_ttl: ::std::time::Duration,
            ) -> Result<(), $crate::IdemError> {
                self.with_conn(async |conn| {
                    let mut records = self.records(conn);
                    records.complete(biz, key, claim, snapshot, ttl, Some(result_ttl)).await
                })
                .await
            }

            async fn fail(
                &self,
                biz: &str,
                key: &str,
                claim: &$crate::store::Claim,
            ) -> Result<(), $crate::IdemError> {
                self.with_conn(async |conn| self.records(conn).fail(biz, key, claim).await)
                    .await
            }

            async fn renew(
                &self,
                biz: &str,
                key: &str,
                claim: &$crate::store::Claim,
                lease: ::std::time::Duration,
            ) -> Result<(), $crate::IdemError> {
                self.with_conn(async |conn| self.records(conn).renew(biz, key, claim, lease).await)
                    .await
            }

            async fn save_steps(
                &self,
                biz: &str,
                key: &str,
                claim: &$crate::store::Claim,
                steps: &[u8],
            ) -> Result<(), $crate::IdemError> {
                self.with_conn(async |conn| {
                    self.records(conn).save_steps(biz, key, claim, steps).await
                })
                .await
            }

            async fn load(
                &self,
                biz: &str,
                key: &str,
            ) -> Result<Option<$crate::store::Record>, $crate::IdemError> {
                self.with_conn(async |conn| self.records(conn).load(biz, key).await)
                    .await
            }

            async fn sweep_expired(&self, batch: usize) -> Result<u64, $crate::IdemError> {
                self.with_conn(async |conn| self.records(conn).sweep(batch).await)
                    .await
            }

            async fn stuck(
                &self,
                biz: &str,
                batch: usize,
            ) -> Result<Vec<$crate::store::Record>, $crate::IdemError> {
                self.with_conn(async |conn| self.records(conn).stuck(biz, batch).await)
                    .await
            }

            async fn processing_biz_types(&self) -> Result<Vec<String>, $crate::IdemError> {
                self.with_conn(async |conn| self.records(conn).processing_biz_types().await)
                    .await
            }

            /// A range of the primary key per page, in its order. The batch and the cursor are
            /// checked before a connection is taken.
            async fn list_keys(
                &self,
                after: Option<&str>,
                batch: usize,
            ) -> Result<$crate::store::KeyPage, $crate::IdemError> {
                $crate::store::keys::check_batch(batch)?;
                if let Some(after) = after {
                    $crate::store::keys::parse_after_key(after)?;
                }
                self.with_conn(async |conn| self.records(conn).list_keys(after, batch).await)
                    .await
            }

            async fn stats(&self) -> Result<Vec<$crate::store::StatusCount>, $crate::IdemError> {
                self.with_conn(async |conn| self.records(conn).stats().await)
                    .await
            }

            async fn begin_transition(
                &self,
            ) -> Result<Box<dyn $crate::store::tx::TransitionTx>, $crate::IdemError> {
                Ok(Box::new(self.begin().await?))
            }
        }
    };
}
pub(crate) use sql_store;
