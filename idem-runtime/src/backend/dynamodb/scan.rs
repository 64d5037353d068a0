//! What reads more than one record: the migration, the sweep, the stuck list, the counts and the
//! walk of the keys.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, GlobalSecondaryIndex, IndexStatus,
    KeySchemaElement, KeyType, Projection, ProjectionType, ScalarAttributeType, TableStatus,
    TimeToLiveSpecification, TimeToLiveStatus,
};

use super::DynamoStore;
use super::error::dynamo_error;
use super::item::{
    BIZ, DELETE_AFTER, FINGERPRINT, KEY, PK, RESULT_UNTIL, STATUS, STUCK_BIZ, STUCK_INDEX,
    STUCK_LEASE, n, parse_record_key, s, stored,
};
use super::requests::Written;
use super::tokens::TOKEN_PREFIX;

/// Whether `item` is a submit token, not a record.
fn is_token(item: &HashMap<String, AttributeValue>) -> bool {
    matches!(item.get(PK), Some(AttributeValue::S(pk)) if pk.starts_with(TOKEN_PREFIX))
}
use crate::IdemError;
use crate::store::decide::RESULT_DROPPED;
use crate::store::keys::{check_batch, not_a_cursor};
use crate::store::{KeyPage, Record, Status, StatusCount};

fn built<T>(what: &str, r: Result<T, aws_sdk_dynamodb::error::BuildError>) -> Result<T, IdemError> {
    r.map_err(|e| IdemError::store(format!("building the DynamoDB {what}: {e}")))
}

fn attribute(name: &str, kind: ScalarAttributeType) -> Result<AttributeDefinition, IdemError> {
    built(
        "table's attributes",
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(kind)
            .build(),
    )
}

fn key_part(name: &str, kind: KeyType) -> Result<KeySchemaElement, IdemError> {
    built(
        "table's key",
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build(),
    )
}

/// See [`DynamoStore::migrate`].
pub(super) async fn migrate(store: &DynamoStore) -> Result<(), IdemError> {
    let client = &store.client;
    let index = built(
        "stuck index",
        GlobalSecondaryIndex::builder()
            .index_name(STUCK_INDEX)
            .key_schema(key_part(STUCK_BIZ, KeyType::Hash)?)
            .key_schema(key_part(STUCK_LEASE, KeyType::Range)?)
            .projection(
                Projection::builder()
                    .projection_type(ProjectionType::All)
                    .build(),
            )
            .build(),
    )?;
    let created = client
        .create_table()
        .table_name(&*store.table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attribute(PK, ScalarAttributeType::S)?)
        .attribute_definitions(attribute(STUCK_BIZ, ScalarAttributeType::S)?)
        .attribute_definitions(attribute(STUCK_LEASE, ScalarAttributeType::N)?)
        .key_schema(key_part(PK, KeyType::Hash)?)
        .global_secondary_indexes(index)
        .send()
        .await;
    if let Err(e) = created {
        let exists = e
            .as_service_error()
            .is_some_and(|e| e.is_resource_in_use_exception());
        if !exists {
            return Err(dynamo_error(&store.place, e));
        }
    }
    // Active, with its index.
    let mut waited = Duration::ZERO;
    loop {
        let described = client
            .describe_table()
            .table_name(&*store.table)
            .send()
            .await
            .map_err(|e| dynamo_error(&store.place, e))?;
        let table = described.table();
        let indexes = table
            .map(|t| t.global_secondary_indexes())
            .unwrap_or_default();
        let stuck = indexes.iter().find(|i| i.index_name() == Some(STUCK_INDEX));
        let Some(stuck) = stuck else {
            return Err(IdemError::StoreSchema {
                hint: format!(
                    "the table has no global secondary index `{STUCK_INDEX}` (hash `{STUCK_BIZ}` \
                     S, range `{STUCK_LEASE}` N, all attributes): add it, or give the store a \
                     table of its own"
                ),
                source: format!("DynamoDB {}", store.place).into(),
            });
        };
        let active = table.and_then(|t| t.table_status()) == Some(&TableStatus::Active)
            && stuck
                .index_status()
                .is_none_or(|s| *s == IndexStatus::Active);
        if active {
            break;
        }
        if waited >= Duration::from_secs(60) {
            return Err(IdemError::unavailable(format!(
                "DynamoDB {}: the table is not active after a minute",
                store.place
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        waited += Duration::from_millis(500);
    }
    // DynamoDB's own expiry on `rx`.
    let ttl = client
        .describe_time_to_live()
        .table_name(&*store.table)
        .send()
        .await
        .map_err(|e| dynamo_error(&store.place, e))?;
    let on = ttl.time_to_live_description().is_some_and(|d| {
        d.attribute_name() == Some(DELETE_AFTER)
            && matches!(
                d.time_to_live_status(),
                Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)
            )
    });
    if !on {
        let spec = built(
            "TTL specification",
            TimeToLiveSpecification::builder()
                .enabled(true)
                .attribute_name(DELETE_AFTER)
                .build(),
        )?;
        client
            .update_time_to_live()
            .table_name(&*store.table)
            .time_to_live_specification(spec)
            .send()
            .await
            .map_err(|e| dynamo_error(&store.place, e))?;
    }
    Ok(())
}

/// See [`Store::sweep_expired`](crate::Store::sweep_expired) on [`DynamoStore`].
pub(super) async fn sweep(store: &DynamoStore, batch: usize) -> Result<u64, IdemError> {
    let judged = store.judged_at(store.now_ms());
    let (mut deleted, mut shrunk) = (0usize, 0usize);
    let mut start: Option<HashMap<String, AttributeValue>> = None;
    while deleted < batch || shrunk < batch {
        let page = store
            .client
            .scan()
            .table_name(&*store.table)
            .consistent_read(true)
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .map_err(|e| dynamo_error(&store.place, e))?;
        for item in page.items() {
            if is_token(item) {
                continue; // DynamoDB's TTL deletes expired tokens
            }
            let found = stored(item)?;
            let rec = &found.record;
            let unchanged = || {
                HashMap::from([
                    (":f".to_owned(), n(rec.fence.get())),
                    (":v".to_owned(), n(found.version)),
                ])
            };
            if deleted < batch && found.state().is_expired(judged) {
                if store
                    .delete(&rec.biz, &rec.key, "rf = :f AND rv = :v", unchanged())
                    .await?
                {
                    deleted += 1;
                }
            } else if shrunk < batch
                && rec.status == Status::Succeeded
                && rec
                    .result_until_ms
                    .is_some_and(|t| t != RESULT_DROPPED && t <= judged)
            {
                let mut values = unchanged();
                values.insert(":z".to_owned(), n(RESULT_DROPPED));
                values.insert(":one".to_owned(), n(1));
                if let Written::Done = store
                    .update(
                        &rec.biz,
                        &rec.key,
                        "SET ru = :z, rv = rv + :one REMOVE rr",
                        "rf = :f AND rv = :v",
                        values,
                    )
                    .await?
                {
                    shrunk += 1;
                }
            }
        }
        start = page.last_evaluated_key().cloned();
        if start.is_none() {
            break;
        }
    }
    Ok((deleted + shrunk) as u64)
}

/// See [`Store::stuck`](crate::Store::stuck) on [`DynamoStore`].
pub(super) async fn stuck(
    store: &DynamoStore,
    biz: &str,
    batch: usize,
) -> Result<Vec<Record>, IdemError> {
    let judged = store.judged_at(store.now_ms());
    let mut out: Vec<Record> = Vec::new();
    let mut start: Option<HashMap<String, AttributeValue>> = None;
    while out.len() < batch {
        let room = i32::try_from((batch - out.len()).min(1000)).unwrap_or(1000);
        let page = store
            .client
            .query()
            .table_name(&*store.table)
            .index_name(STUCK_INDEX)
            .key_condition_expression("sb = :b AND sl <= :t")
            .expression_attribute_values(":b", s(biz))
            .expression_attribute_values(":t", n(judged))
            .scan_index_forward(true)
            .limit(room)
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .map_err(|e| dynamo_error(&store.place, e))?;
        for item in page.items() {
            let found = stored(item)?.record;
            // The index lags the table: what it shows is checked once more here.
            if found.status == Status::Processing && found.lease_until_ms <= judged {
                out.push(found);
            }
        }
        start = page.last_evaluated_key().cloned();
        if start.is_none() {
            break;
        }
    }
    out.sort_by(|a, b| (a.lease_until_ms, &a.key).cmp(&(b.lease_until_ms, &b.key)));
    out.truncate(batch);
    Ok(out)
}

/// See [`Store::processing_biz_types`](crate::Store::processing_biz_types) on [`DynamoStore`].
pub(super) async fn processing_biz_types(store: &DynamoStore) -> Result<Vec<String>, IdemError> {
    let mut bizes = BTreeSet::new();
    let mut start: Option<HashMap<String, AttributeValue>> = None;
    loop {
        let page = store
            .client
            .scan()
            .table_name(&*store.table)
            .index_name(STUCK_INDEX)
            .projection_expression(STUCK_BIZ)
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .map_err(|e| dynamo_error(&store.place, e))?;
        for item in page.items() {
            if let Some(AttributeValue::S(biz)) = item.get(STUCK_BIZ) {
                bizes.insert(biz.clone());
            }
        }
        start = page.last_evaluated_key().cloned();
        if start.is_none() {
            break;
        }
    }
    Ok(bizes.into_iter().collect())
}

/// See [`Store::stats`](crate::Store::stats) on [`DynamoStore`].
pub(super) async fn stats(store: &DynamoStore) -> Result<Vec<StatusCount>, IdemError> {
    let now = store.now_ms();
    let mut counts = Vec::new();
    let mut start: Option<HashMap<String, AttributeValue>> = None;
    loop {
        let page = store
            .client
            .scan()
            .table_name(&*store.table)
            .consistent_read(true)
            .projection_expression(format!("{BIZ}, {STATUS}, {FINGERPRINT}, {RESULT_UNTIL}"))
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .map_err(|e| dynamo_error(&store.place, e))?;
        for item in page.items() {
            let text = |name: &str| match item.get(name) {
                Some(AttributeValue::S(v)) => Some(v.as_str()),
                _ => None,
            };
            let (Some(biz), Some(status)) = (text(BIZ), text(STATUS)) else {
                continue;
            };
            let status = Status::parse(status)?;
            let result_until = match item.get(RESULT_UNTIL) {
                Some(AttributeValue::N(v)) => v.parse::<i64>().ok(),
                _ => None,
            };
            let gone = status == Status::Succeeded && result_until.is_some_and(|t| t <= now);
            counts.push(StatusCount {
                biz: biz.to_owned(),
                origin: text(FINGERPRINT)
                    .and_then(crate::fingerprint::origin)
                    .map(str::to_owned),
                status,
                records: 1,
                tombstones: u64::from(gone),
            });
        }
        start = page.last_evaluated_key().cloned();
        if start.is_none() {
            break;
        }
    }
    Ok(StatusCount::tally(counts))
}

/// See [`Store::list_keys`](crate::Store::list_keys) on [`DynamoStore`].
pub(super) async fn list_keys(
    store: &DynamoStore,
    after: Option<&str>,
    batch: usize,
) -> Result<KeyPage, IdemError> {
    check_batch(batch)?;
    let start = match after {
        Some(cursor) => {
            // The last item a page read: a record's key, or a token's.
            if !cursor.starts_with(TOKEN_PREFIX) {
                parse_record_key(cursor).ok_or_else(|| not_a_cursor(cursor))?;
            }
            Some(HashMap::from([(PK.to_owned(), s(cursor))]))
        }
        None => None,
    };
    let page = store
        .client
        .scan()
        .table_name(&*store.table)
        .consistent_read(true)
        .limit(i32::try_from(batch).unwrap_or(i32::MAX))
        .projection_expression(format!("{PK}, {BIZ}, {KEY}"))
        .set_exclusive_start_key(start)
        .send()
        .await
        .map_err(|e| dynamo_error(&store.place, e))?;
    let keys = page
        .items()
        .iter()
        .filter_map(|item| match (item.get(BIZ), item.get(KEY)) {
            (Some(AttributeValue::S(biz)), Some(AttributeValue::S(key))) => {
                Some((biz.clone(), key.clone()))
            }
            _ => None,
        })
        .collect();
    let next = page.last_evaluated_key().and_then(|k| match k.get(PK) {
        Some(AttributeValue::S(pk)) => Some(pk.clone()),
        _ => None,
    });
    Ok(KeyPage { keys, next })
}
