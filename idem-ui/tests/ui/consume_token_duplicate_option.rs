use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

#[consume_token(token = "form.token", store = "tokens", store = "other")]
async fn place(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

#[consume_token(token = "form.token", store = "tokens", restore_on_err, restore_on_err)]
async fn place_again(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

fn main() {}
