//! `#[idempotent]`'s expansion and its fallback.

use crate::idempotent::*;
use quote::quote;

fn expand(args: TokenStream, item: TokenStream) -> String {
    idempotent(args, item).to_string()
}

fn compile_errors(output: &str) -> usize {
    output.matches("compile_error").count()
}

#[test]
fn expands_the_lease_mode() {
    let out = expand(
        quote!(biz = "PAY", key = "req.order_no", store = "sqlite"),
        quote! {
            /// Pays.
            #[inline]
            pub async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
                #![allow(unused)]
                Ok(Receipt)
            }
        },
    );
    assert_eq!(compile_errors(&out), 0, "{out}");
    for expected in [
        "# [doc = r\" Pays.\"] # [inline] pub async fn pay (req : & PayReq) -> Result < Receipt , PayError > { # ! [allow (unused)]",
        "let __idem_ok = < Receipt as :: idem :: __private :: Storable > :: proof () ;",
        "let __idem_err = < PayError as :: idem :: __private :: CarriesIdemError > :: proof () ;",
        "let __idem_call = :: idem :: __private :: checked (:: idem :: __private :: Call :: new (\"PAY\" , & (req . order_no)) \
         . ttl (:: core :: time :: Duration :: from_millis (604800000u64)) \
         . lease (:: core :: time :: Duration :: from_millis (30000u64))) ;",
        "match :: idem :: __private :: run_now :: < Receipt , PayError > (:: idem :: __private :: StoreArg :: Named (\"sqlite\") , & __idem_call , __idem_ok , __idem_err) {",
        ":: idem :: __private :: Now :: Answered (__idem_answer) => __idem_answer ,",
        ":: idem :: __private :: Now :: Run (__idem_prepared) => :: idem :: __private :: run_prepared :: < Receipt , PayError , _ > (__idem_prepared , __idem_call , __idem_ok , __idem_err , async {",
        "let __idem_fake_return : Result < Receipt , PayError > = loop { } ; return __idem_fake_return ;",
        "Ok (Receipt) }) . await , } }",
    ] {
        assert!(out.contains(expected), "missing `{expected}` in\n{out}");
    }
    assert!(
        !out.contains("AsStore"),
        "only a given store needs the import: {out}"
    );
    assert!(
        !out.contains("async move"),
        "the body borrows the parameters: {out}"
    );
}

/// With a recover fn the claim is made first as well; the recover closure goes with the run.
#[test]
fn expands_a_recover_fn_after_the_claim_made_first() {
    let out = expand(
        quote!(
            biz = "PAY",
            key = "req.order_no",
            store = "mem",
            recover = "find(&req.order_no)"
        ),
        quote! {
            async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
                Ok(Receipt)
            }
        },
    );
    assert_eq!(compile_errors(&out), 0, "{out}");
    let order = [
        "let __idem_recover = ||",
        "match :: idem :: __private :: run_now :: < Receipt , PayError > (:: idem :: __private :: StoreArg :: Named (\"mem\") , & __idem_call , __idem_ok , __idem_err) {",
        ":: idem :: __private :: Now :: Answered (__idem_answer) => __idem_answer ,",
        ":: idem :: __private :: Now :: Run (__idem_prepared) => :: idem :: __private :: run_recovering :: < Receipt , PayError , _ , _ , _ > (__idem_prepared , __idem_call , __idem_ok , __idem_err , __idem_recover , async {",
    ];
    let at: Vec<usize> = order
        .iter()
        .map(|part| {
            out.find(part)
                .unwrap_or_else(|| panic!("missing `{part}` in\n{out}"))
        })
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "out of order: {out}");
}

#[test]
fn expands_options_and_a_given_store() {
    let out = expand(
        quote!(
            biz = "PAY",
            key = (req.a, req.b),
            store = self.store,
            fingerprint = "req",
            on_in_progress = "wait(5s)",
            crate = "renamed"
        ),
        quote!(
            async fn pay(&self, req: &PayReq) -> Result<Receipt, PayError> {
                todo!()
            }
        ),
    );
    assert_eq!(compile_errors(&out), 0, "{out}");
    for expected in [
        "use renamed :: __private :: { AsStore as _ , AsStoreRef as _ } ;",
        "renamed :: __private :: Call :: new (\"PAY\" , & ((& (req . a) , & (req . b) ,)))",
        ". fingerprint (& (req)) . wait (:: core :: time :: Duration :: from_millis (5000u64))) ;",
        "let __idem_call = renamed :: __private :: checked (renamed :: __private :: Call :: new",
        "renamed :: __private :: StoreArg :: Given ((& (self . store)) . as_idem_store ())",
    ] {
        assert!(out.contains(expected), "missing `{expected}` in\n{out}");
    }
    assert!(!out.contains(":: idem ::"), "{out}");
}

#[test]
fn expands_the_tx_mode() {
    let out = expand(
        quote!(biz = "PAY", key = "req.order_no", tx = "tx"),
        quote!(
            async fn pay(tx: &mut Tx<'_>, req: &PayReq) -> Result<Receipt, PayError> {
                todo!()
            }
        ),
    );
    assert_eq!(compile_errors(&out), 0, "{out}");
    for expected in [
        ":: idem :: __private :: JoinableTx :: joinable (& * tx) ;",
        // One engine entry: the claim, the body (handed the transaction under the parameter's own
        // name) and the mark are run_tx's.
        "(:: idem :: __private :: run_tx :: < Receipt , PayError , _ , _ , _ , _ > (__idem_call , __idem_ok , __idem_err , & mut * tx , move | tx | async move { let __idem_out = async {",
        "} . await ; (:: core :: option :: Option :: Some (tx) , __idem_out) }) . await) . 1 }",
    ] {
        assert!(out.contains(expected), "missing `{expected}` in\n{out}");
    }
}

#[test]
fn a_result_alias_leaves_its_types_to_the_type_checker() {
    let out = expand(
        quote!(biz = "PAY", key = "id", store = "sqlite"),
        quote!(
            async fn pay(id: u64) -> anyhow::Result<u64> {
                Ok(id)
            }
        ),
    );
    assert!(
        out.contains("< u64 as :: idem :: __private :: Storable >"),
        "{out}"
    );
    let err = "< anyhow :: Result < u64 > as :: idem :: __private :: IsResult > :: Err";
    assert!(
        out.contains(&format!(
            "< {err} as :: idem :: __private :: CarriesIdemError > :: proof ()"
        )),
        "{out}"
    );
    assert!(out.contains("run_now :: < u64 , _ >"), "{out}");
    assert!(out.contains("run_prepared :: < u64 , _ , _ >"), "{out}");
}

#[test]
fn a_bad_attribute_keeps_the_fn_as_written() {
    let item = quote!(
        fn pay(req: &PayReq) -> Result<Receipt, PayError> {
            Ok(Receipt)
        }
    );
    let out = expand(quote!(bizz = "PAY", key = "reqq.id"), item);
    // As written, its parameter marked used: the real errors come without warnings.
    assert!(
        out.starts_with(
            "fn pay (req : & PayReq) -> Result < Receipt , PayError > { let _ = & req ; Ok (Receipt) }"
        ),
        "{out}"
    );
    // unknown `bizz`, missing `store`, not async, unknown parameter `reqq`
    assert_eq!(compile_errors(&out), 4, "{out}");
    assert!(!out.contains("__idem"), "{out}");
}

#[test]
fn refuses_what_is_not_a_fn() {
    let out = expand(
        quote!(biz = "PAY", key = "req.id", store = "s"),
        quote!(
            async fn pay(&self, req: &Req) -> Result<u8, E>;
        ),
    );
    assert!(out.contains("needs a fn body to wrap"), "{out}");
    let out = expand(
        quote!(biz = "PAY", key = "req.id", store = "s"),
        quote!(
            struct Pay;
        ),
    );
    assert!(out.contains("this item is not a fn"), "{out}");
    assert!(out.starts_with("struct Pay ;"), "{out}");
}
