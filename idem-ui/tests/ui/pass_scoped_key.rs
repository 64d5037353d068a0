//! A key scoped by its caller: the client's request id is unique only per user, so the user's id
//! is part of the key, from a parameter of its own, a field of the request, or a method's `self`.

use idem::idempotent;
use serde::{Deserialize, Serialize};

#[derive(Debug)]
pub struct OrderError(pub idem::IdemError);

impl From<idem::IdemError> for OrderError {
    fn from(error: idem::IdemError) -> Self {
        OrderError(error)
    }
}

pub struct User {
    pub id: u64,
    pub tenant: String,
}

#[derive(Serialize)]
pub struct CreateOrder {
    pub client_req_id: String,
}

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: u64,
}

#[idempotent(biz = "ORDER", key = "(user.id, req.client_req_id)", store = "sqlite")]
async fn create_order(user: &User, req: &CreateOrder) -> Result<Order, OrderError> {
    Ok(Order { id: user.id })
}

// Tenant and user, bare and nested; the caller's parts may be `String`s or integers.
#[idempotent(biz = "ORDER", key = ((user.tenant, user.id), req.client_req_id), store = "sqlite")]
async fn create_for_tenant(req: &CreateOrder, user: &User) -> Result<Order, OrderError> {
    Ok(Order { id: user.id })
}

pub struct Session {
    pub user: User,
}

impl Session {
    #[idempotent(biz = "ORDER", key = "(self.user.id, req.client_req_id)", store = "sqlite")]
    async fn create(&self, req: &CreateOrder) -> Result<Order, OrderError> {
        Ok(Order { id: self.user.id })
    }
}

fn main() {
    let user = User {
        id: 7,
        tenant: "acme".into(),
    };
    let req = CreateOrder {
        client_req_id: "r-1".into(),
    };
    drop(create_order(&user, &req));
    drop(create_for_tenant(&req, &user));
    let session = Session { user };
    drop(session.create(&req));
}
