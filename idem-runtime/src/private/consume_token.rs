//! The runtime side of `#[consume_token]`: spend the token, run the body only if that succeeded,
//! and put the token back when the body fails and the attribute says `restore_on_err`.

use std::future::Future;
use std::sync::Arc;

use tracing::Instrument;

use crate::engine::snapshot::ErrType;
use crate::{IdemError, TokenStore};

/// Where a `#[consume_token]` fn's tokens live.
pub enum TokenStoreArg<'a> {
    /// A token store registered under this name (`idem::register_tokens`).
    Named(&'static str),
    /// A token store given directly (`store = self.tokens`).
    Given(&'a dyn TokenStore),
}

enum TokenStoreHandle<'a> {
    Owned(Arc<dyn TokenStore>),
    Borrowed(&'a dyn TokenStore),
}

impl TokenStoreHandle<'_> {
    fn get(&self) -> &dyn TokenStore {
        match self {
            TokenStoreHandle::Owned(store) => &**store,
            TokenStoreHandle::Borrowed(store) => *store,
        }
    }
}

impl<'a> TokenStoreArg<'a> {
    fn resolve(self) -> Result<TokenStoreHandle<'a>, IdemError> {
        match self {
            TokenStoreArg::Named(name) => crate::tokens(name).map(TokenStoreHandle::Owned),
            TokenStoreArg::Given(store) => Ok(TokenStoreHandle::Borrowed(store)),
        }
    }
}

/// Spends `token` (issued to `subject`) in `store`, then runs `body`.
///
/// - The token cannot be spent (used already, invalid, another subject's, the store unknown or
///   failing): the body does not run, and the error comes back through `err` (the fn's own error
///   type).
/// - The body returns `Ok`: its value.
/// - The body returns `Err`: the error. With `restore_on_err` the token is put back first, so the
///   user can submit again; a restore that fails is logged (`warn`) and the body's error is still
///   what the caller gets. Without it, the token stays spent.
/// - The body panics, or its future is dropped: the token stays spent. A duplicate never runs the
///   body twice, at the price of a user who must reload the page to try again.
///
/// The whole call is a `tracing` span `idem.consume_token` with the store's `backend` and the
/// `outcome`: `executed`, `failed`, `restored`, `restore_failed`, `used`, `invalid` or `rejected`.
pub async fn consume_token<T, E, F>(
    store: TokenStoreArg<'_>,
    token: String,
    subject: Option<String>,
    restore_on_err: bool,
    err: ErrType<E>,
    body: F,
) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
{
    let span = tracing::info_span!(
        "idem.consume_token",
        backend = tracing::field::Empty,
        restore_on_err,
        outcome = tracing::field::Empty
    );
    let call = async {
        let (out, outcome) =
            spend_then_run(store, &token, subject.as_deref(), restore_on_err, body).await;
        tracing::Span::current().record("outcome", outcome);
        out.map_err(|e| match e {
            Failure::Idem(e) => err.from_idem(e),
            Failure::Body(e) => e,
        })
    };
    call.instrument(span).await
}

/// Why a call did not return `Ok`.
enum Failure<E> {
    /// The token could not be spent; the body did not run.
    Idem(IdemError),
    /// The body's own error.
    Body(E),
}

/// The call, and its outcome's name for the span.
async fn spend_then_run<T, E, F>(
    store: TokenStoreArg<'_>,
    token: &str,
    subject: Option<&str>,
    restore_on_err: bool,
    body: F,
) -> (Result<T, Failure<E>>, &'static str)
where
    F: Future<Output = Result<T, E>>,
{
    let store = match store.resolve() {
        Ok(store) => store,
        Err(e) => return (Err(Failure::Idem(e)), "rejected"),
    };
    let store = store.get();
    tracing::Span::current().record("backend", store.backend());
    let spent = store.consume(token, subject).await;
    crate::metrics::count_token_op("consume", &spent);
    if let Err(e) = spent {
        let outcome = match e {
            IdemError::TokenUsed => "used",
            IdemError::TokenInvalid { .. } => "invalid",
            _ => "rejected",
        };
        return (Err(Failure::Idem(e)), outcome);
    }
    match body.await {
        Ok(value) => (Ok(value), "executed"),
        Err(e) if !restore_on_err => (Err(Failure::Body(e)), "failed"),
        Err(e) => match counted("restore", store.restore(token, subject).await) {
            Ok(()) => (Err(Failure::Body(e)), "restored"),
            Err(restore) => {
                tracing::warn!(
                    error = %restore,
                    "the body failed and its submit token could not be restored; it stays spent"
                );
                (Err(Failure::Body(e)), "restore_failed")
            }
        },
    }
}

fn counted<T>(op: &'static str, result: Result<T, IdemError>) -> Result<T, IdemError> {
    crate::metrics::count_token_op(op, &result);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryTokens;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    #[derive(Debug)]
    enum ShopError {
        Declined,
        Idem(IdemError),
    }

    impl From<IdemError> for ShopError {
        fn from(e: IdemError) -> Self {
            ShopError::Idem(e)
        }
    }

    async fn call(
        tokens: &MemoryTokens,
        token: &str,
        restore_on_err: bool,
        runs: &AtomicU32,
        fail: bool,
    ) -> Result<u32, ShopError> {
        consume_token(
            TokenStoreArg::Given(tokens),
            token.to_owned(),
            None,
            restore_on_err,
            ErrType::new(),
            async {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                if fail {
                    Err(ShopError::Declined)
                } else {
                    Ok(n)
                }
            },
        )
        .await
    }

    #[tokio::test]
    async fn runs_once_restores_only_when_asked() {
        let tokens = MemoryTokens::new();
        let runs = AtomicU32::new(0);
        let token = tokens.issue(Duration::from_secs(60), None).await.unwrap();
        assert!(matches!(
            call(&tokens, &token, false, &runs, true).await,
            Err(ShopError::Declined)
        ));
        assert!(matches!(
            call(&tokens, &token, true, &runs, false).await,
            Err(ShopError::Idem(IdemError::TokenUsed))
        ));
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        let token = tokens.issue(Duration::from_secs(60), None).await.unwrap();
        assert!(matches!(
            call(&tokens, &token, true, &runs, true).await,
            Err(ShopError::Declined)
        ));
        assert_eq!(call(&tokens, &token, true, &runs, false).await.unwrap(), 3);
        assert!(matches!(
            call(&tokens, &token, true, &runs, false).await,
            Err(ShopError::Idem(IdemError::TokenUsed))
        ));
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn an_unknown_name_runs_nothing() {
        let runs = AtomicU32::new(0);
        let out: Result<(), ShopError> = consume_token(
            TokenStoreArg::Named("no such tokens"),
            "t".to_owned(),
            None,
            false,
            ErrType::new(),
            async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(())
            },
        )
        .await;
        assert!(matches!(
            out,
            Err(ShopError::Idem(IdemError::UnknownStore { .. }))
        ));
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }
}
