use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

#[consume_token(token = "form.token", store = "tokens")]
struct Checkout {
    form: OrderForm,
}

fn main() {
    let _ = |c: Checkout| c.form.item;
}
