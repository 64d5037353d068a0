// A wrapper macro with real mistakes in what its caller passed: each error points at the caller's
// token inside the wrapper's invocation, not at the wrapper's definition.
use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

macro_rules! form_handler {
    ($name:ident, $token:expr, $store:literal) => {
        #[consume_token(token = $token, store = $store, restore_on_err)]
        async fn $name(form: &OrderForm) -> Result<Order, ShopError> {
            Ok(Order { item: form.item.clone() })
        }
    };
}

form_handler!(place, "fom.token", "tokens");
form_handler!(place_again, "form.token", "");

fn main() {}
