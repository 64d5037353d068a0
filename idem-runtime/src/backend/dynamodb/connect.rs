//! Opening the store: its URL, the SDK client's configuration, and the options checked against
//! what DynamoDB holds.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::Client;

use super::error::dynamo_error;
use super::{DEFAULT_SKEW_MARGIN, DynamoStore, scan};
use crate::IdemError;
use crate::clock::ClockOffset;
use crate::store::Limits;
use crate::store::decide::{duration_ms, millis};

/// The largest item DynamoDB stores is 400 KB; a record's other attributes (its key twice over,
/// fingerprint, numbers) take at most a few KB of it.
const MAX_SNAPSHOT: usize = 380 * 1000;
/// DynamoDB's longest partition key is 2048 bytes; `<n>:` and `:` frame the pair.
const MAX_PK: usize = 2048;
const PK_FRAMING: usize = 20 + 2;

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

impl DynamoStore {
    /// Opens the table a `dynamodb://TABLE?region=REGION&endpoint=URL` URL names (both query
    /// options may be left out): the region from the URL, else the SDK's environment
    /// (`AWS_REGION`, the profile); the endpoint from the URL, else AWS's for the region.
    /// Credentials come from the SDK's default chain (environment, profile, web identity,
    /// container, instance metadata), except for an endpoint on this machine (a local DynamoDB
    /// or a test server) with no `AWS_ACCESS_KEY_ID` in the environment: there static dummy
    /// credentials are used, and the region defaults to `us-east-1`. Requests connect within
    /// [`crate::DEFAULT_CONNECT_TIMEOUT`], each attempt is answered within 10 s and each
    /// request, the SDK's retries included, within 20 s (a call's own store timeout,
    /// [`crate::DEFAULT_STORE_TIMEOUT`], bounds each of its steps sooner).
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

    /// The SDK client the store sends its requests through (for requests of the caller's own on
    /// the same connections and configuration).
    pub fn client(&self) -> &Client {
        &self.client
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
    /// more). A lease given up ([`Store::release`](crate::Store::release)) ends two margins in
    /// the past, so any caller within the margin can take it over at once.
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
    /// [`Store::claim`](crate::Store::claim).
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
