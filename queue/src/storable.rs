//! What JSON Postgres can store and give back: no NUL characters, and numbers that survive
//! the trip through `jsonb`.
//!
//! * **NUL** (`\u0000`): Postgres refuses it in `text` and in `jsonb` strings and keys, so a
//!   request carrying one would fail at the database. Input is refused with the path of the
//!   offending string ([`check`]); what a handler produces (results, error messages and
//!   details) is stored with each NUL replaced by U+FFFD, the replacement character
//!   ([`make_storable`], [`storable_text`]).
//! * **Numbers**: `jsonb` keeps a number as an exact decimal and gives it back written out in
//!   full (`1.7976931348623157e308` comes back as 309 digits). serde_json reads such a long
//!   integer by scaling its leading digits, which can round past `f64::MAX` and fail
//!   ("number out of range"), so the row could be written but never read again. Such numbers
//!   are refused on input; in handler output they are stored as strings; in rows stored before
//!   these checks they read back as strings ([`parse_lenient`], used by the store's decoder).

use std::borrow::Cow;
use std::fmt::Write as _;

use serde_json::{Map, Number, Value};

/// The replacement for a NUL character in stored handler output.
pub const NUL_REPLACEMENT: char = '\u{FFFD}';

/// Where and why a JSON value cannot be stored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct Unstorable {
    /// The path of the offending value, as a client names it (`args[0].name`, `meta.tag`).
    pub path: String,
    pub reason: String,
}

/// Checks `value`, found at `path` (`""` for a whole request body), for NUL characters in
/// strings and keys and for numbers `jsonb` would not give back.
pub fn check(value: &Value, path: &str) -> Result<(), Unstorable> {
    match value {
        Value::String(s) => check_text(s, path),
        Value::Number(n) => check_number(n, path),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                // The path is only built on the way out of an error, not for every element.
                check(item, "").map_err(|e| e.under(&format!("{path}[{i}]")))?;
            }
            Ok(())
        }
        Value::Object(map) => check_fields(map, path),
        Value::Null | Value::Bool(_) => Ok(()),
    }
}

/// [`check`] for the fields of an object found at `path`.
pub fn check_fields(map: &Map<String, Value>, path: &str) -> Result<(), Unstorable> {
    for (k, v) in map {
        if k.contains('\0') {
            return Err(Unstorable { path: child_path(path, k), reason: "the key contains a NUL character (\\u0000), which cannot be stored".into() });
        }
        check(v, "").map_err(|e| e.under(&child_path(path, k)))?;
    }
    Ok(())
}

/// Checks one text value.
pub fn check_text(s: &str, path: &str) -> Result<(), Unstorable> {
    match s.contains('\0') {
        true => Err(Unstorable { path: path.to_owned(), reason: "contains a NUL character (\\u0000), which cannot be stored".into() }),
        false => Ok(()),
    }
}

fn check_number(n: &Number, path: &str) -> Result<(), Unstorable> {
    match readable_from_postgres(n) {
        true => Ok(()),
        false => Err(Unstorable {
            path: path.to_owned(),
            reason: format!("the number {n} is too large to be stored and read back exactly; send it as a string"),
        }),
    }
}

impl Unstorable {
    /// Prefixes the path of an error found inside the value at `parent`.
    fn under(mut self, parent: &str) -> Self {
        self.path = match (parent.is_empty(), self.path.is_empty()) {
            (_, true) => parent.to_owned(),
            (true, false) => self.path,
            (false, false) if self.path.starts_with('[') => format!("{parent}{}", self.path),
            (false, false) => format!("{parent}.{}", self.path),
        };
        self
    }
}

/// `parent.key`, or `parent["key"]` for a key that is not a plain name.
fn child_path(parent: &str, key: &str) -> String {
    let plain = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let mut out = String::with_capacity(parent.len() + key.len() + 4);
    out.push_str(parent);
    if plain {
        if !parent.is_empty() {
            out.push('.');
        }
        out.push_str(key);
    } else {
        let _ = write!(out, "[{}]", Value::String(key.to_owned()));
    }
    out
}

/// Whether serde_json reads back the text Postgres writes for `n`. Integers always are; a
/// float only fails when large: Postgres writes it without an exponent.
fn readable_from_postgres(n: &Number) -> bool {
    if !n.is_f64() {
        return true;
    }
    let text = n.to_string();
    let Some((mantissa, exponent)) = text.split_once(['e', 'E']) else { return true };
    let Ok(exponent) = exponent.parse::<i32>() else { return true };
    if exponent < 16 {
        return true;
    }
    // Expand `d.ddd e N` into the plain digits Postgres prints.
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let shift = usize::try_from(exponent).unwrap_or(0);
    let mut digits = format!("{sign}{int}{frac}");
    if shift >= frac.len() {
        digits.extend(std::iter::repeat_n('0', shift - frac.len()));
    } else {
        digits.insert(sign.len() + int.len() + shift, '.');
    }
    serde_json::from_str::<Value>(&digits).is_ok()
}

/// `s` with every NUL replaced by U+FFFD; borrowed when there is none.
pub fn storable_text(s: &str) -> Cow<'_, str> {
    match s.contains('\0') {
        true => Cow::Owned(s.replace('\0', "\u{FFFD}")),
        false => Cow::Borrowed(s),
    }
}

/// Makes handler output storable in place: NULs in strings and keys become U+FFFD, numbers
/// `jsonb` would not give back become strings. Returns whether anything changed.
pub fn make_storable(value: &mut Value) -> bool {
    match value {
        Value::String(s) => match storable_text(s) {
            Cow::Owned(clean) => {
                *s = clean;
                true
            }
            Cow::Borrowed(_) => false,
        },
        Value::Number(n) if !readable_from_postgres(n) => {
            *value = Value::String(n.to_string());
            true
        }
        Value::Array(items) => items.iter_mut().fold(false, |changed, item| make_storable(item) | changed),
        Value::Object(map) => {
            let mut changed = false;
            if map.keys().any(|k| k.contains('\0')) {
                let entries = std::mem::take(map);
                for (k, v) in entries {
                    map.insert(storable_text(&k).into_owned(), v);
                }
                changed = true;
            }
            map.values_mut().fold(changed, |changed, v| make_storable(v) | changed)
        }
        _ => false,
    }
}

/// Parses JSON text in which some numbers may be beyond what serde_json reads as a float
/// (as `jsonb` gives back rows written before these checks): each such number becomes a
/// string of its digits instead of failing the whole value. Only used after a normal parse
/// failed.
pub fn parse_lenient(text: &str) -> Result<Value, serde_json::Error> {
    let mut out = String::with_capacity(text.len() + 16);
    let mut chars = text.char_indices().peekable();
    let (mut in_string, mut escaped) = (false, false);
    while let Some((i, c)) = chars.next() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '-' | '0'..='9' => {
                let mut end = i + c.len_utf8();
                while let Some(&(j, d)) = chars.peek() {
                    if !matches!(d, '0'..='9' | '.' | 'e' | 'E' | '+' | '-') {
                        break;
                    }
                    end = j + d.len_utf8();
                    chars.next();
                }
                let number = &text[i..end];
                match serde_json::from_str::<Value>(number) {
                    Ok(_) => out.push_str(number),
                    Err(_) => {
                        out.push('"');
                        out.push_str(number);
                        out.push('"');
                    }
                }
            }
            _ => out.push(c),
        }
    }
    serde_json::from_str(&out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn path_of(v: Value) -> String {
        check(&v, "").expect_err("should be refused").path
    }

    #[test]
    fn nul_anywhere_is_refused_with_its_path() {
        assert_eq!(path_of(json!({"args": ["a\u{0}"]})), "args[0]");
        assert_eq!(path_of(json!({"args": [{"name": "x\u{0}y"}]})), "args[0].name");
        assert_eq!(path_of(json!({"args": [[1, ["\u{0}"]]]})), "args[0][1][0]");
        assert_eq!(path_of(json!({"meta": {"k\u{0}": 1}})), "meta[\"k\\u0000\"]");
        assert_eq!(path_of(json!({"meta": {"trace id": "\u{0}"}})), "meta[\"trace id\"]");
        assert_eq!(path_of(json!({"options": {"tags": ["ok", "\u{0}"]}})), "options.tags[1]");
        assert_eq!(path_of(json!("\u{0}")), "");
        assert_eq!(check(&json!("\u{0}"), "worker_id").expect_err("nul").path, "worker_id");
        assert!(check(&json!({"args": ["fine", {"a": [1, 2.5, null, true]}], "meta": {}}), "").is_ok());
    }

    #[test]
    fn numbers_postgres_cannot_give_back_are_refused() {
        // Why: Postgres prints the value in full and serde_json's fast path overflows on it.
        let expanded = format!("17976931348623157{}", "0".repeat(292));
        assert!(serde_json::from_str::<Value>(&expanded).is_err());
        assert_eq!(path_of(json!({"args": [1.7976931348623157e308]})), "args[0]");
        assert_eq!(path_of(json!({"args": [-1.7976931348623157e308]})), "args[0]");
        for fine in [json!(1e300), json!(1.5e16), json!(1e-300), json!(5e-324), json!(u64::MAX), json!(i64::MIN), json!(0.1), json!(123.0)] {
            assert!(check(&fine, "").is_ok(), "{fine}");
        }
    }

    #[test]
    fn unreadable_numbers_parse_leniently_as_strings() {
        let huge = format!("17976931348623157{}", "0".repeat(292));
        let text = format!(r#"[{huge}, {{"a": -{huge}, "s": "1e999 \" {huge}"}}, 1.5, -2, 3e2]"#);
        assert!(serde_json::from_str::<Value>(&text).is_err());
        let v = parse_lenient(&text).expect("lenient");
        assert_eq!(v, json!([huge, {"a": format!("-{huge}"), "s": format!("1e999 \" {huge}")}, 1.5, -2, 300.0]));
        assert!(parse_lenient("[1, ").is_err(), "still JSON");
    }

    #[test]
    fn handler_output_is_made_storable() {
        let mut v = json!({"out\u{0}": ["a\u{0}b", 1.7976931348623157e308, 2], "ok": "fine"});
        assert!(make_storable(&mut v));
        assert_eq!(v, json!({"out\u{FFFD}": ["a\u{FFFD}b", "1.7976931348623157e+308", 2], "ok": "fine"}));
        assert!(check(&v, "").is_ok());
        let mut clean = json!({"a": [1, "b"]});
        assert!(!make_storable(&mut clean));
        assert_eq!(storable_text("x\u{0}"), "x\u{FFFD}");
        assert!(matches!(storable_text("x"), Cow::Borrowed(_)));
    }
}
