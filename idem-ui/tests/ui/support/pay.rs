//! The request, result and error types the `#[idempotent]` UI tests share. Each test is its own
//! crate: include with `#[path = "support/pay.rs"] mod pay_types; use pay_types::*;`. A type that
//! is the subject of a test (an `Ok` type lacking `Serialize`, an error lacking
//! `From<IdemError>`, …) stays in that test.

use idem::IdemError;
use serde::{Deserialize, Serialize};

#[derive(Serialize)]
pub struct PayReq {
    pub order_no: String,
    pub user_id: u64,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub id: u64,
}

#[derive(Debug)]
pub struct PayError(pub IdemError);

impl From<IdemError> for PayError {
    fn from(error: IdemError) -> Self {
        PayError(error)
    }
}
