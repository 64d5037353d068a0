//! Keys: turning a key expression into the stored key string ([`IdemKey`], also at the crate
//! root), the checks a key and a business type pass ([`validate_key`], [`validate_biz`]) and their
//! default bounds, the request [`fingerprint`], and the record key an HTTP layer derives from a
//! request ([`http_record_key`]).

use crate::IdemError;
pub use crate::fingerprint::fingerprint;
pub use crate::layer_key::http_record_key;

/// A value that can serve as (part of) an idempotency key.
///
/// Implemented for strings, integers, `char`, `bool`, references to them, and tuples of up to six
/// of them (a composite key). Tuple parts are joined with `:`; a `:` or `\` inside a part is escaped
/// with `\`, so `("a:b", "c")` and `("a", "b:c")` never share a record.
///
/// Implement it for your own newtypes (an order number type, say) by writing their stable text.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an idempotency key",
    label = "not usable as a key",
    note = "use a string, an integer, or a tuple of them, or implement `idem::IdemKey` for `{Self}`"
)]
pub trait IdemKey {
    /// Appends this key's text to `out`.
    fn write_key(&self, out: &mut String);

    /// Appends this key's text as one part of a composite key (escaping `:` and `\`).
    fn write_key_part(&self, out: &mut String) {
        let start = out.len();
        self.write_key(out);
        if out[start..].contains([':', '\\']) {
            let part: String = out[start..].to_owned();
            out.truncate(start);
            for c in part.chars() {
                if c == ':' || c == '\\' {
                    out.push('\\');
                }
                out.push(c);
            }
        }
    }

    /// This key's text (what [`IdemKey::write_key`] appends to an empty string; a type may make it
    /// in one allocation).
    fn to_key(&self) -> String {
        let mut s = String::new();
        self.write_key(&mut s);
        s
    }

    /// Whether this key's text is a valid key whatever its value, so a call checks only its length
    /// against the store's limit: an integer's digits and sign are never empty, whitespace or NUL.
    /// `false` (the text is checked) unless the type says otherwise.
    fn text_is_always_valid(&self) -> bool {
        false
    }
}

impl IdemKey for str {
    fn write_key(&self, out: &mut String) {
        out.push_str(self);
    }

    fn to_key(&self) -> String {
        self.to_owned()
    }
}

impl IdemKey for String {
    fn write_key(&self, out: &mut String) {
        out.push_str(self);
    }

    fn to_key(&self) -> String {
        (**self).to_owned()
    }
}

impl IdemKey for std::borrow::Cow<'_, str> {
    fn write_key(&self, out: &mut String) {
        out.push_str(self);
    }

    fn to_key(&self) -> String {
        (**self).to_owned()
    }
}

impl<T: IdemKey + ?Sized> IdemKey for &T {
    fn write_key(&self, out: &mut String) {
        (**self).write_key(out)
    }

    fn to_key(&self) -> String {
        (**self).to_key()
    }

    fn text_is_always_valid(&self) -> bool {
        (**self).text_is_always_valid()
    }
}

impl<T: IdemKey + ?Sized> IdemKey for Box<T> {
    fn write_key(&self, out: &mut String) {
        (**self).write_key(out)
    }

    fn to_key(&self) -> String {
        (**self).to_key()
    }

    fn text_is_always_valid(&self) -> bool {
        (**self).text_is_always_valid()
    }
}

impl<T: IdemKey + ?Sized> IdemKey for std::sync::Arc<T> {
    fn write_key(&self, out: &mut String) {
        (**self).write_key(out)
    }

    fn to_key(&self) -> String {
        (**self).to_key()
    }

    fn text_is_always_valid(&self) -> bool {
        (**self).text_is_always_valid()
    }
}

macro_rules! display_keys {
    ($($t:ty),*) => {$(
        impl IdemKey for $t {
            fn write_key(&self, out: &mut String) {
                use std::fmt::Write;
                let _ = write!(out, "{self}");
            }
        }
    )*};
}
display_keys!(char, bool);

macro_rules! integer_keys {
    ($($t:ty),*) => {$(
        impl IdemKey for $t {
            fn write_key(&self, out: &mut String) {
                out.push_str(itoa::Buffer::new().format(*self));
            }

            fn to_key(&self) -> String {
                itoa::Buffer::new().format(*self).to_owned()
            }

            fn text_is_always_valid(&self) -> bool {
                true
            }
        }
    )*};
}
integer_keys!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize
);

macro_rules! tuple_keys {
    ($(($($n:tt $t:ident),+))*) => {$(
        impl<$($t: IdemKey),+> IdemKey for ($($t,)+) {
            fn write_key(&self, out: &mut String) {
                let mut first = true;
                $(
                    if !first { out.push(':'); }
                    first = false;
                    self.$n.write_key_part(out);
                )+
                let _ = first;
            }
        }
    )*};
}
tuple_keys! {
    (0 A)
    (0 A, 1 B)
    (0 A, 1 B, 2 C)
    (0 A, 1 B, 2 C, 3 D)
    (0 A, 1 B, 2 C, 3 D, 4 E)
    (0 A, 1 B, 2 C, 3 D, 4 E, 5 F)
}

/// Default longest key, in bytes.
pub const DEFAULT_MAX_KEY_LEN: usize = 128;
/// Default longest business type, in bytes.
pub const DEFAULT_MAX_BIZ_LEN: usize = 32;

/// Checks a key before anything is written: non-empty, not only whitespace, at most `max_len`
/// bytes, no NUL.
///
/// # Errors
/// [`IdemError::InvalidKey`] saying what is wrong.
#[inline]
pub fn validate_key(key: &str, max_len: usize) -> Result<(), IdemError> {
    // The usual key, at once: in length, a printable ASCII byte (so not only whitespace), no NUL.
    let bytes = key.as_bytes();
    if (1..=max_len).contains(&bytes.len())
        && bytes.iter().any(u8::is_ascii_graphic)
        && !bytes.contains(&0)
    {
        return Ok(());
    }
    let reason = if key.is_empty() {
        "the key is empty".to_owned()
    } else if key.chars().all(char::is_whitespace) {
        "the key is only whitespace".to_owned()
    } else if key.len() > max_len {
        format!(
            "the key is {} bytes long; the limit is {max_len}",
            key.len()
        )
    } else if key.contains('\0') {
        "the key contains a NUL byte".to_owned()
    } else {
        return Ok(());
    };
    Err(IdemError::InvalidKey { reason })
}

/// Checks a business type: non-empty, at most `max_len` bytes, no whitespace or NUL.
///
/// # Errors
/// [`IdemError::InvalidBiz`] saying what is wrong.
#[inline]
pub fn validate_biz(biz: &str, max_len: usize) -> Result<(), IdemError> {
    let reason = if biz.is_empty() {
        "it is empty".to_owned()
    } else if biz.len() > max_len {
        format!(
            "it is {} bytes long; the store's limit is {max_len}",
            biz.len()
        )
    } else if !biz.bytes().all(|b| b.is_ascii_graphic())
        && biz.chars().any(|c| c.is_whitespace() || c == '\0')
    {
        "it contains whitespace or NUL".to_owned()
    } else {
        return Ok(());
    };
    Err(IdemError::InvalidBiz {
        biz: biz.to_owned(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_the_text_its_write_key_appends() {
        fn same<K: IdemKey + ?Sized>(key: &K) {
            let mut written = String::new();
            key.write_key(&mut written);
            assert_eq!(key.to_key(), written);
        }
        same("order-7");
        same(&"a:b".to_owned());
        same(&std::borrow::Cow::Borrowed("支付"));
        same(&u64::MAX);
        same(&i128::MIN);
        same(&Box::new(-7i8));
        same(&std::sync::Arc::new(("a:b", 7u32)));
        same(&&'x');
    }

    #[test]
    fn composite_keys_are_injective() {
        assert_ne!(("a:b", "c").to_key(), ("a", "b:c").to_key());
        assert_eq!((7u64, "x").to_key(), "7:x");
        assert_eq!(("a\\", "b").to_key(), "a\\\\:b");
    }

    #[test]
    fn bad_keys_are_refused() {
        for k in ["", "   ", "a\0b"] {
            assert!(
                matches!(validate_key(k, 128), Err(IdemError::InvalidKey { .. })),
                "{k:?}"
            );
        }
        assert!(validate_key(&"x".repeat(129), 128).is_err());
        for len in [1, 31, 32, 33, 100] {
            let mut with_nul = "x".repeat(len);
            with_nul.push('\0');
            assert!(validate_key(&with_nul, 128).is_err(), "NUL at {len}");
            assert!(validate_key(&" ".repeat(len), 128).is_err(), "{len} spaces");
            assert!(
                validate_key(&format!("{} x", " ".repeat(len)), 128).is_ok(),
                "{len}"
            );
            assert!(
                validate_key(&"\u{3000}".repeat(len.min(40)), 128).is_err(),
                "ideographic spaces"
            );
        }
        assert!(validate_key(&"x".repeat(128), 128).is_ok());
        assert!(validate_key("'; DROP TABLE idem_record; --", 128).is_ok());
    }
}
