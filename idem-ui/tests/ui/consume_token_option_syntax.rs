use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

// A value-less option, a missing comma, and a value where an option name belongs: each reported
// once, at its token, and parsing goes on with the next option.
#[consume_token(token, store = "tokens")]
async fn place(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

#[consume_token(token = "form.token" store = "tokens")]
async fn place_again(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

#[consume_token("form.token", store = "tokens")]
async fn place_once_more(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

fn main() {}
