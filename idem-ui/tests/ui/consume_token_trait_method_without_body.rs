use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

trait Shop {
    #[consume_token(token = "form.token", store = "tokens")]
    async fn place(&self, form: &OrderForm) -> Result<Order, ShopError>;
}

fn main() {}
