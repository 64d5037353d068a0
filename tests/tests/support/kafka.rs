//! What the Kafka tests share (`inbox_kafka.rs`, `messaging_e2e.rs`): the broker's address, a
//! work topic with its dead-letter topic, and the consumers' settings. Include it with
//! `#[path = "support/kafka.rs"] mod kafka;`.

#![allow(dead_code)]

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;

/// The broker: `IDEM_KAFKA_URL`, default the local tansu.
pub fn brokers() -> String {
    std::env::var("IDEM_KAFKA_URL").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

pub fn admin(brokers: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap()
}

/// Creates `topic` with `partitions` and its dead-letter topic `<topic>.dead` (one partition);
/// the broker's refusal, or why it did not answer within 5 s.
pub async fn create_with_dead(brokers: &str, topic: &str, partitions: i32) -> Result<(), String> {
    let dead = format!("{topic}.dead");
    let topics = [
        NewTopic::new(topic, partitions, TopicReplication::Fixed(1)),
        NewTopic::new(&dead, 1, TopicReplication::Fixed(1)),
    ];
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(5)));
    match admin(brokers).create_topics(&topics, &options).await {
        Ok(results) => results
            .into_iter()
            .try_for_each(|r| r.map(drop).map_err(|(topic, e)| format!("{topic}: {e}"))),
        Err(e) => Err(e.to_string()),
    }
}

/// Deletes `topic` and `<topic>.dead`.
pub async fn delete_with_dead(brokers: &str, topic: &str) {
    let dead = format!("{topic}.dead");
    let _ = admin(brokers)
        .delete_topics(&[topic, dead.as_str()], &AdminOptions::new())
        .await;
}

/// A consumer of `group` as the tests run it: `idem::inbox::kafka::consumer_config`, a short
/// session (a consumer that left is noticed within seconds), and fetches answered within 50 ms
/// (tansu answers an empty fetch after its wait, not when a message arrives).
pub fn consumer_config(brokers: &str, group: &str) -> ClientConfig {
    let mut config = idem::inbox::kafka::consumer_config(brokers, group);
    config
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("fetch.wait.max.ms", "50");
    config
}
