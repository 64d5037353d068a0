use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

#[consume_token]
async fn place(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

#[consume_token(token = "form.token")]
async fn place_without_store(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

#[consume_token(store = "tokens", subject = "session.user_id")]
async fn place_without_token(session: &Session, form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() + &session.user_id })
}

fn main() {}
