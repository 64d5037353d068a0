//! The DynamoDB store (feature `dynamodb`): [`DynamoStore`], one item per record in one table,
//! through the official AWS SDK for Rust.
//!
//! DynamoDB has no clock a condition can read, so every decision is taken in Rust, by the
//! caller's clock, with the decision table every store shares (`store::decide`), and written with
//! a condition on what was read: a new record with `attribute_not_exists(pk)`, a take with the
//! fence and version it read (`rf = :f AND rv = :v`), a mark with `rs = PROCESSING AND rf = :f`.
//! A write whose condition fails hands back the item that refused it
//! (`ReturnValuesOnConditionCheckFailure = ALL_OLD`), so a claim that meets a record decides on it
//! without another read. Leases and expiry of records written by others are judged with a skew
//! margin (see [`DynamoStore::with_skew_margin`]).

mod batch;
mod claims;
mod connect;
mod error;
mod item;
mod marks;
mod requests;
mod scan;
mod tokens;

pub use tokens::DynamoTokens;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;

use crate::IdemError;
use crate::clock::ClockOffset;
use crate::store::decide::millis;
use crate::store::order::ClaimOrder;
use crate::store::{
    BatchClaim, BatchMark, Claim, ClaimOutcome, ClaimRequest, KeyPage, Limits, Record, StatusCount,
    Store,
};

/// The skew margin of a store that is not given one: 100 ms, ten times what NTP keeps servers of
/// one network within (see [`DynamoStore::with_skew_margin`]).
pub const DEFAULT_SKEW_MARGIN: Duration = Duration::from_millis(100);

/// Keeps records in a DynamoDB table, one item per record, through the AWS SDK for Rust.
///
/// ```no_run
/// # use idem_runtime as idem;
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// let store = idem::DynamoStore::connect("dynamodb://idem_records?region=eu-west-1").await?;
/// store.migrate().await?; // creates the table, its stuck index and its TTL if missing
/// idem::register_store("orders", store);
/// # Ok(()) }
/// ```
///
/// **Clock.** DynamoDB has no clock a condition can read: a claim reads the record (or the item a
/// refused write hands back), decides by the caller's clock, and writes on condition that the
/// record is still what it read. A lease or an expiry written by another caller is judged with
/// a skew margin ([`DEFAULT_SKEW_MARGIN`], [`DynamoStore::with_skew_margin`]): a caller takes a
/// record over, or counts it expired, only once its own clock is past the lease end (the expiry)
/// by the margin. So callers whose clocks differ by less than the margin never cut a live lease
/// short; a larger difference cuts it short by the excess. Fences are the caller's clock in
/// microseconds, raised above the record's last fence, so they still only grow.
///
/// **Expiry.** Each item carries DynamoDB's TTL attribute `rx` (epoch seconds: the later of its
/// expiry and lease end, plus the margin); DynamoDB deletes expired items by itself, late (within
/// days). Until then a claim treats an expired record as absent, and
/// [`Store::sweep_expired`] deletes them (a Scan: for operators and tests, not a request path).
///
/// **Reads.** Every read that decides is strongly consistent. The reconciler's list
/// ([`Store::stuck`]) reads a sparse global secondary index, `idem_stuck` (business type, lease
/// end), present only on PROCESSING records: a pass reads what is stuck, never the table. Like
/// every global secondary index it is eventually consistent, so it may list a record that has
/// just finished; the reconciler's claim decides on the record itself.
///
/// **Tokens.** [`DynamoStore::tokens`] keeps submit tokens in the same table, under partition
/// keys no record has.
///
/// **No transactions.** A call cannot claim inside the caller's own DynamoDB transaction: `tx`
/// mode is refused at compile time, as on Redis. Batches ([`Store::claim_batch`],
/// [`Store::complete_batch`]) send one conditional write per key, several at once, each with its
/// own condition.
#[derive(Clone)]
pub struct DynamoStore {
    client: Client,
    table: Arc<str>,
    /// Where requests go, for errors: "table `T` at ENDPOINT".
    place: Arc<str>,
    limits: Limits,
    offset: ClockOffset,
    skew_ms: i64,
    order: Arc<ClaimOrder>,
}

impl std::fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoStore")
            .field("place", &self.place)
            .field("skew_margin_ms", &self.skew_ms)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Store for DynamoStore {
    fn backend(&self) -> &'static str {
        "dynamodb"
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        let outcome = self.claim_one(req).await?;
        self.order.observe(&outcome);
        Ok(outcome)
    }

    /// One claim per key, up to 32 in flight at once, each with its own condition.
    async fn claim_batch(&self, batch: &BatchClaim<'_>) -> Result<Vec<ClaimOutcome>, IdemError> {
        batch::claim_batch(self, batch).await
    }

    /// One conditional write per mark, up to 32 in flight at once.
    async fn complete_batch(
        &self,
        biz: &str,
        marks: &[BatchMark<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<(), IdemError>>, IdemError> {
        batch::complete_batch(self, biz, marks, ttl).await
    }

    async fn complete(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
    ) -> Result<(), IdemError> {
        self.mark(biz, key, claim, snapshot, ttl, None).await
    }

    async fn complete_keeping(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Duration,
    ) -> Result<(), IdemError> {
        self.mark(biz, key, claim, snapshot, ttl, Some(result_ttl))
            .await
    }

    async fn fail(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        self.fail_one(biz, key, claim).await
    }

    async fn renew(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        let lease_until = self.now_ms().saturating_add(millis(lease));
        self.lease_to(biz, key, claim, lease_until).await
    }

    /// Ends the lease two skew margins ago, so every caller whose clock is within the margin of
    /// this one (behind it too) may take it over at once.
    async fn release(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        let ended = self.judged_at(self.judged_at(self.now_ms()));
        self.lease_to(biz, key, claim, ended).await
    }

    async fn save_steps(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        self.save_steps_of(biz, key, claim, steps).await
    }

    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        Ok(self.get(biz, key).await?.map(|s| s.record))
    }

    /// A Scan of the table (strongly consistent, a page at a time) for records expired by this
    /// caller's clock less the margin, each deleted on condition it is still what the page showed;
    /// and for results whose result ttl passed, each dropped the same way. DynamoDB's TTL deletes
    /// expired items by itself: in production this is for operators, not a frequent pass.
    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        scan::sweep(self, batch).await
    }

    /// A Query of the sparse index `idem_stuck` (business type, lease end), oldest lease first:
    /// no Scan.
    async fn stuck(&self, biz: &str, batch: usize) -> Result<Vec<Record>, IdemError> {
        scan::stuck(self, biz, batch).await
    }

    /// A Scan of the sparse index `idem_stuck` (only PROCESSING records are in it).
    async fn processing_biz_types(&self) -> Result<Vec<String>, IdemError> {
        scan::processing_biz_types(self).await
    }

    /// A Scan of the table.
    async fn stats(&self) -> Result<Vec<StatusCount>, IdemError> {
        scan::stats(self).await
    }

    /// A Scan of the table, `batch` items a page; the cursor is the last item's partition key. No
    /// order.
    async fn list_keys(&self, after: Option<&str>, batch: usize) -> Result<KeyPage, IdemError> {
        scan::list_keys(self, after, batch).await
    }
}
