use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

#[consume_token(token = "form.token", store = "tokens")]
fn place(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

#[consume_token(token = "form.token", store = "tokens")]
const fn place_const(form: &OrderForm) -> Result<usize, ShopError> {
    Ok(form.item.len())
}

fn main() {}
