use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

// Generic like an alias of `Result`, but it is not one.
pub struct Outcome<T>(pub T);

#[consume_token(token = "form.token", store = "tokens")]
async fn place(form: &OrderForm) -> Outcome<Order> {
    Outcome(Order { item: form.item.clone() })
}

fn main() {}
