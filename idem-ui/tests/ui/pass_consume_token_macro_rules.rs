// `#[consume_token]` handlers declared through a `macro_rules!` wrapper: every option value arrives
// as a fragment (`literal`, `expr`, `ident`, `path`), wrapped in the invisible group `macro_rules!`
// puts around it, and means what the same value written by hand means.
use std::time::Duration;

use idem::{IdemError, MemoryTokens, TokenStore, consume_token};

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

// A literal store name and strings holding the expressions.
macro_rules! form_handler {
    ($name:ident, $token:expr, $store:literal, $subject:expr, $krate:path) => {
        #[consume_token(token = $token, store = $store, subject = $subject, restore_on_err, crate = $krate)]
        async fn $name(session: &Session, form: &OrderForm) -> Result<Order, ShopError> {
            let _ = session;
            Ok(Order {
                item: form.item.clone(),
            })
        }
    };
}

form_handler!(place, "form.token", "tokens", "session.user_id", ::idem);

// Bare expressions name the parameters the caller named: `macro_rules!` hygiene keeps a parameter
// the wrapper wrote out of reach of the caller's tokens.
macro_rules! bare_handler {
    ($name:ident, $form:ident, $tokens:ident, $token:expr, $store:expr) => {
        #[consume_token(token = $token, store = $store)]
        async fn $name($tokens: &MemoryTokens, $form: &OrderForm) -> Result<Order, ShopError> {
            Ok(Order {
                item: $form.item.clone(),
            })
        }
    };
}

bare_handler!(place_bare, form, tokens, form.token, tokens);

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let ttl = Duration::from_secs(60);
    idem::register_tokens("tokens", MemoryTokens::new());
    let registered = idem::tokens("tokens").unwrap();
    let session = Session {
        user_id: "u1".into(),
        account_no: 1,
    };
    let token = registered.issue(ttl, Some("u1")).await.unwrap();
    let form = OrderForm {
        token,
        item: "book".into(),
    };
    assert_eq!(place(&session, &form).await.unwrap().item, "book");
    assert!(matches!(
        place(&session, &form).await,
        Err(ShopError(IdemError::TokenUsed))
    ));

    let tokens = MemoryTokens::new();
    let form = OrderForm {
        token: tokens.issue(ttl, None).await.unwrap(),
        item: "pen".into(),
    };
    assert_eq!(place_bare(&tokens, &form).await.unwrap().item, "pen");
    assert!(place_bare(&tokens, &form).await.is_err());
}
