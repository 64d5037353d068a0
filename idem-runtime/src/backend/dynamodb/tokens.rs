//! Submit tokens in the records' table: one item per token under `tok:<token>` (a partition key no
//! record has: theirs begin with a digit), spent and restored by conditional updates.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};

use super::DynamoStore;
use super::item::{DELETE_AFTER, PK, delete_after, int, n, s};
use super::requests::{Written, written};
use crate::IdemError;
use crate::store::decide::millis;
use crate::tokens::{Found, TokenStore, check_token, check_ttl, new_token, refusal, subject_of};

/// The partition keys of tokens begin with this.
pub(crate) const TOKEN_PREFIX: &str = "tok:";
/// A token's subject (`""` for none), whether it is spent (0 or 1), and its expiry (ms).
const SUBJECT: &str = "ts";
const SPENT: &str = "tp";
const EXPIRES: &str = "te";

/// Submit tokens in a [`DynamoStore`]'s table ([`DynamoStore::tokens`]). A token expires by the
/// caller's clock; DynamoDB's TTL deletes it some time after (so
/// [`TokenStore::sweep_expired`] has nothing to do).
#[derive(Clone, Debug)]
pub struct DynamoTokens {
    store: DynamoStore,
}

impl DynamoStore {
    /// Submit tokens in this store's table (items `tok:<token>`, beside the records).
    pub fn tokens(&self) -> DynamoTokens {
        DynamoTokens {
            store: self.clone(),
        }
    }
}

impl DynamoTokens {
    fn key(token: &str) -> HashMap<String, AttributeValue> {
        HashMap::from([(PK.to_owned(), s(format!("{TOKEN_PREFIX}{token}")))])
    }

    /// Spends (`to` = true) or restores a token: one conditional update, and on a refusal the
    /// reason read from the item that refused it.
    async fn flip(&self, token: &str, subject: Option<&str>, to: bool) -> Result<(), IdemError> {
        check_token(token)?;
        let subject = subject_of(subject)?;
        let now = self.store.now_ms();
        let sent = self
            .store
            .client
            .update_item()
            .table_name(&*self.store.table)
            .set_key(Some(Self::key(token)))
            .update_expression("SET tp = :to")
            .condition_expression("tp = :from AND te > :now AND ts = :sub")
            .expression_attribute_values(":to", n(i64::from(to)))
            .expression_attribute_values(":from", n(i64::from(!to)))
            .expression_attribute_values(":now", n(now))
            .expression_attribute_values(":sub", s(subject))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let item = match written(&self.store.place, sent)? {
            Written::Done => return Ok(()),
            Written::Refused(item) => item,
        };
        let found = match &item {
            Some(item) => {
                let subject = match item.get(SUBJECT) {
                    Some(AttributeValue::S(v)) => v.as_str(),
                    _ => "",
                };
                Some(Found {
                    subject,
                    live: int(item, EXPIRES)? > now,
                })
            }
            None => None,
        };
        Err(refusal(found, subject, to).error())
    }
}

#[async_trait]
impl TokenStore for DynamoTokens {
    fn backend(&self) -> &'static str {
        "dynamodb"
    }

    async fn issue(&self, ttl: Duration, subject: Option<&str>) -> Result<String, IdemError> {
        check_ttl(ttl)?;
        let subject = subject_of(subject)?;
        let expires = self.store.now_ms().saturating_add(millis(ttl).max(1));
        for _ in 0..3 {
            let token = new_token()?;
            let mut item = Self::key(&token);
            item.insert(SUBJECT.to_owned(), s(subject));
            item.insert(SPENT.to_owned(), n(0));
            item.insert(EXPIRES.to_owned(), n(expires));
            item.insert(
                DELETE_AFTER.to_owned(),
                n(delete_after(expires, 0, self.store.skew_ms)),
            );
            let sent = self
                .store
                .client
                .put_item()
                .table_name(&*self.store.table)
                .set_item(Some(item))
                .condition_expression("attribute_not_exists(pk)")
                .send()
                .await;
            if let Written::Done = written(&self.store.place, sent)? {
                return Ok(token);
            }
        }
        Err(IdemError::store(
            "could not issue a token that is not taken",
        ))
    }

    async fn consume(&self, token: &str, subject: Option<&str>) -> Result<(), IdemError> {
        self.flip(token, subject, true).await
    }

    async fn restore(&self, token: &str, subject: Option<&str>) -> Result<(), IdemError> {
        self.flip(token, subject, false).await
    }
}
