use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

#[consume_token(tokn = "form.token", store = "tokens")]
async fn place(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

#[consume_token(token = "form.token", store = "tokens", restore_on_error)]
async fn place_again(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

fn main() {}
