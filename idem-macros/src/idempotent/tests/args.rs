//! `#[idempotent]`'s option parser.

use crate::common::diag;
use crate::common::store_arg::StoreSpec;
use crate::idempotent::args::*;
use proc_macro2::TokenStream;
use quote::quote;

fn parse(tokens: TokenStream) -> IdempotentArgs {
    syn::parse2(tokens).expect("the parser records errors instead of failing")
}

fn messages(args: IdempotentArgs) -> Vec<String> {
    match args.errors.finish() {
        Ok(()) => Vec::new(),
        Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn parses_a_full_attribute() {
    let args = parse(quote! {
        biz = "PAY", key = "req.order_no", store = "sqlite", ttl = "1d", lease = "10s",
        fingerprint = req, on_in_progress = "wait(5s)", heartbeat = "3s", crate = "renamed"
    });
    assert_eq!(args.biz.as_ref().unwrap().value(), "PAY");
    let key = args.key.as_ref().unwrap();
    assert!(key.lit.is_some());
    let key_expr = &key.expr;
    assert_eq!(quote!(#key_expr).to_string(), "req . order_no");
    assert!(matches!(args.store, Some(StoreSpec::Named(_))));
    assert_eq!(args.ttl.as_ref().unwrap().millis, 86_400_000);
    assert_eq!(args.lease.as_ref().unwrap().millis, 10_000);
    assert!(args.fingerprint.as_ref().unwrap().lit.is_none());
    assert!(matches!(
        args.on_in_progress,
        Some(InProgress::Wait(DurationArg { millis: 5_000, .. }))
    ));
    assert!(matches!(
        args.heartbeat,
        Some(HeartbeatArg::Every(DurationArg { millis: 3_000, .. }))
    ));
    assert_eq!(
        diag::path_to_string(args.krate.as_ref().unwrap()),
        "renamed"
    );
    assert!(messages(args).is_empty());
    let args = parse(quote! { biz = "PAY", key = "req.order_no", tx = "tx" });
    assert_eq!(args.tx.as_ref().unwrap().to_string(), "tx");
    assert!(args.store.is_none());
    assert!(
        messages(args).is_empty(),
        "with `tx`, `store` is not needed"
    );
}

#[test]
fn accepts_bare_expressions() {
    let args = parse(quote! {
        biz = "PAY", key = (req.user_id, req.client_req_id), store = self.store, crate = ::idem
    });
    assert!(args.key.as_ref().unwrap().lit.is_none());
    assert!(matches!(args.store, Some(StoreSpec::Given(_))));
    assert_eq!(diag::path_to_string(args.krate.as_ref().unwrap()), "::idem");
    assert!(messages(args).is_empty());
}

#[test]
fn reports_every_missing_option_once() {
    let found = messages(parse(quote! {}));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("missing `biz`, `key` and `store`"),
        "{found:?}"
    );
    assert!(found[0].contains(EXAMPLE));

    let found = messages(parse(quote! { biz = "PAY", store = "sqlite" }));
    assert_eq!(found.len(), 1);
    assert!(
        found[0].starts_with("missing `key` in `#[idempotent]`"),
        "{found:?}"
    );

    let found = messages(parse(quote! { biz = "PAY" }));
    assert!(
        found[0].starts_with("missing `key` and `store`"),
        "{found:?}"
    );
}

#[test]
fn suggests_a_close_option_and_lists_all() {
    let found = messages(parse(
        quote! { bizz = "PAY", key = "req.id", store = "sqlite" },
    ));
    assert_eq!(
        found.len(),
        1,
        "a suggested option is not reported missing too: {found:?}"
    );
    assert!(found[0].starts_with("unknown option `bizz` in `#[idempotent]`; did you mean `biz`?"));
    assert!(found[0].contains(
        "`on_in_progress`, `tx`, `heartbeat`, `store_timeout`, `tx_idle`, `recover`, `crate`"
    ));

    let found = messages(parse(
        quote! { biz = "P", key = "r.id", store = "s", colour = "red" },
    ));
    assert!(!found[0].contains("did you mean"), "{found:?}");
}

#[test]
fn reports_a_duplicate_at_the_second_occurrence() {
    let found = messages(parse(
        quote! { biz = "PAY", key = "r.id", biz = "REFUND", store = "s" },
    ));
    assert_eq!(
        found,
        ["duplicate option `biz`; each option may be given once, remove this one"]
    );
}

#[test]
fn collects_every_bad_value() {
    let found = messages(parse(quote! {
        biz = "PAY ORDER", key = "", store = "", ttl = "7x", lease = 30, on_in_progress = "later",
        tx = "a b", crate = "1"
    }));
    // (`tx` was given, so the `store` given beside it is refused too: 9 errors.)
    assert_eq!(found.len(), 9, "{found:#?}");
    assert!(found[0].contains("must not contain whitespace") && found[0].contains("PAY_ORDER"));
    assert!(found[1].starts_with("`key` is empty"));
    assert!(found[2].starts_with("`store` is empty"));
    assert!(found[3].starts_with("invalid `ttl` duration `\"7x\"`: unknown unit `x`"));
    assert!(found[4].starts_with("`lease` takes a string literal"));
    assert!(found[5].starts_with("unknown `on_in_progress` value `\"later\"`; the choices are"));
    assert!(found[6].starts_with("`tx` takes the name of the transaction parameter"));
    assert!(found[7].starts_with("`crate` takes the path"));
    assert!(
        found[8].starts_with("with `tx`, the records go to the store the transaction was begun on")
    );
}

#[test]
fn checks_biz() {
    let long = "P".repeat(33);
    let found = messages(parse(quote! { biz = #long, key = "r.id", store = "s" }));
    assert!(
        found[0].starts_with("`biz` is 33 bytes long in UTF-8; keep it at most 32 bytes"),
        "{found:?}"
    );
    // Bytes, as the store counts them: 11 CJK characters are 33 bytes.
    let cjk = "支付订单退款支付订单退款"
        .chars()
        .take(11)
        .collect::<String>();
    let found = messages(parse(quote! { biz = #cjk, key = "r.id", store = "s" }));
    assert!(found[0].starts_with("`biz` is 33 bytes long"), "{found:?}");
    let cjk_ok = "支付订单退款支付订单退"
        .chars()
        .take(10)
        .collect::<String>();
    assert!(messages(parse(quote! { biz = #cjk_ok, key = "r.id", store = "s" })).is_empty());
    let found = messages(parse(quote! { biz = "", key = "r.id", store = "s" }));
    assert!(found[0].starts_with("`biz` is empty"));
    let ok = "P".repeat(32);
    assert!(messages(parse(quote! { biz = #ok, key = "r.id", store = "s" })).is_empty());
}

#[test]
fn refuses_a_key_that_is_not_an_expression() {
    let found = messages(parse(quote! { biz = "P", key = "req.", store = "s" }));
    assert!(
        found[0].starts_with("`key` is not a Rust expression"),
        "{found:?}"
    );
}

#[test]
fn wants_ttl_longer_than_lease() {
    let found = messages(parse(
        quote! { biz = "P", key = "r.id", store = "s", ttl = "30s" },
    ));
    assert_eq!(
        found,
        [
            "`ttl` (30s) must be longer than `lease` (30s, the default): the record must outlive the lease \
          that protects it; raise `ttl` or lower `lease`"
        ]
    );
    let found = messages(parse(
        quote! { biz = "P", key = "r.id", store = "s", lease = "8d" },
    ));
    assert!(found[0].starts_with("`ttl` (7d, the default) must be longer than `lease` (8d)"));
    assert!(
        messages(parse(
            quote! { biz = "P", key = "r.id", store = "s", ttl = "31s" }
        ))
        .is_empty()
    );
    // a broken ttl has its own error, no comparison on top
    let found = messages(parse(
        quote! { biz = "P", key = "r.id", store = "s", ttl = "0s", lease = "1h" },
    ));
    assert_eq!(found.len(), 1);
}

#[test]
fn names_a_missing_value_and_a_missing_comma() {
    let found = messages(parse(quote! { biz, key = "r.id", store = "s" }));
    assert_eq!(found[0], "`biz` needs a value, e.g. `biz = \"PAY\"`");
    let found = messages(parse(quote! { biz = "P" key = "r.id", store = "s" }));
    assert!(
        found[0].starts_with("expected `,` between the options"),
        "{found:?}"
    );
    let found = messages(parse(quote! { "PAY", key = "r.id", store = "s" }));
    assert!(
        found[0].starts_with("expected an option such as"),
        "{found:?}"
    );
}

#[test]
fn parses_on_in_progress() {
    let args = parse(quote! { biz = "P", key = "r.id", store = "s", on_in_progress = "reject" });
    assert!(matches!(args.on_in_progress, Some(InProgress::Reject)));
    let found = messages(parse(
        quote! { biz = "P", key = "r.id", store = "s", on_in_progress = "wait(5)" },
    ));
    assert!(
        found[0].starts_with("invalid duration `5` in `on_in_progress"),
        "{found:?}"
    );
}

#[test]
fn checks_heartbeat() {
    let found = messages(parse(
        quote! { biz = "P", key = "r.id", store = "s", heartbeat = "30s" },
    ));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("`heartbeat` (30s) must be shorter than `lease` (30s)")
            && found[0].contains("heartbeat = \"10s\""),
        "{found:?}"
    );
    let found = messages(parse(
        quote! { biz = "P", key = "r.id", tx = "tx", heartbeat = "1s" },
    ));
    assert!(
        found[0].starts_with("`heartbeat` cannot be combined with `tx`"),
        "{found:?}"
    );
    assert!(
        messages(parse(
            quote! { biz = "P", key = "r.id", store = "s", lease = "9s", heartbeat = "3s" }
        ))
        .is_empty()
    );
}

#[test]
fn heartbeat_off_and_recover_parse() {
    let args = parse(quote! {
        biz = "PAY", key = "req.order_no", store = "sqlite", heartbeat = "off",
        recover = "find_payment(&req.order_no)"
    });
    assert!(matches!(args.heartbeat, Some(HeartbeatArg::Off(_))));
    let recover = args.recover.as_ref().unwrap();
    let expr = &recover.expr;
    assert_eq!(quote!(#expr).to_string(), "find_payment (& req . order_no)");
    assert!(messages(args).is_empty());
}

#[test]
fn tx_idle_parses_and_is_checked() {
    let args = parse(quote! { biz = "P", key = "r.id", tx = "tx", tx_idle = "2s" });
    assert!(matches!(
        args.tx_idle,
        Some(HeartbeatArg::Every(DurationArg { millis: 2_000, .. }))
    ));
    assert!(messages(args).is_empty());
    let args = parse(quote! { biz = "P", key = "r.id", tx = "tx", tx_idle = "off" });
    assert!(matches!(args.tx_idle, Some(HeartbeatArg::Off(_))));
    assert!(messages(args).is_empty());
    let args = parse(quote! { biz = "P", key = "r.id", tx = "tx", tx_idle = "24d" });
    assert!(messages(args).is_empty());
    let found = messages(parse(
        quote! { biz = "P", key = "r.id", tx = "tx", tx_idle = "25d" },
    ));
    assert!(
        found.len() == 1
            && found[0].starts_with("`tx_idle` (25d) is longer than the maximum of 24d"),
        "{found:?}"
    );
    let found = messages(parse(
        quote! { biz = "P", key = "r.id", store = "s", tx_idle = "2s" },
    ));
    assert!(
        found.len() == 1 && found[0].starts_with("`tx_idle` needs `tx`"),
        "{found:?}"
    );
    let found = messages(parse(
        quote! { biz = "P", key = "r.id", tx = "tx", tx_idle = "0s" },
    ));
    assert!(
        found.len() == 1 && found[0].starts_with("invalid `tx_idle` duration `\"0s\"`"),
        "{found:?}"
    );
}
