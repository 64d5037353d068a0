use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

// A constant token: every call would spend the same one.
#[consume_token(token = "\"0123456789abcdef\"", store = "tokens")]
async fn place(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

#[consume_token(token = TOKEN, store = "tokens")]
async fn place_bare() -> Result<Order, ShopError> {
    Ok(Order { item: String::new() })
}

const TOKEN: &str = "0123456789abcdef";

fn main() {}
