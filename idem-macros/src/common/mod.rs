//! What every macro uses: diagnostics, durations, options, expression arguments, signature checks,
//! the key scanner, the `store` option and the wrapping of a `Result` fn's body in a runtime call.
//! A check written here holds for every macro.

pub(crate) mod body;
pub(crate) mod diag;
pub(crate) mod duration;
pub(crate) mod expr_arg;
pub(crate) mod key_scan;
pub(crate) mod options;
pub(crate) mod signature;
pub(crate) mod store_arg;
pub(crate) mod wrap;
