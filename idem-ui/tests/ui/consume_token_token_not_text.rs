use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

pub struct NumberedForm {
    pub token: u64,
}

#[consume_token(token = "form.token", store = "tokens")]
async fn place(form: &NumberedForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.token.to_string() })
}

#[consume_token(token = form.token.checked_add(1), store = "tokens")]
async fn place_bare(form: &NumberedForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.token.to_string() })
}

fn main() {}
