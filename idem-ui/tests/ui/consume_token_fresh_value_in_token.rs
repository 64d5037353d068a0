use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

// A token made on the server never matches one the page was given.
#[consume_token(token = "uuid::Uuid::new_v4().to_string()", store = "tokens")]
async fn place(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

#[consume_token(
    token = form.token,
    store = "tokens",
    subject = format!("{}-{:?}", session.user_id, std::time::SystemTime::now())
)]
async fn place_for(session: &Session, form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() + &session.user_id })
}

fn main() {}
