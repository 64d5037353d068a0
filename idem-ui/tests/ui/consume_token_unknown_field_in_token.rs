use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

// A misspelled field is reported by rustc, inside the attribute.
#[consume_token(token = "form.tokn", store = "tokens")]
async fn place(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

#[consume_token(token = form.tokn, store = "tokens")]
async fn place_bare(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

fn main() {}
