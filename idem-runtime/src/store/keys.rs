//! Walking the keys of every record ([`Store::list_keys`](super::Store::list_keys)): a page of
//! keys, the check every store runs on its batch, and the cursors the stores hand out: fields
//! written as `<length in bytes>:<text>`, so a field holds any text (a `:`, a brace, a digit) and
//! reads back whole.

use super::MAX_BATCH;
use crate::IdemError;

/// One page of [`Store::list_keys`](super::Store::list_keys).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyPage {
    /// `(biz, key)` of records the store holds (expired ones not yet swept may be included).
    pub keys: Vec<(String, String)>,
    /// Where the next page starts: give it back as `after`. `None` once the walk is done.
    pub next: Option<String>,
}

/// Refuses a page size no store walks with: 0, or more than [`MAX_BATCH`].
pub(crate) fn check_batch(batch: usize) -> Result<(), IdemError> {
    if (1..=MAX_BATCH).contains(&batch) {
        return Ok(());
    }
    Err(IdemError::InvalidOptions {
        reason: format!(
            "a page of list_keys holds 1 to {MAX_BATCH} keys, not {batch}: walk with a batch in \
             that range"
        ),
    })
}

/// The error for an `after` that is not a cursor the store gave (its text is not repeated: it
/// holds keys).
pub(crate) fn not_a_cursor(after: &str) -> IdemError {
    IdemError::InvalidOptions {
        reason: format!(
            "the cursor given as `after` ({} bytes) is not one this store's list_keys gave: give \
             back the `next` of one of its pages, or None to start a walk",
            after.len()
        ),
    }
}

/// Appends `field` to `out` as `<its length in bytes>:<field>`.
pub(crate) fn push_field(out: &mut String, field: &str) {
    out.push_str(itoa::Buffer::new().format(field.len()));
    out.push(':');
    out.push_str(field);
}

/// Takes a field written by [`push_field`] off the front of `text`; `None` when `text` does not
/// start with one (a length of other digits than [`push_field`] writes, or longer than the rest).
pub(crate) fn take_field<'t>(text: &mut &'t str) -> Option<&'t str> {
    let (len, rest) = text.split_once(':')?;
    let canonical = !len.is_empty()
        && len.bytes().all(|b| b.is_ascii_digit())
        && (len == "0" || !len.starts_with('0'));
    if !canonical {
        return None;
    }
    let len: usize = len.parse().ok()?;
    let field = rest.get(..len)?;
    *text = &rest[len..];
    Some(field)
}

/// The cursor of a store that walks its records in `(biz, key)` order, after `(biz, key)`:
/// `<length of biz>:<biz><key>`.
pub(crate) fn after_key(biz: &str, key: &str) -> String {
    let mut cursor = String::with_capacity(biz.len() + key.len() + 4);
    push_field(&mut cursor, biz);
    cursor.push_str(key);
    cursor
}

/// The `(biz, key)` an [`after_key`] cursor names.
///
/// # Errors
/// [`IdemError::InvalidOptions`] ([`not_a_cursor`]) for text that is not such a cursor.
pub(crate) fn parse_after_key(after: &str) -> Result<(&str, &str), IdemError> {
    let mut rest = after;
    let biz = take_field(&mut rest).ok_or_else(|| not_a_cursor(after))?;
    Ok((biz, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_cursor_reads_back_whatever_its_parts_hold() {
        for (biz, key) in [
            ("PAY", "x:y"),
            ("PAY:x", "y"),
            ("3:a", "7:b"),
            ("支付", "ключ"),
            ("B", "}{"),
            ("A", ""),
            ("", ""),
        ] {
            let cursor = after_key(biz, key);
            assert_eq!(parse_after_key(&cursor).unwrap(), (biz, key), "{cursor}");
        }
        assert_ne!(after_key("PAY", "x:y"), after_key("PAY:x", "y"));
    }

    #[test]
    fn text_no_store_gave_is_not_a_cursor() {
        // No length, a length past the end, one that ends inside a character, and lengths
        // `push_field` never writes.
        for bad in [
            "", "PAY", "9:PAY", "2:支", ":PAY", "03:PAYk", "+3:PAYk", "x:PAY",
        ] {
            let err = parse_after_key(bad).unwrap_err();
            assert!(matches!(err, IdemError::InvalidOptions { .. }), "{bad}");
            assert!(err.to_string().contains("not one this store"), "{err}");
        }
    }

    #[test]
    fn a_batch_is_one_to_max_batch() {
        assert!(check_batch(1).is_ok());
        assert!(check_batch(MAX_BATCH).is_ok());
        for bad in [0, MAX_BATCH + 1] {
            let err = check_batch(bad).unwrap_err();
            assert!(matches!(err, IdemError::InvalidOptions { .. }));
            assert!(err.to_string().contains("list_keys"), "{err}");
        }
    }
}
