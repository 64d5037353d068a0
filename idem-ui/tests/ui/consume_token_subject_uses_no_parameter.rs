use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

#[consume_token(token = "form.token", store = "tokens", subject = "\"everyone\"")]
async fn place(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

fn main() {}
