use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

#[consume_token(token = "", store = "", subject = " ")]
async fn place(session: &Session, form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() + &session.user_id })
}

fn main() {}
