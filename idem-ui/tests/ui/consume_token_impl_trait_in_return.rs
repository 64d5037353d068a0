use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

#[consume_token(token = "form.token", store = "tokens")]
async fn place(form: &OrderForm) -> Result<impl std::fmt::Display, ShopError> {
    Ok(form.item.clone())
}

fn main() {}
