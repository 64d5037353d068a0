use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

#[consume_token(token = "form.token", store = "tokens")]
async fn place(form: &OrderForm) -> Option<Order> {
    Some(Order { item: form.item.clone() })
}

#[consume_token(token = "form.token", store = "tokens")]
async fn place_quietly(form: &OrderForm) {
    let _ = form;
}

fn main() {}
