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

mod error;
mod item;
mod scan;
mod tokens;

pub use tokens::DynamoTokens;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};

use crate::clock::ClockOffset;
use crate::store::decide::{Decision, decide, duration_ms, millis, taken};
use crate::store::order::ClaimOrder;
use crate::store::{
    BatchClaim, BatchMark, Claim, ClaimOutcome, ClaimRequest, KeyPage, Limits, Record, Status,
    StatusCount, Store, keeps_steps,
};
use crate::{Busy, IdemError};
use error::dynamo_error;
use item::{NewItem, PK, Stored, b, n, record_key, s, stored};

/// The skew margin of a store that is not given one: 100 ms, ten times what NTP keeps servers of
/// one network within (see [`DynamoStore::with_skew_margin`]).
pub const DEFAULT_SKEW_MARGIN: Duration = Duration::from_millis(100);

/// The largest item DynamoDB stores is 400 KB; a record's other attributes (its key twice over,
/// fingerprint, numbers) take at most a few KB of it.
const MAX_SNAPSHOT: usize = 380 * 1000;
/// DynamoDB's longest partition key is 2048 bytes; `<n>:` and `:` frame the pair.
const MAX_PK: usize = 2048;
const PK_FRAMING: usize = 20 + 2;

/// How many times a claim reads and writes again when another caller's write came between.
const CLAIM_ROUNDS: usize = 16;
/// How many claims or marks of a batch are in flight at once.
const BATCH_CONCURRENCY: usize = 32;

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

/// A write's answer: done, or refused by its condition with the item that refused it (none when
/// the item does not exist).
enum Written {
    Done,
    Refused(Option<Stored>),
}

/// Checks a table name: 3 to 255 of letters, digits, `_`, `-`, `.` (DynamoDB's rule).
fn valid_table(name: &str) -> Result<(), IdemError> {
    if (3..=255).contains(&name.len())
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'))
    {
        Ok(())
    } else {
        Err(IdemError::InvalidOptions {
            reason: format!(
                "`{}` is not a DynamoDB table name: 3 to 255 of letters, digits, `_`, `-`, `.`",
                name.escape_default()
            ),
        })
    }
}

/// Checks `limits` against what a DynamoDB item holds.
fn check_dynamo_limits(limits: &Limits) -> Result<(), IdemError> {
    crate::store::check_one_key_limits(
        "a DynamoDB item",
        "a DynamoDB partition key",
        limits,
        MAX_PK - PK_FRAMING,
        MAX_SNAPSHOT,
        "",
    )
}

/// Whether `endpoint` is on this machine (`localhost`, `127.x`, `[::1]`).
fn is_local(endpoint: &str) -> bool {
    url::Url::parse(endpoint).is_ok_and(|u| match u.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    })
}

/// A random tag for one taking write.
fn new_writer() -> String {
    let r = getrandom::u64().unwrap_or_else(|_| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    format!("{r:016x}")
}

impl DynamoStore {
    /// Opens the table a `dynamodb://TABLE?region=REGION&endpoint=URL` URL names (both query
    /// options may be left out): the region from the URL, else the SDK's environment
    /// (`AWS_REGION`, the profile); the endpoint from the URL, else AWS's for the region.
    /// Credentials come from the SDK's default chain (environment, profile, web identity,
    /// container, instance metadata), except for an endpoint on this machine (a local DynamoDB
    /// or a test server) with no `AWS_ACCESS_KEY_ID` in the environment: there static dummy
    /// credentials are used, and the region defaults to `us-east-1`. Requests connect within
    /// [`crate::connect::DEFAULT_CONNECT_TIMEOUT`], each attempt is answered within 10 s and each
    /// request, the SDK's retries included, within 20 s (a call's own store timeout,
    /// [`crate::store::DEFAULT_STORE_TIMEOUT`], bounds each of its steps sooner).
    ///
    /// It asks DynamoDB about the table once, to know it answers (any answer will do: a missing
    /// table is no error, [`DynamoStore::migrate`] creates it).
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a URL that is not such a URL, or no region anywhere;
    /// [`IdemError::StoreUnavailable`] naming the endpoint when DynamoDB cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, IdemError> {
        Self::connect_with(url, |config| config).await
    }

    /// [`DynamoStore::connect`], with the SDK's client configuration changed by `configure`
    /// before the client is made: interceptors, retries, timeouts, credentials.
    ///
    /// # Errors
    /// As [`DynamoStore::connect`].
    pub async fn connect_with(
        url: &str,
        configure: impl FnOnce(aws_sdk_dynamodb::config::Builder) -> aws_sdk_dynamodb::config::Builder,
    ) -> Result<Self, IdemError> {
        let (table, region, endpoint) = parse_url(url)?;
        use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let timeouts = aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
            .connect_timeout(crate::DEFAULT_CONNECT_TIMEOUT)
            .operation_attempt_timeout(Duration::from_secs(10))
            .operation_timeout(Duration::from_secs(20))
            .build();
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .http_client(http)
            .timeout_config(timeouts);
        let local = endpoint.as_deref().is_some_and(is_local);
        let env = |name: &str| std::env::var(name).is_ok_and(|v| !v.is_empty());
        match region {
            Some(region) => loader = loader.region(aws_config::Region::new(region)),
            None if local && !env("AWS_REGION") && !env("AWS_DEFAULT_REGION") => {
                loader = loader.region(aws_config::Region::new("us-east-1"));
            }
            None => {}
        }
        if let Some(endpoint) = &endpoint {
            loader = loader.endpoint_url(endpoint.clone());
            if local && !env("AWS_ACCESS_KEY_ID") {
                loader = loader.credentials_provider(aws_credential_types::Credentials::new(
                    "idem-local",
                    "idem-local",
                    None,
                    None,
                    "idem-local-endpoint",
                ));
            }
        }
        let loaded = loader.load().await;
        if loaded.region().is_none() {
            return Err(IdemError::InvalidOptions {
                reason: format!(
                    "no AWS region for the DynamoDB store `{table}`: name it in the URL \
                     (`?region=eu-west-1`) or in AWS_REGION"
                ),
            });
        }
        let config = configure(aws_sdk_dynamodb::config::Builder::from(&loaded));
        let store = Self::from_client(Client::from_conf(config.build()), &table)?
            .at(endpoint.as_deref().unwrap_or("AWS"));
        store.reachable().await?;
        Ok(store)
    }

    /// The store on `table`, through a client the caller configured (credentials, region,
    /// endpoint, timeouts, interceptors). Nothing is sent.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a name DynamoDB does not take as a table name.
    pub fn from_client(client: Client, table: &str) -> Result<Self, IdemError> {
        valid_table(table)?;
        Ok(DynamoStore {
            client,
            table: table.into(),
            place: format!("table `{table}`").into(),
            limits: Limits::default(),
            offset: ClockOffset::default(),
            skew_ms: millis(DEFAULT_SKEW_MARGIN),
            order: Arc::default(),
        })
    }

    fn at(mut self, endpoint: &str) -> Self {
        self.place = format!("table `{}` at {endpoint}", self.table).into();
        self
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The same store on another table of the same account and region.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a name DynamoDB does not take as a table name.
    pub fn with_table(mut self, table: &str) -> Result<Self, IdemError> {
        valid_table(table)?;
        let endpoint = self.place.split_once(" at ").map(|(_, e)| e.to_owned());
        self.table = table.into();
        self.place = format!("table `{table}`").into();
        self.order = Arc::default();
        Ok(match endpoint {
            Some(e) => self.at(&e),
            None => self,
        })
    }

    /// The same store with other limits, checked against what a DynamoDB item holds: a
    /// partition key of at most 2048 bytes (the business type and the key share it, with a few
    /// bytes of framing) and an item of at most 400 KB (a snapshot of at most 380,000 bytes).
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] naming the limit DynamoDB cannot hold and the bound.
    pub fn with_limits(mut self, limits: Limits) -> Result<Self, IdemError> {
        check_dynamo_limits(&limits)?;
        self.limits = limits;
        Ok(self)
    }

    /// The same store judging leases and expiries written by other callers with this margin
    /// (default [`DEFAULT_SKEW_MARGIN`], 100 ms; at most 1 hour): a record is taken over, counted
    /// expired, swept or listed as stuck only once this caller's clock is past its lease end (its
    /// expiry) by the margin; a refused claim's `retry_after` is the lease left by this caller's
    /// clock, then the margin left. Give it the largest difference expected between the clocks
    /// of any two callers (NTP keeps servers within milliseconds; a clock that is not kept needs
    /// more). A lease given up ([`Store::release`]) ends two margins in the past, so any caller
    /// within the margin can take it over at once.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a margin over an hour.
    pub fn with_skew_margin(mut self, margin: Duration) -> Result<Self, IdemError> {
        if margin > Duration::from_secs(3600) {
            return Err(IdemError::InvalidOptions {
                reason: format!(
                    "a skew margin of {margin:?} is more than an hour: give the largest clock \
                     difference expected between callers"
                ),
            });
        }
        self.skew_ms = millis(margin);
        Ok(self)
    }

    /// The skew margin leases and expiries are judged with.
    pub fn skew_margin(&self) -> Duration {
        duration_ms(self.skew_ms)
    }

    /// The same store on a [`TestClock`](crate::TestClock) (feature `test-util`): every decision
    /// reads this process's clock plus the test clock's offset.
    #[cfg(any(test, feature = "test-util"))]
    pub fn with_test_clock(mut self, clock: crate::clock::TestClock) -> Self {
        self.offset = ClockOffset::new(clock);
        self
    }

    /// Creates the table if it is missing, on demand capacity: the partition key `pk`, the sparse
    /// index `idem_stuck` (`sb`, `sl`) and DynamoDB's TTL on `rx`; waits (up to a minute) until it
    /// is active. A table that exists is checked for the index and its TTL turned on.
    ///
    /// # Errors
    /// [`IdemError::StoreSchema`] for an existing table without the index; backend errors as for
    /// [`Store::claim`].
    pub async fn migrate(&self) -> Result<(), IdemError> {
        scan::migrate(self).await
    }

    /// DescribeTable: reachable when DynamoDB answers, whatever it answers (a missing table, or
    /// a policy that does not allow DescribeTable, is no reason to refuse the store).
    async fn reachable(&self) -> Result<(), IdemError> {
        match self
            .client
            .describe_table()
            .table_name(&*self.table)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(aws_sdk_dynamodb::error::SdkError::ServiceError(_)) => Ok(()),
            Err(e) => Err(dynamo_error(&self.place, e)),
        }
    }

    /// The caller's clock in microseconds since the Unix epoch, plus a test clock's offset.
    fn now_us(&self) -> i64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        match self.offset.ms() {
            0 => now,
            ms => now.saturating_add(ms.saturating_mul(1000)),
        }
    }

    fn now_ms(&self) -> i64 {
        self.now_us().div_euclid(1000)
    }

    /// The time records written by others are judged at: now less the skew margin.
    fn judged_at(&self, now_ms: i64) -> i64 {
        now_ms.saturating_sub(self.skew_ms)
    }

    fn key_of(biz: &str, key: &str) -> HashMap<String, AttributeValue> {
        HashMap::from([(PK.to_owned(), s(record_key(biz, key)))])
    }

    /// A strongly consistent read of the record.
    async fn get(&self, biz: &str, key: &str) -> Result<Option<Stored>, IdemError> {
        let out = self
            .client
            .get_item()
            .table_name(&*self.table)
            .set_key(Some(Self::key_of(biz, key)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| dynamo_error(&self.place, e))?;
        out.item().map(stored).transpose()
    }

    /// Puts `item` on `condition` (with `values`).
    async fn put(
        &self,
        item: HashMap<String, AttributeValue>,
        condition: &str,
        values: Option<HashMap<String, AttributeValue>>,
    ) -> Result<Written, IdemError> {
        let sent = self
            .client
            .put_item()
            .table_name(&*self.table)
            .set_item(Some(item))
            .condition_expression(condition)
            .set_expression_attribute_values(values)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match sent {
            Ok(_) => Ok(Written::Done),
            Err(e) => match e.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(c)) => {
                    Ok(Written::Refused(c.item().map(stored).transpose()?))
                }
                _ => Err(dynamo_error(&self.place, e)),
            },
        }
    }

    /// Updates the record with `update` on `condition`.
    async fn update(
        &self,
        biz: &str,
        key: &str,
        update: &str,
        condition: &str,
        values: HashMap<String, AttributeValue>,
    ) -> Result<Written, IdemError> {
        let sent = self
            .client
            .update_item()
            .table_name(&*self.table)
            .set_key(Some(Self::key_of(biz, key)))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match sent {
            Ok(_) => Ok(Written::Done),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                    Ok(Written::Refused(c.item().map(stored).transpose()?))
                }
                _ => Err(dynamo_error(&self.place, e)),
            },
        }
    }

    /// Deletes the record on `condition`; whether it was deleted.
    async fn delete(
        &self,
        biz: &str,
        key: &str,
        condition: &str,
        values: HashMap<String, AttributeValue>,
    ) -> Result<bool, IdemError> {
        let sent = self
            .client
            .delete_item()
            .table_name(&*self.table)
            .set_key(Some(Self::key_of(biz, key)))
            .condition_expression(condition)
            .set_expression_attribute_values(Some(values))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(true),
            Err(e) => match e.as_service_error() {
                Some(DeleteItemError::ConditionalCheckFailedException(_)) => Ok(false),
                _ => Err(dynamo_error(&self.place, e)),
            },
        }
    }

    /// The claim: a conditional write, and on a refusal the decision table on the item that
    /// refused it, until one write lands or the table answers without one.
    async fn claim_one(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        use crate::store::Acquired;
        let writer = new_writer();
        // Read first when recent claims mostly met a record (a replay is then one read).
        let mut known: Option<Option<Stored>> = if self.order.read_first() {
            Some(self.get(req.biz, req.key).await?)
        } else {
            None
        };
        for _ in 0..CLAIM_ROUNDS {
            let now_us = self.now_us();
            let now_ms = now_us.div_euclid(1000);
            let Some(Some(old)) = known.take() else {
                // No record (or not read yet): insert one, if there still is none.
                let t = taken(None, true, now_us, req.lease, req.ttl);
                let item = NewItem {
                    biz: req.biz,
                    key: req.key,
                    attempt: t.attempt,
                    fence: t.fence,
                    fingerprint: req.fingerprint,
                    steps: None,
                    lease_until_ms: t.lease_until_ms,
                    expire_at_ms: t.expire_at_ms,
                    version: 1,
                    writer: &writer,
                    skew_ms: self.skew_ms,
                };
                match self
                    .put(item.item(), "attribute_not_exists(pk)", None)
                    .await?
                {
                    Written::Done => return Ok(acquired(t.attempt, t.fence, Acquired::Fresh)),
                    Written::Refused(Some(found)) if found.writer.as_deref() == Some(&writer) => {
                        // Our own write, sent again by the SDK after its reply was lost.
                        return Ok(acquired(t.attempt, t.fence, Acquired::Fresh));
                    }
                    Written::Refused(Some(found)) => known = Some(Some(found)),
                    Written::Refused(None) => known = Some(self.get(req.biz, req.key).await?),
                }
                continue;
            };
            let judged = self.judged_at(now_ms);
            match decide(&old.state(), req.fingerprint, judged) {
                Decision::Take { how, reset } => {
                    let rec = &old.record;
                    let steps = if keeps_steps(reset, rec.fingerprint.as_deref(), req.fingerprint) {
                        rec.steps.as_deref()
                    } else {
                        None
                    };
                    let t = taken(
                        Some((rec.attempt, rec.fence.get(), rec.expire_at_ms)),
                        reset,
                        now_us,
                        req.lease,
                        req.ttl,
                    );
                    let item = NewItem {
                        biz: req.biz,
                        key: req.key,
                        attempt: t.attempt,
                        fence: t.fence,
                        fingerprint: req.fingerprint,
                        steps,
                        lease_until_ms: t.lease_until_ms,
                        expire_at_ms: t.expire_at_ms,
                        version: old.version.saturating_add(1),
                        writer: &writer,
                        skew_ms: self.skew_ms,
                    };
                    let values = HashMap::from([
                        (":f".to_owned(), n(rec.fence.get())),
                        (":v".to_owned(), n(old.version)),
                    ]);
                    match self
                        .put(item.item(), "rf = :f AND rv = :v", Some(values))
                        .await?
                    {
                        Written::Done => return Ok(acquired(t.attempt, t.fence, how)),
                        Written::Refused(Some(found))
                            if found.writer.as_deref() == Some(&writer) =>
                        {
                            return Ok(acquired(t.attempt, t.fence, how));
                        }
                        Written::Refused(found) => known = Some(found),
                    }
                }
                Decision::Replay => {
                    return Ok(ClaimOutcome::Replay {
                        snapshot: old.record.snapshot.unwrap_or_default(),
                    });
                }
                Decision::ResultGone => return Ok(ClaimOutcome::ResultGone),
                Decision::Mismatch => return Ok(ClaimOutcome::Mismatch),
                Decision::InProgress(_) => {
                    // The lease left by this caller's clock; past its end, the margin left.
                    let lu = old.record.lease_until_ms;
                    let left = if lu > now_ms {
                        lu - now_ms
                    } else {
                        lu.saturating_add(self.skew_ms) - now_ms
                    };
                    return Ok(ClaimOutcome::InProgress {
                        retry_after: duration_ms(left.max(1)),
                    });
                }
            }
        }
        Err(IdemError::busy(
            Busy::Locked,
            format!(
                "DynamoDB {}: the record changed under {CLAIM_ROUNDS} claims in a row",
                self.place
            ),
        ))
    }

    /// Whether a refused mark is one that landed before (the record is `done` under the claim's
    /// fence: the same mark sent again), else `LeaseLost`.
    fn settled(found: Option<&Stored>, claim: &Claim, done: Status) -> Result<(), IdemError> {
        match found {
            Some(f) if f.record.fence == claim.fence && f.record.status == done => Ok(()),
            _ => Err(IdemError::LeaseLost {
                attempt: claim.attempt,
            }),
        }
    }

    /// The mark of success; the result kept until `result_ttl` from now, or as long as the
    /// record.
    async fn mark(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Option<Duration>,
    ) -> Result<(), IdemError> {
        let now = self.now_ms();
        let expire_at = now.saturating_add(millis(ttl));
        let mut values = HashMap::from([
            (":p".to_owned(), s(Status::Processing.as_str())),
            (":s".to_owned(), s(Status::Succeeded.as_str())),
            (":f".to_owned(), n(claim.fence.get())),
            (":r".to_owned(), b(snapshot)),
            (":one".to_owned(), n(1)),
        ]);
        let (kept_set, kept_remove) = match result_ttl {
            Some(kept) => {
                values.insert(":u".to_owned(), n(now.saturating_add(millis(kept))));
                (", ru = :u", "")
            }
            None => ("", ", ru"),
        };
        // The expiry moves to now + ttl unless it is later already: one write when it is not (the
        // usual case), a second without the expiry when the first finds it later.
        let mut with_expiry = values.clone();
        with_expiry.insert(":e".to_owned(), n(expire_at));
        with_expiry.insert(
            ":x".to_owned(),
            n(item::delete_after(expire_at, 0, self.skew_ms)),
        );
        let update = format!(
            "SET rs = :s, rr = :r, re = :e, rx = :x, rv = rv + :one{kept_set} REMOVE sb, sl{kept_remove}"
        );
        let found = match self
            .update(
                biz,
                key,
                &update,
                "rs = :p AND rf = :f AND re <= :e",
                with_expiry,
            )
            .await?
        {
            Written::Done => return Ok(()),
            Written::Refused(found) => found,
        };
        let later = found.as_ref().is_some_and(|f| {
            f.record.fence == claim.fence
                && f.record.status == Status::Processing
                && f.record.expire_at_ms > expire_at
        });
        if !later {
            return Self::settled(found.as_ref(), claim, Status::Succeeded);
        }
        let update =
            format!("SET rs = :s, rr = :r, rv = rv + :one{kept_set} REMOVE sb, sl{kept_remove}");
        match self
            .update(biz, key, &update, "rs = :p AND rf = :f", values)
            .await?
        {
            Written::Done => Ok(()),
            Written::Refused(found) => Self::settled(found.as_ref(), claim, Status::Succeeded),
        }
    }

    /// Moves the lease of a claim still held to end at `lease_until` (ms), and the record's
    /// expiry with it when it would end first.
    async fn lease_to(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease_until: i64,
    ) -> Result<(), IdemError> {
        let values = HashMap::from([
            (":p".to_owned(), s(Status::Processing.as_str())),
            (":f".to_owned(), n(claim.fence.get())),
            (":l".to_owned(), n(lease_until)),
            (":one".to_owned(), n(1)),
        ]);
        let found = match self
            .update(
                biz,
                key,
                "SET rl = :l, sl = :l, rv = rv + :one",
                "rs = :p AND rf = :f AND re >= :l",
                values.clone(),
            )
            .await?
        {
            Written::Done => return Ok(()),
            Written::Refused(found) => found,
        };
        let held = found.as_ref().is_some_and(|f| {
            f.record.fence == claim.fence && f.record.status == Status::Processing
        });
        if !held {
            return Err(IdemError::LeaseLost {
                attempt: claim.attempt,
            });
        }
        let mut values = values;
        values.insert(
            ":x".to_owned(),
            n(item::delete_after(lease_until, lease_until, self.skew_ms)),
        );
        match self
            .update(
                biz,
                key,
                "SET rl = :l, sl = :l, re = :l, rx = :x, rv = rv + :one",
                "rs = :p AND rf = :f",
                values,
            )
            .await?
        {
            Written::Done => Ok(()),
            Written::Refused(_) => Err(IdemError::LeaseLost {
                attempt: claim.attempt,
            }),
        }
    }
}

fn acquired(attempt: u32, fence: u64, how: crate::store::Acquired) -> ClaimOutcome {
    ClaimOutcome::Acquired {
        claim: Claim {
            attempt,
            fence: crate::store::Fence::new(fence),
        },
        how,
    }
}

/// `dynamodb://TABLE?region=R&endpoint=URL`: the table, the region and the endpoint.
fn parse_url(url: &str) -> Result<(String, Option<String>, Option<String>), IdemError> {
    let invalid = |why: &str| IdemError::InvalidOptions {
        reason: format!(
            "`{url}` is not a DynamoDB store URL: {why}; write \
             `dynamodb://TABLE?region=REGION&endpoint=URL` (region and endpoint optional)"
        ),
    };
    let rest = url
        .split_once("://")
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("dynamodb"))
        .map(|(_, rest)| rest)
        .ok_or_else(|| invalid("it does not start with `dynamodb://`"))?;
    let (table, query) = rest.split_once('?').unwrap_or((rest, ""));
    let table = table.strip_suffix('/').unwrap_or(table);
    if table.is_empty() {
        return Err(invalid("it names no table"));
    }
    valid_table(table)?;
    let (mut region, mut endpoint) = (None, None);
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match &*name {
            "region" => region = Some(value.into_owned()),
            "endpoint" => {
                if url::Url::parse(&value).is_err() {
                    return Err(invalid("its endpoint is not a URL"));
                }
                endpoint = Some(value.into_owned());
            }
            other => {
                return Err(invalid(&format!(
                    "`{other}` is not one of its options (region, endpoint)"
                )));
            }
        }
    }
    Ok((table.to_owned(), region, endpoint))
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
        use futures_util::{StreamExt, TryStreamExt};
        batch.check()?;
        let requests: Vec<ClaimRequest<'_>> = batch.requests().collect();
        // The futures gathered first: a stream over a closure is not `Send` for every lifetime.
        let claims: Vec<_> = requests.iter().map(|req| self.claim(req)).collect();
        futures_util::stream::iter(claims)
            .buffered(BATCH_CONCURRENCY)
            .try_collect()
            .await
    }

    /// One conditional write per mark, up to 32 in flight at once.
    async fn complete_batch(
        &self,
        biz: &str,
        marks: &[BatchMark<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<(), IdemError>>, IdemError> {
        use futures_util::StreamExt;
        crate::store::batch::check_marks(marks)?;
        let writes: Vec<_> = marks
            .iter()
            .map(|m| self.mark(biz, m.key, &m.claim, m.snapshot, ttl, m.result_ttl))
            .collect();
        let answers: Vec<Result<(), IdemError>> = futures_util::stream::iter(writes)
            .buffered(BATCH_CONCURRENCY)
            .collect()
            .await;
        let mut out = Vec::with_capacity(answers.len());
        for answer in answers {
            match answer {
                Err(e @ IdemError::LeaseLost { .. }) => out.push(Err(e)),
                Err(e) => return Err(e),
                Ok(()) => out.push(Ok(())),
            }
        }
        Ok(out)
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
        let values = HashMap::from([
            (":p".to_owned(), s(Status::Processing.as_str())),
            (":s".to_owned(), s(Status::Failed.as_str())),
            (":f".to_owned(), n(claim.fence.get())),
            (":one".to_owned(), n(1)),
        ]);
        match self
            .update(
                biz,
                key,
                "SET rs = :s, rv = rv + :one REMOVE sb, sl",
                "rs = :p AND rf = :f",
                values,
            )
            .await?
        {
            Written::Done => Ok(()),
            Written::Refused(found) => Self::settled(found.as_ref(), claim, Status::Failed),
        }
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
        let values = HashMap::from([
            (":p".to_owned(), s(Status::Processing.as_str())),
            (":f".to_owned(), n(claim.fence.get())),
            (":r".to_owned(), b(steps)),
            (":one".to_owned(), n(1)),
        ]);
        match self
            .update(
                biz,
                key,
                "SET rr = :r, rv = rv + :one",
                "rs = :p AND rf = :f",
                values,
            )
            .await?
        {
            Written::Done => Ok(()),
            Written::Refused(_) => Err(IdemError::LeaseLost {
                attempt: claim.attempt,
            }),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_table_a_region_and_an_endpoint() {
        let (t, r, e) =
            parse_url("dynamodb://idem_records?region=eu-west-1&endpoint=http://127.0.0.1:8000")
                .unwrap();
        assert_eq!(t, "idem_records");
        assert_eq!(r.as_deref(), Some("eu-west-1"));
        assert_eq!(e.as_deref(), Some("http://127.0.0.1:8000"));
        let (t, r, e) = parse_url("dynamodb://Records.v2").unwrap();
        assert_eq!((t.as_str(), r, e), ("Records.v2", None, None));
        for bad in [
            "dynamodb://",
            "dynamodb://ab",
            "dynamodb://t!x",
            "dynamodb://tab?idem_table=x",
            "dynamodb://tab?endpoint=nope",
            "redis://tab",
        ] {
            assert!(
                matches!(parse_url(bad), Err(IdemError::InvalidOptions { .. })),
                "{bad}"
            );
        }
        assert!(is_local("http://127.0.0.1:8000"));
        assert!(is_local("http://localhost:8000"));
        assert!(is_local("http://[::1]:8000"));
        assert!(!is_local("https://dynamodb.eu-west-1.amazonaws.com"));
    }

    #[test]
    fn limits_past_an_item_are_refused() {
        assert!(check_dynamo_limits(&Limits::default()).is_ok());
        for (limits, names) in [
            (
                Limits {
                    max_snapshot_len: MAX_SNAPSHOT + 1,
                    ..Limits::default()
                },
                "max_snapshot_len",
            ),
            (
                Limits {
                    max_key_len: 2000,
                    max_biz_len: 100,
                    ..Limits::default()
                },
                "max_biz_len + max_key_len",
            ),
        ] {
            let err = check_dynamo_limits(&limits).unwrap_err();
            assert!(err.to_string().contains(names), "{err}");
        }
    }
}
