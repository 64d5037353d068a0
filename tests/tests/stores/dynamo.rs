//! The store contract on `DynamoStore`, against the local DynamoDB-compatible server
//! (`IDEM_DYNAMO_URL`, its endpoint, default `http://127.0.0.1:8000`: the moto server `.ci/run`
//! starts); each test's records in a table of its own, which `migrate()` creates. Then what only
//! DynamoDB has: callers whose clocks disagree, and the requests a call sends; and the token
//! contract on its tokens.

use crate::contract;

use std::sync::Arc;

use crate::contract::server;
use idem::{DynamoStore, IdemError, TestClock};

/// The endpoint of the DynamoDB-compatible server.
fn endpoint() -> String {
    server::dynamo_url()
}

/// The store URL of a new table of this test's own.
fn table_url() -> String {
    format!(
        "dynamodb://{}?endpoint={}",
        server::unique("idemt"),
        endpoint()
    )
}

/// A store on a new table, migrated; `None` (one skip line) when the server is down.
async fn fresh(url: &str) -> Option<DynamoStore> {
    let endpoint = endpoint();
    server::reach("DynamoDB", &endpoint, async {
        let store = DynamoStore::connect(url).await?;
        store.migrate().await?;
        Ok::<_, IdemError>(store)
    })
    .await
}

async fn store(clock: TestClock) -> Option<Arc<dyn idem::Store>> {
    let store = fresh(&table_url()).await?;
    Some(Arc::new(store.with_test_clock(clock)))
}

contract_suite!(store, burst = (50, 16));

/// `idem::connect` opens a `dynamodb://` URL, and its `migrate` creates the table.
mod url {
    use idem::{Call, IdemError, Store};

    #[tokio::test]
    async fn a_dynamodb_url_opens_the_table_and_migrates_it() {
        let url = super::table_url();
        let Some(store) =
            super::server::reach("DynamoDB", &super::endpoint(), idem::connect(&url)).await
        else {
            return;
        };
        assert_eq!(store.backend(), "dynamodb");
        // Before the migration: the table is missing, and the error says what to run.
        let early: Result<u32, IdemError> =
            Call::new("URL", "k").run(&store, async { Ok(1) }).await;
        let err = early.unwrap_err();
        assert!(
            matches!(err, IdemError::StoreSchema { .. }) && err.to_string().contains("migrate"),
            "{err}"
        );
        store.migrate().await.unwrap();
        store.migrate().await.unwrap(); // again: nothing to do
        for _ in 0..2 {
            let done: Result<u32, IdemError> =
                Call::new("URL", "k").run(&store, async { Ok(7) }).await;
            assert_eq!(done.unwrap(), 7);
        }
        assert_eq!(store.tokens().unwrap().backend(), "dynamodb");
        for bad in [
            "dynamodb://x",
            "dynamodb://tab?idem_table=x",
            "dynamodb://tab?nope=1",
        ] {
            assert!(
                matches!(
                    idem::connect(bad).await,
                    Err(IdemError::InvalidOptions { .. })
                ),
                "{bad}"
            );
        }
    }
}

/// Two callers on one table whose clocks disagree: within the skew margin a lease is never cut
/// short; beyond it, by the excess, and the fence still refuses the late holder's mark.
mod skew {
    use std::time::Duration;

    use idem::{
        DynamoStore, IdemError, Store, TestClock,
        store::{Acquired, ClaimOutcome, ClaimRequest},
    };

    const LEASE: Duration = Duration::from_secs(10);

    fn req(key: &str) -> ClaimRequest<'_> {
        ClaimRequest {
            biz: "SKEW",
            key,
            fingerprint: None,
            lease: LEASE,
            ttl: Duration::from_secs(3600),
        }
    }

    /// The margin these tests give the stores (the default is shorter; a wider one leaves room for
    /// the requests' own time on a loaded machine).
    const MARGIN: Duration = Duration::from_millis(500);

    /// Caller `a` on its clock, caller `b` on a clock `ahead` of it; both clocks moved together
    /// by `advance`; both judge with [`MARGIN`].
    struct Callers {
        a: DynamoStore,
        b: DynamoStore,
        clocks: (TestClock, TestClock),
    }

    impl Callers {
        async fn new(ahead: Duration) -> Option<Self> {
            let store = super::fresh(&super::table_url())
                .await?
                .with_skew_margin(MARGIN)
                .unwrap();
            let clocks = (TestClock::new(), TestClock::new());
            clocks.1.advance(ahead);
            Some(Callers {
                a: store.clone().with_test_clock(clocks.0.clone()),
                b: store.with_test_clock(clocks.1.clone()),
                clocks,
            })
        }

        fn advance(&self, by: Duration) {
            self.clocks.0.advance(by);
            self.clocks.1.advance(by);
        }
    }

    #[tokio::test]
    async fn within_the_margin_a_live_lease_is_never_cut_short() {
        let Some(c) = Callers::new(Duration::from_millis(400)).await else {
            return;
        };
        assert_eq!(c.a.skew_margin(), MARGIN);
        let ClaimOutcome::Acquired { claim, .. } = c.a.claim(&req("k")).await.unwrap() else {
            panic!("a claims first")
        };
        // 9.7 s on a's clock (lease live), 10.1 s on b's: b is past the lease end by its own
        // clock, but not by the margin.
        c.advance(Duration::from_millis(9_700));
        let seen = c.b.claim(&req("k")).await.unwrap();
        let ClaimOutcome::InProgress { retry_after } = seen else {
            panic!("b must wait: {seen:?}")
        };
        assert!(retry_after <= Duration::from_millis(500), "{retry_after:?}");
        // a's lease ends by a's clock; b's clock is past it by more than the margin: b takes
        // over, and a's late mark is refused by the fence.
        c.advance(Duration::from_millis(700));
        let ClaimOutcome::Acquired { claim: taken, how } = c.b.claim(&req("k")).await.unwrap()
        else {
            panic!("b takes over")
        };
        assert_eq!(how, Acquired::TakeOver);
        assert!(taken.fence > claim.fence);
        let late = c.a.complete("SKEW", "k", &claim, b"a", LEASE).await;
        assert!(matches!(late, Err(IdemError::LeaseLost { .. })), "{late:?}");
        c.b.complete("SKEW", "k", &taken, b"b", LEASE)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn beyond_the_margin_a_lease_is_cut_short_by_the_excess_and_fenced() {
        // b is 1.5 s ahead, the margin 0.5 s: b may take over 1 s before a's lease ends by a's
        // clock (what the stores guide says a larger skew does).
        let Some(c) = Callers::new(Duration::from_millis(1_500)).await else {
            return;
        };
        let ClaimOutcome::Acquired { claim, .. } = c.a.claim(&req("k")).await.unwrap() else {
            panic!("a claims first")
        };
        c.advance(Duration::from_millis(9_100));
        let a_sees = c.a.load("SKEW", "k").await.unwrap().unwrap();
        assert!(a_sees.lease_until_ms > 0);
        let ClaimOutcome::Acquired { claim: taken, how } = c.b.claim(&req("k")).await.unwrap()
        else {
            panic!("b takes over before a's lease ends by a's clock")
        };
        assert_eq!(how, Acquired::TakeOver);
        // a still believes in its lease (0.9 s left by its clock), but only b's fence marks.
        assert!(matches!(
            c.a.renew("SKEW", "k", &claim, LEASE).await,
            Err(IdemError::LeaseLost { .. })
        ));
        assert!(matches!(
            c.a.complete("SKEW", "k", &claim, b"a", LEASE).await,
            Err(IdemError::LeaseLost { .. })
        ));
        c.b.complete("SKEW", "k", &taken, b"b", LEASE)
            .await
            .unwrap();
        let rec = c.b.load("SKEW", "k").await.unwrap().unwrap();
        assert_eq!(rec.snapshot.as_deref(), Some(&b"b"[..]));
    }

    #[tokio::test]
    async fn a_released_lease_is_taken_at_once_by_a_caller_behind() {
        // b is behind a by 400 ms here (a is the one ahead): a's release still lets b in at once.
        let Some(c) = Callers::new(Duration::ZERO).await else {
            return;
        };
        c.clocks.0.advance(Duration::from_millis(400));
        let ClaimOutcome::Acquired { claim, .. } = c.a.claim(&req("r")).await.unwrap() else {
            panic!("a claims first")
        };
        c.a.release("SKEW", "r", &claim).await.unwrap();
        let took = c.b.claim(&req("r")).await.unwrap();
        assert!(
            matches!(
                took,
                ClaimOutcome::Acquired {
                    how: Acquired::TakeOver,
                    ..
                }
            ),
            "{took:?}"
        );
    }
}

/// Requests per call, counted at the SDK (an interceptor sees every HTTP request, the SDK's own
/// retries included): a first execution is one conditional write to claim and one to mark; a
/// replay, once the store reads first, one strongly consistent read; a batch of N keys, N
/// conditional writes to claim and N to mark (DynamoDB has no conditional batch write: see the
/// store's `batch.rs`). Through `Call::run`, an `#[idempotent]` fn and `Store::claim_batch`.
mod requests {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use idem::aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
    use idem::aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
    use idem::store::{BatchClaim, BatchItem, BatchMark, ClaimOutcome};
    use idem::{Call, DynamoStore, IdemError, Store, idempotent};

    #[derive(Debug, Clone, Default)]
    struct Sent(Arc<Mutex<Vec<String>>>);

    impl Sent {
        /// The operations sent since the last take, in order.
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }

        /// How many of each operation were sent since the last take (concurrent requests).
        fn counts(&self) -> BTreeMap<String, usize> {
            let mut counts = BTreeMap::new();
            for op in self.take() {
                *counts.entry(op).or_default() += 1;
            }
            counts
        }
    }

    impl Intercept for Sent {
        fn name(&self) -> &'static str {
            "idem-suite request counter"
        }

        fn read_before_transmit(
            &self,
            context: &BeforeTransmitInterceptorContextRef<'_>,
            _: &RuntimeComponents,
            _: &mut ConfigBag,
        ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
            let target = context
                .request()
                .headers()
                .get("x-amz-target")
                .unwrap_or("?");
            let op = target.rsplit('.').next().unwrap_or(target).to_owned();
            self.0.lock().unwrap().push(op);
            Ok(())
        }
    }

    /// A store on a new table whose requests are counted; `None` when the server is down.
    async fn counted() -> Option<(DynamoStore, Sent)> {
        let sent = Sent::default();
        let counter = sent.clone();
        let url = super::table_url();
        let store = super::server::reach(
            "DynamoDB",
            &super::endpoint(),
            DynamoStore::connect_with(&url, move |config| config.interceptor(counter)),
        )
        .await?;
        store.migrate().await.unwrap();
        sent.take();
        Some((store, sent))
    }

    fn counts<const N: usize>(of: [(&str, usize); N]) -> BTreeMap<String, usize> {
        of.into_iter().map(|(op, n)| (op.to_owned(), n)).collect()
    }

    /// The attribute's store: the counted store, registered under this name.
    #[idempotent(biz = "REQATTR", key = "order", store = "dynamo_requests")]
    async fn charge(order: &str, amount: u32) -> Result<u32, IdemError> {
        Ok(amount)
    }

    #[tokio::test]
    async fn a_first_run_is_two_conditional_writes_and_a_replay_one_read() {
        let Some((store, sent)) = counted().await else {
            return;
        };
        idem::register_store("dynamo_requests", store.clone());
        let call = |key: &'static str, value: u32| {
            Call::new("REQ", key).run(&store, async move { Ok::<_, IdemError>(value) })
        };

        assert_eq!(call("a", 1).await.unwrap(), 1);
        assert_eq!(sent.take(), ["PutItem", "UpdateItem"], "claim, then mark");
        assert_eq!(charge("o-1", 5).await.unwrap(), 5);
        assert_eq!(
            sent.take(),
            ["PutItem", "UpdateItem"],
            "the same through the attribute"
        );

        // Written first (new keys prevail), a repeat is the refused insert, which hands back the
        // record: one request.
        assert_eq!(call("a", 2).await.unwrap(), 1);
        assert_eq!(sent.take(), ["PutItem"]);
        assert_eq!(charge("o-1", 6).await.unwrap(), 5);
        assert_eq!(sent.take(), ["PutItem"]);

        // A storm of repeats turns the store to reading first: a replay is one read.
        for _ in 0..20 {
            assert_eq!(call("a", 3).await.unwrap(), 1);
        }
        sent.take();
        assert_eq!(call("a", 4).await.unwrap(), 1);
        assert_eq!(sent.take(), ["GetItem"], "a replay is one consistent read");
        assert_eq!(charge("o-1", 7).await.unwrap(), 5);
        assert_eq!(sent.take(), ["GetItem"], "the same through the attribute");
    }

    /// Claims `keys` in one batch and marks the acquired ones in one `complete_batch`.
    async fn batch(store: &DynamoStore, keys: &[String]) {
        let items: Vec<BatchItem<'_>> = keys
            .iter()
            .map(|key| BatchItem {
                key,
                fingerprint: None,
            })
            .collect();
        let batch = BatchClaim {
            biz: "REQB",
            items: &items,
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(3600),
        };
        let mut marks = Vec::new();
        for (key, outcome) in keys.iter().zip(store.claim_batch(&batch).await.unwrap()) {
            match outcome {
                ClaimOutcome::Acquired { claim, .. } => marks.push(BatchMark {
                    key,
                    claim,
                    snapshot: b"1",
                    result_ttl: None,
                }),
                ClaimOutcome::Replay { snapshot } => assert_eq!(snapshot, b"1"),
                other => panic!("{key}: {other:?}"),
            }
        }
        if !marks.is_empty() {
            let landed = store
                .complete_batch("REQB", &marks, batch.ttl)
                .await
                .unwrap();
            assert!(landed.iter().all(Result::is_ok), "{landed:?}");
        }
    }

    #[tokio::test]
    async fn a_batch_of_n_keys_is_n_claims_and_n_marks_and_its_replay_n_reads() {
        const N: usize = 10;
        let Some((store, sent)) = counted().await else {
            return;
        };
        let keys: Vec<String> = (0..N).map(|i| format!("b-{i}")).collect();
        batch(&store, &keys).await;
        assert_eq!(
            sent.counts(),
            counts([("PutItem", N), ("UpdateItem", N)]),
            "one conditional write per key to claim, one per key to mark"
        );
        // Written first (the store saw new keys), each repeat is its refused insert.
        batch(&store, &keys).await;
        assert_eq!(sent.counts(), counts([("PutItem", N)]));
        // Once repeats prevail the store reads first: one read per key.
        batch(&store, &keys).await;
        sent.take();
        batch(&store, &keys).await;
        assert_eq!(sent.counts(), counts([("GetItem", N)]));
    }
}

/// The one-time token contract on `DynamoStore::tokens`: tokens in the records' table.
mod tokens {
    use super::contract;
    use std::sync::Arc;

    async fn tokens(clock: idem::TestClock) -> Option<Arc<dyn idem::TokenStore>> {
        let store = super::fresh(&super::table_url()).await?;
        Some(Arc::new(store.with_test_clock(clock).tokens()))
    }

    crate::token_suite!(tokens);
}
