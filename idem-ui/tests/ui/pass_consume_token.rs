// The forms of `#[consume_token]` that must compile, run against an in-memory token store: a
// registered store in a string, bare expressions, a subject, `restore_on_err`, a body that moves
// its parameters, methods with `store = self.tokens` (also `&mut self`, generics), a reference to a
// token store, a `Result` alias, and a renamed crate.
extern crate idem as renamed;

use std::sync::Arc;
use std::time::Duration;

use idem::{IdemError, MemoryTokens, TokenStore, consume_token};

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

/// An error of the business, beside idem's refusals.
#[derive(Debug)]
pub enum CartError {
    Empty,
    Idem(IdemError),
}

impl From<IdemError> for CartError {
    fn from(error: IdemError) -> Self {
        CartError::Idem(error)
    }
}

type ShopResult<T> = Result<T, ShopError>;

#[consume_token(token = "form.token", store = "tokens")]
async fn place(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order {
        item: form.item.clone(),
    })
}

// The body moves `form`: the token was copied out before it runs.
#[consume_token(token = form.token.as_str(), store = "tokens", subject = session.user_id, restore_on_err)]
async fn place_for(session: &Session, form: OrderForm) -> Result<Order, CartError> {
    if form.item.is_empty() {
        return Err(CartError::Empty);
    }
    let _ = session;
    Ok(Order { item: form.item })
}

#[consume_token(token = "form.token", store = "tokens")]
async fn place_aliased(form: &OrderForm) -> ShopResult<Order> {
    Ok(Order {
        item: form.item.clone(),
    })
}

#[consume_token(token = "form.token", store = tokens)]
async fn place_with(tokens: &MemoryTokens, form: &OrderForm) -> Result<(), ShopError> {
    let _ = form;
    Ok(())
}

#[consume_token(token = "form.token", store = "tokens", crate = "renamed")]
async fn place_renamed(form: &OrderForm) -> Result<(), ShopError> {
    let _ = form;
    Ok(())
}

pub struct Shop {
    tokens: Arc<dyn TokenStore>,
    placed: u32,
}

impl Shop {
    #[consume_token(token = "form.token", store = self.tokens)]
    async fn place(&self, form: &OrderForm) -> Result<Order, ShopError> {
        Ok(Order {
            item: form.item.clone(),
        })
    }

    #[consume_token(token = form.token, store = self.tokens, subject = "session.user_id", restore_on_err)]
    async fn place_mut(&mut self, session: &Session, form: &OrderForm) -> Result<u32, ShopError> {
        let _ = (session, form);
        self.placed += 1;
        Ok(self.placed)
    }

    /// Generics and `where` clauses are kept; a reference to a token store works too.
    #[consume_token(token = "token.as_ref()", store = &*self.tokens)]
    async fn place_generic<T>(&self, token: T) -> Result<(), ShopError>
    where
        T: AsRef<str> + Send,
    {
        let _ = token;
        Ok(())
    }
}

fn assert_send<T: Send>(value: T) -> T {
    value
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    const TTL: Duration = Duration::from_secs(60);
    idem::register_tokens("tokens", MemoryTokens::new());
    let registered = idem::tokens("tokens").unwrap();
    let form = |token: String, item: &str| OrderForm {
        token,
        item: item.to_owned(),
    };
    let used = |r: &Result<Order, ShopError>| matches!(r, Err(ShopError(IdemError::TokenUsed)));

    let token = registered.issue(TTL, None).await.unwrap();
    let order = assert_send(place(&form(token.clone(), "book"))).await.unwrap();
    assert_eq!(order.item, "book");
    assert!(used(&place(&form(token.clone(), "book")).await));
    assert!(used(&place_aliased(&form(token, "book")).await));

    // A failed body puts the token back; the next submit runs.
    let session = Session {
        user_id: "u1".into(),
        account_no: 1,
    };
    let token = registered.issue(TTL, Some("u1")).await.unwrap();
    let failed = place_for(&session, form(token.clone(), "")).await;
    assert!(matches!(failed, Err(CartError::Empty)), "{failed:?}");
    let order = place_for(&session, form(token.clone(), "pen")).await.unwrap();
    assert_eq!(order.item, "pen");
    let again = place_for(&session, form(token, "pen")).await;
    assert!(matches!(again, Err(CartError::Idem(IdemError::TokenUsed))), "{again:?}");

    let tokens = MemoryTokens::new();
    let token = tokens.issue(TTL, None).await.unwrap();
    place_with(&tokens, &form(token.clone(), "cup")).await.unwrap();
    assert!(matches!(
        place_with(&tokens, &form(token, "cup")).await,
        Err(ShopError(IdemError::TokenUsed))
    ));
    let token = registered.issue(TTL, None).await.unwrap();
    place_renamed(&form(token, "cup")).await.unwrap();

    let mut shop = Shop {
        tokens: Arc::new(MemoryTokens::new()),
        placed: 0,
    };
    let token = shop.tokens.issue(TTL, None).await.unwrap();
    assert_eq!(shop.place(&form(token.clone(), "map")).await.unwrap().item, "map");
    assert!(used(&shop.place(&form(token, "map")).await));
    let token = shop.tokens.issue(TTL, Some("u1")).await.unwrap();
    assert_eq!(shop.place_mut(&session, &form(token, "ink")).await.unwrap(), 1);
    let token = shop.tokens.issue(TTL, None).await.unwrap();
    shop.place_generic(token.as_str()).await.unwrap();
    assert!(matches!(
        shop.place_generic(token).await,
        Err(ShopError(IdemError::TokenUsed))
    ));
}
