use idem::consume_token;

#[path = "support/form.rs"]
mod form_types;
use form_types::*;

// The account number is a number: the subject must be text.
#[consume_token(token = "form.token", store = "tokens", subject = "session.account_no")]
async fn place(session: &Session, form: &OrderForm) -> Result<Order, ShopError> {
    Ok(Order { item: form.item.clone() + &session.user_id })
}

fn main() {}
