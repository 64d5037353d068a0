//! What every macro uses: diagnostics, durations, expression arguments, signature checks and the key
//! scanner. A check written here holds for every macro.

pub(crate) mod body;
pub(crate) mod diag;
pub(crate) mod duration;
pub(crate) mod expr_arg;
pub(crate) mod key_scan;
pub(crate) mod options;
pub(crate) mod signature;
