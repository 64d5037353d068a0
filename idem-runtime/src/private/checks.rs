//! Compile-time checks the generated code makes: each is a trait bound on a call spanned at the
//! user's token, with a `#[diagnostic::on_unimplemented]` message that names the fix.

use std::future::Future;
use std::sync::Arc;

use crate::engine::snapshot::{ErrType, OkType};
use crate::engine::tx::IdemTx;
use crate::{IdemError, Store, TokenStore};

/// Turns what `store = <expr>` names into a `&dyn Store` (method syntax, so references and
/// smart pointers auto-deref).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an idempotency store",
    label = "`store = …` must be a registered name in quotes, or an expression yielding an `idem::Store`",
    note = "pass `store = \"name\"` after `idem::register_store(\"name\", store)`, or an `Arc<S>` / `S` where `S: idem::Store`"
)]
pub trait AsStore {
    /// The store.
    fn as_idem_store(&self) -> &dyn Store;
}

// `do_not_recommend`: a value that is no store is reported as "not an `AsStore`" with the message
// above, and rustc lists `AsStore`'s few impls, not every `Store` the enabled features bring (a
// list that would differ between feature sets).
#[diagnostic::do_not_recommend]
impl<S: Store> AsStore for S {
    fn as_idem_store(&self) -> &dyn Store {
        self
    }
}

impl AsStore for dyn Store {
    fn as_idem_store(&self) -> &dyn Store {
        self
    }
}

impl<S: AsStore + ?Sized> AsStore for Arc<S> {
    fn as_idem_store(&self) -> &dyn Store {
        (**self).as_idem_store()
    }
}

/// The second choice of `(&(expr)).as_idem_store()`, found one auto-ref later than
/// [`AsStore`]: it takes a reference to a store (`store: &MemoryStore`), and for anything that is
/// not a store its method's bound fails with [`AsStore`]'s message instead of rustc's "method
/// not found".
pub trait AsStoreRef {
    /// What the reference points at.
    type Target: ?Sized;

    /// The store behind the reference. The bound sits on the method, not on the impl, so the
    /// method is always found and the bound is what fails.
    fn as_idem_store(&self) -> &dyn Store
    where
        Self::Target: AsStore;
}

impl<T: ?Sized> AsStoreRef for &T {
    type Target = T;

    fn as_idem_store(&self) -> &dyn Store
    where
        T: AsStore,
    {
        (**self).as_idem_store()
    }
}

/// Turns what `#[consume_token(store = <expr>)]` names into a `&dyn TokenStore`, like [`AsStore`]
/// for record stores.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a token store",
    label = "`store = …` must be a token store's registered name in quotes, or an expression yielding an `idem::TokenStore`",
    note = "pass `store = \"name\"` after `idem::register_tokens(\"name\", tokens)`, or an `Arc<T>` / `T` where `T: idem::TokenStore`: a store's tokens are `store.tokens()` (`SqliteStore`, `RedisStore`), or an `idem::MemoryTokens`"
)]
pub trait AsTokenStore {
    /// The token store.
    fn as_idem_token_store(&self) -> &dyn TokenStore;
}

// `do_not_recommend`, as for `AsStore`.
#[diagnostic::do_not_recommend]
impl<T: TokenStore> AsTokenStore for T {
    fn as_idem_token_store(&self) -> &dyn TokenStore {
        self
    }
}

impl AsTokenStore for dyn TokenStore {
    fn as_idem_token_store(&self) -> &dyn TokenStore {
        self
    }
}

impl<T: AsTokenStore + ?Sized> AsTokenStore for Arc<T> {
    fn as_idem_token_store(&self) -> &dyn TokenStore {
        (**self).as_idem_token_store()
    }
}

/// The second choice of `(&(expr)).as_idem_token_store()`, as [`AsStoreRef`] is for record
/// stores: a reference to a token store, and [`AsTokenStore`]'s message for anything else.
pub trait AsTokenStoreRef {
    /// What the reference points at.
    type Target: ?Sized;

    /// The token store behind the reference (the bound on the method is what fails).
    fn as_idem_token_store(&self) -> &dyn TokenStore
    where
        Self::Target: AsTokenStore;
}

impl<T: ?Sized> AsTokenStoreRef for &T {
    type Target = T;

    fn as_idem_token_store(&self) -> &dyn TokenStore
    where
        T: AsTokenStore,
    {
        (**self).as_idem_token_store()
    }
}

/// What `#[consume_token(token = …)]` may read: text. The generated code calls
/// `TokenText::token_text(&(expr))` spanned at the expression.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a submit token",
    label = "`token` must be text: a `String`, a `&str`, or any `AsRef<str>`",
    note = "read the token the page submitted, e.g. `token = \"form.token\"` for a `token: String` field"
)]
pub trait TokenText {
    /// The token, copied (the body may move what it was read from).
    fn token_text(&self) -> String;
}
#[diagnostic::do_not_recommend]
impl<T: AsRef<str> + ?Sized> TokenText for T {
    fn token_text(&self) -> String {
        self.as_ref().to_owned()
    }
}

/// What `#[consume_token(subject = …)]` may read: text, like [`TokenText`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a token subject",
    label = "`subject` must be text: a `String`, a `&str`, or any `AsRef<str>`",
    note = "give the subject the token was issued to as text, e.g. `subject = \"session.user_id.to_string()\"` for a number"
)]
pub trait SubjectText {
    /// The subject, copied.
    fn subject_text(&self) -> String;
}
#[diagnostic::do_not_recommend]
impl<T: AsRef<str> + ?Sized> SubjectText for T {
    fn subject_text(&self) -> String {
        self.as_ref().to_owned()
    }
}

/// A type an idempotent fn may return in `Ok`: it is stored and replayed.
///
/// The generated code calls `<T as Storable>::proof()` spanned at the user's `Ok` type, so a type
/// that cannot be stored is reported there, once, with this message; the proof is what the engine
/// calls take, so they need no bounds of their own and repeat no error.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored as an idempotent result",
    label = "the `Ok` type must implement `Serialize` and `DeserializeOwned`",
    note = "derive them: `#[derive(serde::Serialize, serde::Deserialize)]` on `{Self}`"
)]
pub trait Storable: Sized {
    /// The encoder/decoder the engine takes.
    fn proof() -> OkType<Self>;
}
// `do_not_recommend`: report the missing `Storable` with the message above, once, instead of
// one rustc error per missing serde trait.
#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + serde::de::DeserializeOwned> Storable for T {
    fn proof() -> OkType<T> {
        OkType::new()
    }
}

/// An error type an idempotent fn may return: it can carry idem's own refusals. Checked like
/// [`Storable`], at the user's error type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot carry an idem error",
    label = "the error type must implement `From<idem::IdemError>`",
    note = "add `impl From<idem::IdemError> for {Self}` (or a `#[from] idem::IdemError` variant with thiserror)"
)]
pub trait CarriesIdemError: Sized {
    /// The conversion the engine takes.
    fn proof() -> ErrType<Self>;
}
#[diagnostic::do_not_recommend]
impl<E: From<IdemError>> CarriesIdemError for E {
    fn proof() -> ErrType<E> {
        ErrType::new()
    }
}

/// What `tx = "…"` may name: a transaction begun on a store (`store.begin()`), which carries that
/// store. The generated code calls `JoinableTx::joinable(&*tx)` once, spanned at the `tx` option,
/// before the engine calls that take `&mut *tx` (spanned there too).
///
/// A type that is no transaction fails the one impl's `C: IdemTx`, and that is the failure rustc
/// records at the span; the engine calls' `C: IdemTx` bounds fail with the very same predicate at
/// the same span, so rustc reports them with it: one error, with this message. (`IdemTx` is no
/// supertrait: rustc would report the trait's own bound, with `IdemTx`'s impls listed and a note
/// pointing into this file.)
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a transaction idem can join",
    label = "`tx` must name a `&mut` transaction from the store's `begin()`",
    note = "begin it with `store.begin().await?` on the store that keeps the records: an \
            `idem::SqliteTx`, `idem::MySqlTx` or `idem::PgTx` (`ShardedStore::begin_for` and \
            `EncryptedStore::begin` give theirs), which derefs to the connection for your own queries; \
            a sqlx `Transaction` or connection, of any sqlx version, does not say which store it \
            belongs to, so idem could claim in a database where the store never looks; a Redis or \
            DynamoDB store has no transaction to join: drop `tx` and the call runs in lease mode"
)]
pub trait JoinableTx {
    /// Nothing: the call is the check.
    fn joinable(&self) {}
}
// `do_not_recommend`: a type that is no transaction is reported as "not a `JoinableTx`" with the
// message above, and rustc lists no impls (not `JoinableTx`'s one, nor every `IdemTx` of the
// enabled backends, which would differ between feature sets).
#[diagnostic::do_not_recommend]
impl<C: IdemTx + ?Sized> JoinableTx for C {}

/// The `Ok` and `Err` types of a fn's return type that the signature does not spell out as
/// `Result<T, E>`: the `Err` of `anyhow::Result<T>`, both of `ShopResult<T>`. The generated code names
/// `<Ret as IsResult>::Ok`, so the type checker resolves the alias, and a return type that is no
/// `Result` gets this message at the return type (once: every projection is spanned there).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a `Result`",
    label = "the fn must return `Result<T, E>`, or an alias of it",
    note = "write `-> Result<T, E>`, or make `{Self}` an alias of it, e.g. `type ShopResult<T> = Result<T, ShopError>;`"
)]
pub trait IsResult {
    /// `T` of `Result<T, E>`.
    type Ok;
    /// `E` of `Result<T, E>`.
    type Err;

    /// The body's value as the `Result` the engine takes (the identity).
    fn into_result(self) -> Result<Self::Ok, Self::Err>;

    /// The engine's result as the declared return type (the identity).
    fn from_result(result: Result<Self::Ok, Self::Err>) -> Self;
}

// `do_not_recommend`: a return type that is no `Result` gets the message above, without rustc
// pointing into idem's source for the one impl.
#[diagnostic::do_not_recommend]
impl<T, E> IsResult for Result<T, E> {
    type Ok = T;
    type Err = E;

    fn into_result(self) -> Result<T, E> {
        self
    }

    fn from_result(result: Result<T, E>) -> Self {
        result
    }
}

/// The machine of a `#[state_transition]` fn (the `M` of `Transition<T, M>`, or `machine = …`), as
/// the generated code names it: `<M as IsMachine>::Machine`, spanned at the user's type, so a type
/// that is no machine gets one "`M: StateMachine` is not satisfied" there, instead of one per use
/// inside the generated code.
pub trait IsMachine {
    /// The machine itself.
    type Machine: crate::StateMachine;
}

impl<M: crate::StateMachine> IsMachine for M {
    type Machine = M;
}

/// What `recover = "find_payment(&req.order_no)"` calls: a future answering "did this action
/// already happen, and with what result?", with the fn's own `Ok` type.
#[diagnostic::on_unimplemented(
    message = "`recover` must call an async fn returning `Result<Option<{T}>, _>`, not `{Self}`",
    label = "`recover` calls this",
    note = "recover answers whether the action already happened: `Ok(Some(result))` with the fn's own result type, `Ok(None)` when it did not, `Err(e)` when it cannot tell, e.g. `async fn find_payment(order_no: &str) -> Result<Option<Receipt>, PayError>`"
)]
pub trait Recovers<T> {
    /// The recover fn's error type.
    type Err;
    /// The future itself.
    fn recover(self) -> impl Future<Output = Result<Option<T>, Self::Err>>;
}

#[diagnostic::do_not_recommend]
impl<F, T, E> Recovers<T> for F
where
    F: Future<Output = Result<Option<T>, E>>,
{
    type Err = E;
    fn recover(self) -> impl Future<Output = Result<Option<T>, E>> {
        self
    }
}

/// The fn's error type converts from the recover fn's.
#[diagnostic::on_unimplemented(
    message = "the error of `recover`'s fn, `{E2}`, does not convert into the fn's error type `{Self}`",
    label = "`recover` returns this error",
    note = "add `impl From<{E2}> for {Self}` (with thiserror: a `#[from]` variant), or return the fn's own error type from the recover fn"
)]
pub trait FromRecoverError<E2>: Sized {
    /// The recover fn's future with its error converted.
    fn converted<T>(
        recover: impl Future<Output = Result<Option<T>, E2>>,
    ) -> impl Future<Output = Result<Option<T>, Self>>;
}

#[diagnostic::do_not_recommend]
impl<E, E2> FromRecoverError<E2> for E
where
    E: From<E2>,
{
    async fn converted<T>(
        recover: impl Future<Output = Result<Option<T>, E2>>,
    ) -> Result<Option<T>, E> {
        recover.await.map_err(E::from)
    }
}
