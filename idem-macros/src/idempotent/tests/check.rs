//! `#[idempotent]`'s checks against the fn.

use crate::idempotent::args::{self, IdempotentArgs};
use crate::idempotent::check::*;
use proc_macro2::TokenStream;
use quote::quote;
use syn::ItemFn;

fn check_tokens(args: TokenStream, item: TokenStream) -> Result<Spec, Vec<String>> {
    let args: IdempotentArgs = syn::parse2(args).unwrap();
    let item: ItemFn = syn::parse2(item).unwrap();
    check(args, &item).map_err(|error| error.into_iter().map(|e| e.to_string()).collect())
}

fn errors(args: TokenStream, item: TokenStream) -> Vec<String> {
    match check_tokens(args, item) {
        Ok(_) => Vec::new(),
        Err(messages) => messages,
    }
}

fn pay_with(key: TokenStream) -> Vec<String> {
    errors(
        quote!(biz = "PAY", key = #key, store = "sqlite"),
        quote!(
            async fn pay(req: &PayReq, user: &User) -> Result<Receipt, PayError> {
                todo!()
            }
        ),
    )
}

#[test]
fn accepts_a_good_fn() {
    let spec = check_tokens(
        quote!(
            biz = "PAY",
            key = "req.order_no",
            store = "sqlite",
            fingerprint = "req"
        ),
        quote!(
            pub async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
                todo!()
            }
        ),
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(spec.ttl_ms, args::DEFAULT_TTL_MS);
    assert_eq!(spec.lease_ms, args::DEFAULT_LEASE_MS);
    let ok = spec.ret.ok_ty.as_ref().unwrap();
    assert_eq!(quote!(#ok).to_string(), "Receipt");
    assert!(spec.ret.err_ty.is_some());
    assert!(spec.fingerprint.is_some());
}

#[test]
fn accepts_methods_generics_and_result_aliases() {
    let spec = check_tokens(
        quote!(biz = "PAY", key = "self.tenant", store = self.store),
        quote!(
            async fn pay<T: Into<u64>>(&self, _n: T) -> anyhow::Result<Vec<u8>>
            where
                T: Send,
            {
                todo!()
            }
        ),
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    assert!(spec.ret.err_ty.is_none());
    assert!(
        check_tokens(
            quote!(biz = "PAY", key = (a, b), store = "s"),
            quote!(
                async fn pay((a, b): (u8, u8)) -> io::Result<u8> {
                    todo!()
                }
            ),
        )
        .is_ok()
    );
}

#[test]
fn refuses_sync_const_and_non_result_fns() {
    let found = errors(
        quote!(biz = "PAY", key = "req.id", store = "s"),
        quote!(
            const fn pay(req: &Req) -> Result<u8, E> {
                todo!()
            }
        ),
    );
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("cannot wrap a `const fn`") && found[0].contains("remove `const`"));
    assert!(found[1].contains("needs an `async fn`") && found[1].contains("add `async`"));

    let found = errors(
        quote!(biz = "PAY", key = "req.id", store = "s"),
        quote!(
            async fn pay(req: &Req) -> Option<u8> {
                todo!()
            }
        ),
    );
    assert!(
        found[0].contains("returns `Result<T, E>`") && found[0].contains("wrap the return type")
    );

    let found = errors(
        quote!(biz = "PAY", key = "req.id", store = "s"),
        quote!(
            async fn pay(req: &Req) {
                todo!()
            }
        ),
    );
    assert!(found[0].contains("add a return type"), "{found:?}");

    let found = errors(
        quote!(biz = "PAY", key = "req.id", store = "s"),
        quote!(
            async fn pay(req: &Req) -> Result<impl Serialize, E> {
                todo!()
            }
        ),
    );
    assert!(found[0].contains("needs a named type"), "{found:?}");
}

#[test]
fn names_an_unknown_parameter_with_a_suggestion() {
    let found = pay_with(quote!("reqq.order_no"));
    assert_eq!(
        found,
        ["unknown parameter `reqq` in `key`; did you mean `req`? the parameters are `req`, `user`"]
    );
    let found = pay_with(quote!(order.id));
    assert_eq!(
        found,
        ["unknown parameter `order` in `key`; the parameters are `req`, `user`"]
    );
}

#[test]
fn a_composite_key_naming_a_caller_that_is_no_parameter_says_to_take_it() {
    let found = errors(
        quote!(
            biz = "ORDER",
            key = "(caller.id, req.client_req_id)",
            store = "s"
        ),
        quote!(
            async fn create(req: &Req) -> Result<Receipt, E> {
                todo!()
            }
        ),
    );
    assert_eq!(
        found,
        [
            "unknown parameter `caller` in `key`; the parameters are `req`. To scope the key by its \
             caller, take the caller as a parameter of `create` too: `caller: &…`"
        ]
    );
    // Outside a tuple, or with a close match, the message stays as it was.
    assert_eq!(
        pay_with(quote!("(usr.id, req.order_no)")),
        ["unknown parameter `usr` in `key`; did you mean `user`? the parameters are `req`, `user`"]
    );
}

#[test]
fn accepts_keys_over_parameters() {
    assert!(pay_with(quote!("req.order_no")).is_empty());
    assert!(pay_with(quote!("(req.user_id, req.client_req_id)")).is_empty());
    assert!(pay_with(quote!(format!("{}-{}", req.a, user.b))).is_empty());
    assert!(pay_with(quote!(format!("{req}"))).is_empty());
    assert!(pay_with(quote!(hash(&req.order_no))).is_empty());
    assert!(pay_with(quote!(req.items.iter().map(|item| item.id).sum::<u64>())).is_empty());
    assert!(pay_with(quote!(Key::new(req.id, MAX))).is_empty());
}

#[test]
fn refuses_a_key_that_uses_no_parameter() {
    let found = pay_with(quote!("42"));
    assert_eq!(found.len(), 1);
    assert!(
        found[0].starts_with("`key` uses no parameter of `pay`")
            && found[0].contains("every call would share one record"),
        "{found:?}"
    );
    let found = errors(
        quote!(biz = "PAY", key = "CONST", store = "s", fingerprint = "1"),
        quote!(
            async fn tick() -> Result<(), E> {
                todo!()
            }
        ),
    );
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("`tick` has no parameters"));
    assert!(found[1].starts_with("`fingerprint` uses no parameter"));
}

#[test]
fn refuses_await_in_the_key() {
    let found = pay_with(quote!(req.id().await));
    assert_eq!(found.len(), 1);
    assert!(found[0].starts_with("`.await` is not allowed in `key`"));
    let found = pay_with(quote!(format!("{}", req.id().await)));
    assert!(
        found[0].starts_with("`.await` is not allowed in `key`"),
        "{found:?}"
    );
}

#[test]
fn refuses_values_that_change_on_every_retry() {
    for key in [
        quote!("Uuid::new_v4()"),
        quote!((req.id, uuid::Uuid::now_v7())),
        quote!((req.id, std::time::SystemTime::now())),
        quote!((req.id, chrono::Utc::now().timestamp())),
        quote!((req.id, rand::random::<u64>())),
        quote!((req.id, rand::thread_rng().next_u64())),
        quote!((req.id, req.rng.random::<u64>())),
        quote!(format!("{}{}", req.id, Uuid::new_v4())),
    ] {
        let found = pay_with(key.clone());
        assert_eq!(found.len(), 1, "{key}: {found:?}");
        assert!(
            found[0].contains("returns a new value on every call")
                && found[0]
                    .contains("the key must come from the caller and stay stable across retries"),
            "{found:?}"
        );
    }
    assert!(pay_with(quote!((req.id, req.created.now))).is_empty());
}

#[test]
fn checks_the_fingerprint_like_the_key() {
    let found = errors(
        quote!(biz = "PAY", key = "req.id", store = "s", fingerprint = "rq"),
        quote!(
            async fn pay(req: &Req) -> Result<u8, E> {
                todo!()
            }
        ),
    );
    assert_eq!(
        found,
        ["unknown parameter `rq` in `fingerprint`; did you mean `req`? the parameters are `req`"]
    );
}

#[test]
fn checks_that_tx_names_a_parameter() {
    let found = errors(
        quote!(biz = "PAY", key = "req.id", tx = "txn"),
        quote!(
            async fn pay(tx: &mut Tx, req: &Req) -> Result<u8, E> {
                todo!()
            }
        ),
    );
    assert_eq!(found.len(), 1);
    assert!(
        found[0].starts_with(
            "`tx` names `txn`, which is not a parameter of `pay`; did you mean `tx`? the parameters are `tx`, `req`"
        ),
        "{found:?}"
    );
}

#[test]
fn the_tx_parameter_must_be_taken_by_mut() {
    let tx_errors = |sig: TokenStream| {
        errors(
            quote!(biz = "PAY", key = "req.id", tx = "tx"),
            quote!(async fn pay(#sig) -> Result<u8, E> { todo!() }),
        )
    };
    for good in [
        quote!(tx: &mut SqliteTx, req: &Req),
        quote!(tx: &'a mut idem::MySqlTx, req: &Req),
        quote!(tx: &mut dyn idem::IdemTx, req: &Req),
        quote!(tx: &mut T, req: &Req),
        // Only the type checker can tell.
        quote!(tx: tx_type!(), req: &Req),
        // Bound inside a pattern: left to the type checker too.
        quote!((tx, n): (&mut SqliteTx, u8), req: &Req),
    ] {
        assert_eq!(tx_errors(good.clone()), Vec::<String>::new(), "{good}");
    }
    let found = tx_errors(quote!(tx: &SqliteTx, req: &Req));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("`tx` is a shared reference;"),
        "{found:?}"
    );
    for by_value in [
        quote!(tx: SqliteTx, req: &Req),
        quote!(mut tx: u64, req: &Req),
        quote!(tx: impl IdemTx, req: &Req),
    ] {
        let found = tx_errors(by_value.clone());
        assert_eq!(found.len(), 1, "{by_value}: {found:?}");
        assert!(
            found[0].contains(
                "`tx` is taken by value; `tx` needs a `&mut` transaction from the store's `begin()`: \
                 write `tx: &mut idem::SqliteTx` (or `idem::MySqlTx`, `idem::PgTx`)"
            ),
            "{found:?}"
        );
    }
    let on_self = |receiver: TokenStream| {
        errors(
            quote!(biz = "PAY", key = "req.id", tx = "self"),
            quote!(async fn pay(#receiver, req: &Req) -> Result<u8, E> { todo!() }),
        )
    };
    assert!(on_self(quote!(&mut self)).is_empty());
    assert!(on_self(quote!(self: &mut Self)).is_empty());
    assert!(on_self(quote!(&self))[0].starts_with("`self` is a shared reference;"));
    assert!(on_self(quote!(self))[0].contains("write `&mut self`"));
}

#[test]
fn hints_at_a_quoted_store_name() {
    let found = errors(
        quote!(biz = "PAY", key = "req.id", store = sqlite),
        quote!(
            async fn pay(req: &Req) -> Result<u8, E> {
                todo!()
            }
        ),
    );
    assert!(found[0].contains("write `store = \"sqlite\"`"), "{found:?}");
    assert!(
        errors(
            quote!(biz = "PAY", key = "req.id", store = store),
            quote!(
                async fn pay(store: &S, req: &Req) -> Result<u8, E> {
                    todo!()
                }
            ),
        )
        .is_empty()
    );
}

#[test]
fn reports_argument_and_signature_errors_together() {
    let found = errors(
        quote!(biz = "PAY PAY", key = "reqq.id", store = "s"),
        quote!(
            fn pay(req: &Req) -> u8 {
                todo!()
            }
        ),
    );
    assert_eq!(found.len(), 4, "{found:#?}");
}
