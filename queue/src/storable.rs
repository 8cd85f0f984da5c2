//! What JSON Postgres can store and give back: no NUL characters, numbers that survive the
//! trip through `jsonb`, and nesting serde_json can read back however Postgres wraps it.
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
//! * **Depth**: serde_json reads at most 127 nested arrays and objects, and Postgres wraps some
//!   stored values again before they are read back (a workflow step's `extra.parent_results`
//!   holds the results before it two levels down). A result near the parser's limit could be
//!   written, but the next step's row never read: its every fetch would claim it and fail.
//!   Input nested deeper than [`MAX_DEPTH`] is refused ([`check`]; a request body counts as
//!   one level); in handler output such a part is stored as its JSON text ([`make_storable`]);
//!   in rows stored before these checks it reads back as its JSON text ([`parse_lenient`]).

use std::borrow::Cow;
use std::fmt::Write as _;

use serde_json::{Map, Number, Value};

/// The replacement for a NUL character in stored handler output.
pub const NUL_REPLACEMENT: char = '\u{FFFD}';

/// How deeply arrays and objects may nest in a stored value (`[[1]]` is 2 deep): half of what
/// serde_json reads, which leaves ample room for the wrapping Postgres adds, and far more than
/// any real payload needs.
pub const MAX_DEPTH: usize = 64;

/// Where and why a JSON value cannot be stored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct Unstorable {
    /// The path of the offending value, as a client names it (`args[0].name`, `meta.tag`).
    pub path: String,
    pub reason: String,
}

/// Checks `value`, found at `path` (`""` for a whole request body), for NUL characters in
/// strings and keys, for numbers `jsonb` would not give back, and for nesting deeper than
/// [`MAX_DEPTH`].
pub fn check(value: &Value, path: &str) -> Result<(), Unstorable> {
    check_within(value, path, 0)
}

/// [`check`] for the fields of an object found at `path` (the object counts as one level).
pub fn check_fields(map: &Map<String, Value>, path: &str) -> Result<(), Unstorable> {
    fields_within(map, path, 1)
}

/// [`check`] of a value inside `depth` arrays and objects.
fn check_within(value: &Value, path: &str, depth: usize) -> Result<(), Unstorable> {
    match value {
        Value::String(s) => check_text(s, path),
        Value::Number(n) => check_number(n, path),
        Value::Array(items) => {
            let depth = deeper(depth, path)?;
            for (i, item) in items.iter().enumerate() {
                // The path is only built on the way out of an error, not for every element.
                check_within(item, "", depth).map_err(|e| e.under(&format!("{path}[{i}]")))?;
            }
            Ok(())
        }
        Value::Object(map) => fields_within(map, path, deeper(depth, path)?),
        Value::Null | Value::Bool(_) => Ok(()),
    }
}

/// The fields of an object that is itself the `depth`th level.
fn fields_within(map: &Map<String, Value>, path: &str, depth: usize) -> Result<(), Unstorable> {
    for (k, v) in map {
        if k.contains('\0') {
            return Err(Unstorable { path: child_path(path, k), reason: "the key contains a NUL character (\\u0000), which cannot be stored".into() });
        }
        check_within(v, "", depth).map_err(|e| e.under(&child_path(path, k)))?;
    }
    Ok(())
}

/// The depth inside one more array or object at `depth`, unless that passes [`MAX_DEPTH`].
fn deeper(depth: usize, path: &str) -> Result<usize, Unstorable> {
    if depth >= MAX_DEPTH {
        return Err(Unstorable {
            path: path.to_owned(),
            reason: format!("is nested more than {MAX_DEPTH} levels deep (arrays and objects), which cannot be stored and read back"),
        });
    }
    Ok(depth + 1)
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
/// `jsonb` would not give back become strings, and an array or object nested deeper than
/// [`MAX_DEPTH`] becomes its JSON text. Returns whether anything changed.
pub fn make_storable(value: &mut Value) -> bool {
    storable_within(value, 0)
}

/// [`make_storable`] of a value inside `depth` arrays and objects.
fn storable_within(value: &mut Value, depth: usize) -> bool {
    match value {
        // Kept whole, as text, rather than refused: the run's outcome must still be recorded.
        // The text has no NUL, serde_json writes it as an escape.
        Value::Array(_) | Value::Object(_) if depth >= MAX_DEPTH => {
            *value = Value::String(value.to_string());
            true
        }
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
        Value::Array(items) => items.iter_mut().fold(false, |changed, item| storable_within(item, depth + 1) | changed),
        Value::Object(map) => {
            let mut changed = false;
            if map.keys().any(|k| k.contains('\0')) {
                let entries = std::mem::take(map);
                for (k, v) in entries {
                    map.insert(storable_text(&k).into_owned(), v);
                }
                changed = true;
            }
            map.values_mut().fold(changed, |changed, v| storable_within(v, depth + 1) | changed)
        }
        _ => false,
    }
}

/// Parses JSON text in which some numbers may be beyond what serde_json reads as a float, or
/// nesting beyond what it reads at all (as `jsonb` gives back rows written before these
/// checks): each such number becomes a string of its digits, and each array or object nested
/// deeper than [`MAX_DEPTH`] a string of its JSON text, instead of failing the whole value.
/// Only used after a normal parse failed.
pub fn parse_lenient(text: &str) -> Result<Value, serde_json::Error> {
    let mut out = String::with_capacity(text.len() + 16);
    let mut chars = text.char_indices().peekable();
    let mut strings = Strings::default();
    let mut depth = 0usize;
    while let Some((i, c)) = chars.next() {
        if strings.takes(c) {
            out.push(c);
            continue;
        }
        match c {
            '[' | '{' if depth >= MAX_DEPTH => {
                // Unclosed, the rest is taken and the parse below fails as it should.
                let end = container_end(text, i).unwrap_or(text.len());
                out.push_str(&Value::String(text[i..end].to_owned()).to_string());
                while chars.peek().is_some_and(|&(j, _)| j < end) {
                    chars.next();
                }
            }
            '[' | '{' => {
                depth += 1;
                out.push(c);
            }
            ']' | '}' => {
                depth = depth.saturating_sub(1);
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

/// Where a scan of JSON text stands with respect to its strings, whose brackets and digits
/// are text, not structure.
#[derive(Default)]
struct Strings {
    inside: bool,
    escaped: bool,
}

impl Strings {
    /// Takes the next character; true when it is part of a string (its quotes included).
    fn takes(&mut self, c: char) -> bool {
        if self.inside {
            match (self.escaped, c) {
                (true, _) => self.escaped = false,
                (false, '\\') => self.escaped = true,
                (false, '"') => self.inside = false,
                _ => {}
            }
            return true;
        }
        self.inside = c == '"';
        self.inside
    }
}

/// The end (exclusive) of the array or object that opens at byte `start` of `text`, or `None`
/// when it is never closed.
fn container_end(text: &str, start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut strings = Strings::default();
    for (j, c) in text[start..].char_indices() {
        if strings.takes(c) {
            continue;
        }
        match c {
            '[' | '{' => depth += 1,
            ']' | '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(start + j + c.len_utf8());
                }
            }
            _ => {}
        }
    }
    None
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

    /// `1` inside `levels` arrays.
    fn nested(levels: usize) -> Value {
        (0..levels).fold(json!(1), |v, _| json!([v]))
    }

    /// How many arrays `v` opens before something else, and that something.
    fn innermost(v: &Value) -> (usize, &Value) {
        let (mut depth, mut at) = (0, v);
        while let Some(inner) = at.as_array().and_then(|a| a.first()) {
            depth += 1;
            at = inner;
        }
        (depth, at)
    }

    #[test]
    fn nesting_beyond_the_limit_is_refused_with_its_path() {
        assert!(check(&nested(MAX_DEPTH), "args").is_ok());
        let e = check(&nested(MAX_DEPTH + 1), "args").expect_err("too deep");
        assert!(e.path.starts_with("args[0][0]"), "{}", e.path);
        assert!(e.reason.contains("nested more than 64 levels"), "{}", e.reason);
        // A body counts as one level: a field of it may nest one level less.
        let body = |v: Value| json!({"job_id": "x", "result": v});
        let body_ok = body(nested(MAX_DEPTH - 1));
        assert!(check_fields(body_ok.as_object().expect("object"), "").is_ok());
        let body_deep = body(nested(MAX_DEPTH));
        let e = check_fields(body_deep.as_object().expect("object"), "").expect_err("too deep");
        assert!(e.path.starts_with("result[0]"), "{}", e.path);
        // Objects count as arrays do.
        let objects = (0..=MAX_DEPTH).fold(json!(1), |v, _| json!({"k": v}));
        assert!(check(&objects, "meta").expect_err("too deep").path.starts_with("meta.k.k"));
    }

    #[test]
    fn handler_output_too_deep_is_kept_as_text() {
        let mut v = nested(MAX_DEPTH + 10);
        assert!(make_storable(&mut v));
        assert!(check(&v, "").is_ok());
        let (depth, rest) = innermost(&v);
        assert_eq!(depth, MAX_DEPTH);
        assert_eq!(rest, &json!(nested(10).to_string()));
        let mut fine = nested(MAX_DEPTH);
        assert!(!make_storable(&mut fine));
    }

    #[test]
    fn stored_values_too_deep_for_the_parser_parse_leniently() {
        // What a workflow trigger made of a deep result: beyond serde_json's 127 levels.
        let text = format!(r#"{{"parent_results": [{}"]\"[{{", 1e999{}]}}"#, "[".repeat(130), "]".repeat(130));
        assert!(serde_json::from_str::<Value>(&text).is_err());
        let v = parse_lenient(&text).expect("lenient");
        let (depth, rest) = innermost(&v["parent_results"]);
        assert_eq!(depth, MAX_DEPTH - 1, "the object is the first level");
        let kept = rest.as_str().expect("the deep part as its text");
        assert!(kept.starts_with("[[") && kept.ends_with("]]"), "{kept}");
        assert!(kept.contains(r#""]\"[{""#), "strings inside are kept verbatim: {kept}");
        assert!(parse_lenient(&format!("[{}", "[".repeat(200))).is_err(), "unclosed stays an error");
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
