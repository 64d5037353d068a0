use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

pub struct Config {
    pub tokens_url: String,
}

#[consume_token(token = "form.token", store = config.tokens_url)]
async fn place(config: &Config, form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

pub struct Shop {
    pub store: idem::MemoryStore,
}

impl Shop {
    // The record store, where its tokens were meant.
    #[consume_token(token = "form.token", store = self.store)]
    async fn place(&self, form: &OrderForm) -> Result<Order, ShopError> {
        Ok(Order { item: form.item.clone() })
    }
}

fn main() {}
