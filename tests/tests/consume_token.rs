//! `#[consume_token]` end to end, through handlers written as a user writes them, on SQLite tokens
//! and (feature `redis`) on Redis tokens (`IDEM_REDIS_URL`, default `redis://127.0.0.1:6379`; one
//! skip line when it is unreachable, unless `IDEM_REQUIRE_SERVICES=1`).
//!
//! The business records every run in an independent SQLite table (`Effects`), so "the body ran
//! once" is proven by what the business did, not by what the token store says.

mod contract;

use std::sync::Arc;
use std::time::Duration;

use contract::{Effects, biz};
use idem::{IdemError, TokenStore, consume_token};
use tokio::sync::Barrier;

const TTL: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error("the card was declined")]
    Declined,
    #[error(transparent)]
    Idem(#[from] IdemError),
}

/// What the page submits: the token it was given with the form, and the order.
#[derive(Clone)]
pub struct OrderForm {
    pub token: String,
    pub order_no: String,
}

/// What the business does once it runs.
#[derive(Clone, Copy)]
pub enum Act {
    Succeed,
    Fail,
    Panic,
    /// Never finishes (the caller gives up and drops the call).
    Hang,
}

/// The service under test: its token store, and the ledger its business writes.
pub struct Shop {
    pub tokens: Arc<dyn TokenStore>,
    pub effects: Effects,
    pub biz: String,
}

impl Shop {
    pub async fn new(tokens: Arc<dyn TokenStore>, case: &str) -> Arc<Shop> {
        Arc::new(Shop {
            tokens,
            effects: Effects::new().await,
            biz: biz(case),
        })
    }

    /// A form carrying a fresh token (issued to `subject`).
    pub async fn form(&self, order_no: &str, subject: Option<&str>) -> OrderForm {
        OrderForm {
            token: self.tokens.issue(TTL, subject).await.unwrap(),
            order_no: order_no.to_owned(),
        }
    }

    /// How many times the business ran for `order_no`.
    pub async fn runs(&self, order_no: &str) -> i64 {
        self.effects.count(&self.biz, order_no).await
    }

    #[consume_token(token = "form.token", store = self.tokens)]
    pub async fn submit(&self, form: &OrderForm, act: Act) -> Result<String, ShopError> {
        self.business(form, act).await
    }

    #[consume_token(token = form.token, store = self.tokens, restore_on_err)]
    pub async fn submit_restoring(&self, form: &OrderForm, act: Act) -> Result<String, ShopError> {
        self.business(form, act).await
    }

    #[consume_token(token = "form.token", store = self.tokens, subject = "user")]
    pub async fn submit_as(&self, user: &str, form: &OrderForm) -> Result<String, ShopError> {
        self.business(form, Act::Succeed).await
    }

    async fn business(&self, form: &OrderForm, act: Act) -> Result<String, ShopError> {
        self.effects.record(&self.biz, &form.order_no).await;
        match act {
            Act::Succeed => Ok(format!("order {} placed", form.order_no)),
            Act::Fail => Err(ShopError::Declined),
            Act::Panic => panic!("the business panicked"),
            Act::Hang => std::future::pending().await,
        }
    }
}

fn is_used<T: std::fmt::Debug>(r: &Result<T, ShopError>) -> bool {
    matches!(r, Err(ShopError::Idem(IdemError::TokenUsed)))
}

fn invalid_because<T: std::fmt::Debug>(r: &Result<T, ShopError>, why: &str) -> bool {
    matches!(r, Err(ShopError::Idem(IdemError::TokenInvalid { reason })) if reason.contains(why))
}

/// The cases every token backend runs (`consume_token_suite!`).
pub mod cases {
    use super::*;

    pub async fn a_thousand_concurrent_submits_run_the_body_once(tokens: Arc<dyn TokenStore>) {
        const N: usize = 1000;
        let shop = Shop::new(tokens, "ct_race").await;
        let form = shop.form("ORD-1", None).await;
        let barrier = Arc::new(Barrier::new(N));
        let mut calls = Vec::with_capacity(N);
        for _ in 0..N {
            let (shop, form, barrier) = (shop.clone(), form.clone(), barrier.clone());
            // `tokio::spawn` needs the handler's future to be `Send`, as a web framework does.
            calls.push(tokio::spawn(async move {
                barrier.wait().await;
                shop.submit(&form, Act::Succeed).await
            }));
        }
        let (mut placed, mut used) = (0, 0);
        for call in calls {
            match call.await.unwrap() {
                Ok(answer) => {
                    assert_eq!(answer, "order ORD-1 placed");
                    placed += 1;
                }
                r if is_used(&r) => used += 1,
                Err(e) => panic!("a submit got {e:?}"),
            }
        }
        assert_eq!((placed, used), (1, N - 1));
        assert_eq!(
            shop.effects.totals(&shop.biz).await,
            (1, 1),
            "the body ran once"
        );
    }

    pub async fn restore_on_err_lets_the_user_submit_again(tokens: Arc<dyn TokenStore>) {
        let shop = Shop::new(tokens, "ct_restore").await;
        let form = shop.form("ORD-2", None).await;
        let failed = shop.submit_restoring(&form, Act::Fail).await;
        assert!(matches!(failed, Err(ShopError::Declined)), "{failed:?}");
        assert_eq!(shop.runs("ORD-2").await, 1);
        // The token was put back: the resubmit runs the body, and spends the token for good.
        let placed = shop.submit_restoring(&form, Act::Succeed).await;
        assert_eq!(placed.unwrap(), "order ORD-2 placed");
        assert_eq!(shop.runs("ORD-2").await, 2);
        assert!(is_used(&shop.submit_restoring(&form, Act::Succeed).await));
        assert_eq!(shop.runs("ORD-2").await, 2, "a spent token runs nothing");
    }

    pub async fn without_restore_on_err_a_failed_body_leaves_the_token_spent(
        tokens: Arc<dyn TokenStore>,
    ) {
        let shop = Shop::new(tokens, "ct_no_restore").await;
        let form = shop.form("ORD-3", None).await;
        let failed = shop.submit(&form, Act::Fail).await;
        assert!(matches!(failed, Err(ShopError::Declined)), "{failed:?}");
        assert!(is_used(&shop.submit(&form, Act::Succeed).await));
        assert_eq!(shop.runs("ORD-3").await, 1, "the resubmit did not run");
        assert!(matches!(
            shop.tokens.consume(&form.token, None).await,
            Err(IdemError::TokenUsed)
        ));
    }

    pub async fn another_subjects_token_is_invalid_and_runs_nothing(tokens: Arc<dyn TokenStore>) {
        let shop = Shop::new(tokens, "ct_subject").await;
        let form = shop.form("ORD-4", Some("alice")).await;
        let stolen = shop.submit_as("mallory", &form).await;
        assert!(invalid_because(&stolen, "another subject"), "{stolen:?}");
        // Without a subject the token is no one's either.
        let anonymous = shop.submit(&form, Act::Succeed).await;
        assert!(
            invalid_because(&anonymous, "another subject"),
            "{anonymous:?}"
        );
        assert_eq!(shop.runs("ORD-4").await, 0);
        // Its own subject spends it, once.
        assert_eq!(
            shop.submit_as("alice", &form).await.unwrap(),
            "order ORD-4 placed"
        );
        assert!(is_used(&shop.submit_as("alice", &form).await));
        assert_eq!(shop.runs("ORD-4").await, 1);
    }

    pub async fn a_malformed_or_unknown_token_is_invalid_and_runs_nothing(
        tokens: Arc<dyn TokenStore>,
    ) {
        let shop = Shop::new(tokens, "ct_malformed").await;
        let issued = shop.form("ORD-5", None).await;
        for (token, why) in [
            ("", "malformed"),
            ("not a token", "malformed"),
            ("'; DROP TABLE idem_token; --", "malformed"),
            (&issued.token.to_uppercase(), "malformed"),
            (&"a".repeat(10_000), "longer"),
            (&issued.token.chars().rev().collect::<String>(), "unknown"),
        ] {
            let form = OrderForm {
                token: token.to_owned(),
                order_no: "ORD-5".into(),
            };
            let r = shop.submit_restoring(&form, Act::Succeed).await;
            assert!(invalid_because(&r, why), "{token:?}: {r:?}");
        }
        assert_eq!(shop.runs("ORD-5").await, 0);
        // None of that touched the real one.
        shop.submit(&issued, Act::Succeed).await.unwrap();
    }

    pub async fn a_panicking_body_leaves_the_token_spent(tokens: Arc<dyn TokenStore>) {
        let shop = Shop::new(tokens, "ct_panic").await;
        let form = shop.form("ORD-6", None).await;
        // Even with `restore_on_err`: a panic is no `Err`, and a duplicate must never run twice.
        let call = {
            let (shop, form) = (shop.clone(), form.clone());
            tokio::spawn(async move { shop.submit_restoring(&form, Act::Panic).await })
        };
        let panicked = call.await.unwrap_err();
        assert!(panicked.is_panic(), "{panicked:?}");
        assert!(is_used(&shop.submit_restoring(&form, Act::Succeed).await));
        assert_eq!(shop.runs("ORD-6").await, 1);
    }

    pub async fn a_dropped_call_leaves_the_token_spent(tokens: Arc<dyn TokenStore>) {
        let shop = Shop::new(tokens, "ct_drop").await;
        let form = shop.form("ORD-7", None).await;
        let gave_up = tokio::time::timeout(
            Duration::from_millis(300),
            shop.submit_restoring(&form, Act::Hang),
        )
        .await;
        assert!(gave_up.is_err(), "the business never finishes");
        assert_eq!(shop.runs("ORD-7").await, 1, "the body had started");
        assert!(is_used(&shop.submit_restoring(&form, Act::Succeed).await));
        assert_eq!(shop.runs("ORD-7").await, 1);
    }
}

#[macro_export]
macro_rules! consume_token_suite {
    ($make:path) => {
        $crate::consume_token_suite!(@cases $make;
            a_thousand_concurrent_submits_run_the_body_once,
            restore_on_err_lets_the_user_submit_again,
            without_restore_on_err_a_failed_body_leaves_the_token_spent,
            another_subjects_token_is_invalid_and_runs_nothing,
            a_malformed_or_unknown_token_is_invalid_and_runs_nothing,
            a_panicking_body_leaves_the_token_spent,
            a_dropped_call_leaves_the_token_spent,
        );
    };
    (@cases $make:path; $($case:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            if let Some(tokens) = $make().await {
                $crate::cases::$case(tokens).await;
            }
        }
    )*};
}

mod sqlite {
    use super::*;

    async fn tokens() -> Option<Arc<dyn TokenStore>> {
        let store = idem::SqliteStore::in_memory().await.unwrap();
        store.migrate().await.unwrap();
        Some(Arc::new(store.tokens()))
    }

    crate::consume_token_suite!(tokens);

    // A registered name, resolved at call time.
    #[consume_token(token = "form.token", store = "consume_token_sqlite")]
    async fn submit_to_registered(shop: &Shop, form: &OrderForm) -> Result<String, ShopError> {
        shop.business(form, Act::Succeed).await
    }

    #[consume_token(token = "form.token", store = "consume_token_never_registered")]
    async fn submit_to_unregistered(shop: &Shop, form: &OrderForm) -> Result<String, ShopError> {
        shop.business(form, Act::Succeed).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_registered_store_name_is_found_at_call_time() {
        let store = idem::SqliteStore::in_memory().await.unwrap();
        store.migrate().await.unwrap();
        idem::register_tokens("consume_token_sqlite", store.tokens());
        let shop = Shop::new(Arc::new(store.tokens()), "ct_named").await;
        let form = shop.form("ORD-8", None).await;
        assert_eq!(
            submit_to_registered(&shop, &form).await.unwrap(),
            "order ORD-8 placed"
        );
        assert!(is_used(&submit_to_registered(&shop, &form).await));
        assert_eq!(shop.runs("ORD-8").await, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unregistered_store_name_is_unknown_store_and_runs_nothing() {
        let shop = Shop::new(Arc::new(idem::MemoryTokens::new()), "ct_unknown").await;
        let form = shop.form("ORD-9", None).await;
        let r = submit_to_unregistered(&shop, &form).await;
        assert!(
            matches!(&r, Err(ShopError::Idem(IdemError::UnknownStore { name })) if name == "consume_token_never_registered"),
            "{r:?}"
        );
        assert_eq!(shop.runs("ORD-9").await, 0);
        // The token was not touched.
        shop.tokens.consume(&form.token, None).await.unwrap();
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::contract::server;
    use super::*;

    async fn tokens() -> Option<Arc<dyn TokenStore>> {
        let url = server::mysql_url();
        let store = server::reach("MySQL", &url, idem::MySqlStore::connect(&url)).await?;
        let store = store
            .with_table(&server::unique("idem_ctr"))
            .unwrap()
            .with_token_table(&server::unique("idem_ct"))
            .unwrap();
        store.migrate().await.unwrap();
        Some(Arc::new(store.tokens()))
    }

    crate::consume_token_suite!(tokens);
}

#[cfg(feature = "redis")]
mod redis {
    use super::contract::server;
    use super::*;

    async fn tokens() -> Option<Arc<dyn TokenStore>> {
        let url = server::redis_url();
        let store = server::reach("Redis", &url, idem::RedisStore::connect(&url)).await?;
        let prefix = format!("{}:", server::unique("idemct"));
        Some(Arc::new(store.with_prefix(&prefix).unwrap().tokens()))
    }

    crate::consume_token_suite!(tokens);
}

#[cfg(feature = "postgres")]
#[path = "support/postgres.rs"]
mod pg;

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    async fn tokens() -> Option<Arc<dyn TokenStore>> {
        let store = super::pg::store(16).await?;
        Some(Arc::new(store.tokens()))
    }

    crate::consume_token_suite!(tokens);

    // A registered name, resolved at call time.
    #[consume_token(
        token = "form.token",
        store = "consume_token_postgres",
        subject = "user"
    )]
    async fn submit_to_registered(
        user: &str,
        shop: &Shop,
        form: &OrderForm,
    ) -> Result<String, ShopError> {
        shop.business(form, Act::Succeed).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_registered_postgres_token_store_is_found_at_call_time() {
        let Some(store) = super::pg::store(4).await else {
            return;
        };
        idem::register_tokens("consume_token_postgres", store.tokens());
        let shop = Shop::new(Arc::new(store.tokens()), "ct_pg_named").await;
        let form = shop.form("ORD-8", Some("u-1")).await;
        assert!(matches!(
            submit_to_registered("u-2", &shop, &form).await,
            Err(ShopError::Idem(IdemError::TokenInvalid { .. }))
        ));
        assert_eq!(
            submit_to_registered("u-1", &shop, &form).await.unwrap(),
            "order ORD-8 placed"
        );
        assert!(is_used(&submit_to_registered("u-1", &shop, &form).await));
        assert_eq!(shop.runs("ORD-8").await, 1);
    }
}
