//! The store's single-item requests (a consistent read, a conditional put, update and delete), the
//! caller's clock they are decided by, and the one place a conditional-check failure is turned
//! into an answer.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};

use super::DynamoStore;
use super::error::dynamo_error;
use super::item::{PK, Stored, record_key, s, stored};
use crate::IdemError;

/// An item as the SDK hands it.
pub(super) type Item = HashMap<String, AttributeValue>;

/// A conditional write's answer: done, or refused by its condition with the item that refused it
/// (none when the item does not exist, or the write did not ask for it).
pub(super) enum Written<T = Stored> {
    Done,
    Refused(Option<T>),
}

/// The errors of the operations that write on a condition: whether one is the condition's
/// refusal, and the item it hands back (`ReturnValuesOnConditionCheckFailure = ALL_OLD`).
pub(super) trait Conditional {
    /// `None` for any other error; `Some(item)` for a refusal.
    fn refusal(&self) -> Option<Option<&Item>>;
}

impl Conditional for PutItemError {
    fn refusal(&self) -> Option<Option<&Item>> {
        match self {
            PutItemError::ConditionalCheckFailedException(c) => Some(c.item()),
            _ => None,
        }
    }
}

impl Conditional for UpdateItemError {
    fn refusal(&self) -> Option<Option<&Item>> {
        match self {
            UpdateItemError::ConditionalCheckFailedException(c) => Some(c.item()),
            _ => None,
        }
    }
}

impl Conditional for DeleteItemError {
    fn refusal(&self) -> Option<Option<&Item>> {
        match self {
            DeleteItemError::ConditionalCheckFailedException(c) => Some(c.item()),
            _ => None,
        }
    }
}

/// What a conditional write's reply means: done, refused by its condition (with the item that
/// refused it), or an error sorted into idem's classes for `place`.
pub(super) fn written<O, E, R>(
    place: &str,
    sent: Result<O, SdkError<E, R>>,
) -> Result<Written<Item>, IdemError>
where
    E: Conditional + ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match sent {
        Ok(_) => Ok(Written::Done),
        Err(e) => match e.as_service_error().and_then(Conditional::refusal) {
            Some(item) => Ok(Written::Refused(item.cloned())),
            None => Err(dynamo_error(place, e)),
        },
    }
}

impl Written<Item> {
    /// The refusing item read as a record.
    fn stored(self) -> Result<Written, IdemError> {
        Ok(match self {
            Written::Done => Written::Done,
            Written::Refused(item) => Written::Refused(item.as_ref().map(stored).transpose()?),
        })
    }
}

impl DynamoStore {
    /// The caller's clock in microseconds since the Unix epoch, plus a test clock's offset.
    pub(super) fn now_us(&self) -> i64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        match self.offset.ms() {
            0 => now,
            ms => now.saturating_add(ms.saturating_mul(1000)),
        }
    }

    pub(super) fn now_ms(&self) -> i64 {
        self.now_us().div_euclid(1000)
    }

    /// The time records written by others are judged at: now less the skew margin.
    pub(super) fn judged_at(&self, now_ms: i64) -> i64 {
        now_ms.saturating_sub(self.skew_ms)
    }

    fn key_of(biz: &str, key: &str) -> Item {
        HashMap::from([(PK.to_owned(), s(record_key(biz, key)))])
    }

    /// A strongly consistent read of the record.
    pub(super) async fn get(&self, biz: &str, key: &str) -> Result<Option<Stored>, IdemError> {
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
    pub(super) async fn put(
        &self,
        item: Item,
        condition: &str,
        values: Option<Item>,
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
        written(&self.place, sent)?.stored()
    }

    /// Updates the record with `update` on `condition`.
    pub(super) async fn update(
        &self,
        biz: &str,
        key: &str,
        update: &str,
        condition: &str,
        values: Item,
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
        written(&self.place, sent)?.stored()
    }

    /// Deletes the record on `condition`; whether it was deleted.
    pub(super) async fn delete(
        &self,
        biz: &str,
        key: &str,
        condition: &str,
        values: Item,
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
        Ok(matches!(written(&self.place, sent)?, Written::Done))
    }
}
