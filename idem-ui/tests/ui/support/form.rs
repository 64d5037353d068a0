//! The form, session, order and error types the `#[consume_token]` UI tests share. Each test is its
//! own crate: include with `#[path = "support/form.rs"] mod form_types; use form_types::*;`. A type
//! that is the subject of a test (an error lacking `From<IdemError>`, …) stays in that test.

use idem::IdemError;

/// What the page submits: the token it was given, and the order.
pub struct OrderForm {
    pub token: String,
    pub item: String,
}

/// Who submits.
pub struct Session {
    pub user_id: String,
    pub account_no: u64,
}

#[derive(Debug, PartialEq)]
pub struct Order {
    pub item: String,
}

#[derive(Debug)]
pub struct ShopError(pub IdemError);

impl From<IdemError> for ShopError {
    fn from(error: IdemError) -> Self {
        ShopError(error)
    }
}
