use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

// The attribute is wrong, but `place` is still emitted as written: `main` compiles against it and
// the only error is the attribute's.
#[consume_token(token = "form.token", stor = "tokens")]
async fn place(form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() })
}

fn main() {
    let form = OrderForm {
        token: "0123".into(),
        item: "book".into(),
    };
    let pending = place(&form);
    drop(pending);
}
