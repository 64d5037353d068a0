use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

use std::sync::Arc;

pub struct PayService {
    store: Arc<idem::MemoryStore>,
    fee: u64,
}

impl PayService {
    #[idempotent(biz = "PAY", key = "req.order_no", store = self.store)]
    pub async fn pay(&self, req: &PayReq) -> Result<Receipt, PayError> {
        Ok(Receipt {
            id: req.user_id + self.fee,
        })
    }

    #[idempotent(biz = "REFUND", key = "self.fee", store = &*self.store)]
    async fn refund_mut(&mut self, req: &PayReq) -> Result<Receipt, PayError> {
        self.fee += 1;
        Ok(Receipt { id: req.user_id })
    }

    #[idempotent(biz = "CLOSE", key = "req.order_no", store = self.store.clone())]
    async fn close(self, req: PayReq) -> Result<u64, PayError> {
        Ok(self.fee + req.user_id)
    }

    /// Generics and `where` clauses are kept.
    #[idempotent(biz = "TAG", key = "tag.as_ref()", store = self.store)]
    async fn tag<T>(&self, tag: T) -> Result<Vec<String>, PayError>
    where
        T: AsRef<str>,
    {
        Ok(vec![tag.as_ref().to_owned()])
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut service = PayService {
        store: Arc::new(idem::MemoryStore::new()),
        fee: 1,
    };
    let req = PayReq {
        order_no: "A-1".into(),
        user_id: 7,
    };
    assert_eq!(service.pay(&req).await.unwrap(), Receipt { id: 8 });
    service.fee = 100;
    assert_eq!(
        service.pay(&req).await.unwrap(),
        Receipt { id: 8 },
        "replayed"
    );
    service.refund_mut(&req).await.unwrap();
    assert_eq!(service.tag("x").await.unwrap(), ["x"]);
    assert_eq!(service.close(req).await.unwrap(), 108);
}
