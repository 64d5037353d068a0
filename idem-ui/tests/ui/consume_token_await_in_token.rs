use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

async fn token_of(form: &OrderForm) -> String {
    form.token.clone()
}

#[consume_token(token = "token_of(form).await", store = "tokens")]
async fn place(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

async fn user_of(session: &Session) -> String {
    session.user_id.clone()
}

#[consume_token(token = form.token, store = "tokens", subject = user_of(session).await)]
async fn place_for(session: &Session, form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() + &session.user_id })
}

fn main() {}
