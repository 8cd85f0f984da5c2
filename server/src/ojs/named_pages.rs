//! Pages of the small lists the API reads whole and sorts by name (queues, cron jobs, rate
//! limits), as ojs-http-binding §17 asks of every list endpoint: `limit` (default 50, at most
//! 200) and `cursor`, or `offset` (and the admin API's `page`/`per_page`), answered with
//! `pagination: {total, has_more, next_cursor}`.
//!
//! The cursor is the last name of the page (names are unique and sorted), so a page after it
//! stays right when names are added or removed between requests, as an offset would not.

use serde_json::{Value, json};

use super::error::ApiError;
use super::query::QueryParams;

/// The query parameters [`NamedPage::from_query`] reads, for `QueryParams::only`.
pub const PARAMS: [&str; 5] = ["limit", "cursor", "offset", "page", "per_page"];

const DEFAULT_LIMIT: i64 = 50;
const MAX_LIMIT: i64 = 200;
/// The deepest offset a named list serves (see [`NamedPage::from_query`]).
const MAX_NAMED_OFFSET: i64 = 100_000;

/// Which page of a list sorted by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedPage {
    limit: usize,
    start: Start,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Start {
    After(String),
    Offset(usize),
}

impl NamedPage {
    /// The page a request asks for; a cursor and an offset (or a page number) together are
    /// refused, as they could disagree.
    pub fn from_query(q: &QueryParams) -> Result<NamedPage, ApiError> {
        let per_page = q.i64_in("per_page", 1, MAX_LIMIT)?;
        let limit = q.i64_in("limit", 1, MAX_LIMIT)?.or(per_page).unwrap_or(DEFAULT_LIMIT);
        let offset = match (q.i64_in("offset", 0, i64::from(i32::MAX))?, q.i64_in("page", 1, i64::from(i32::MAX))?) {
            (Some(_), Some(_)) => return Err(ApiError::invalid_field("page", "give offset or page, not both")),
            (Some(o), None) => Some(o),
            (None, Some(p)) => Some((p - 1).saturating_mul(limit)),
            (None, None) => None,
        };
        // A list read in part (rate-limit keys) reads every name up to an offset, on every
        // request: how deep it may go is bounded there, past it the cursor pages on.
        if let Some(o) = offset.filter(|o| *o > MAX_NAMED_OFFSET) {
            return Err(ApiError::invalid_field(
                if q.one("page")?.is_some() { "page" } else { "offset" },
                format!("an offset of {o} is deeper than the {MAX_NAMED_OFFSET} names a page may skip: page by cursor (next_cursor)"),
            ));
        }
        let start = match (q.one("cursor")?, offset) {
            (Some(_), Some(_)) => return Err(ApiError::invalid_field("cursor", "give cursor or offset (page), not both")),
            (Some(""), None) => return Err(ApiError::invalid_field("cursor", "must not be empty")),
            (Some(c), None) => Start::After(c.to_owned()),
            (None, o) => Start::Offset(usize::try_from(o.unwrap_or(0)).unwrap_or(usize::MAX)),
        };
        Ok(NamedPage { limit: usize::try_from(limit).unwrap_or(50), start })
    }

    /// This page of `items` (sorted by `name`, unique), and its `pagination` object.
    pub fn cut<T>(&self, items: Vec<T>, name: impl Fn(&T) -> &str) -> (Vec<T>, Value) {
        let total = items.len();
        self.cut_window(items, 0, total, name)
    }

    /// Where a list too long to read whole must be read from for this page: after the cursor,
    /// or from the start; and how many of a sorted source's names from there are enough to
    /// fill it (the page's own, or, for an offset, all up to its end).
    pub fn window(&self) -> (Option<&str>, usize) {
        match &self.start {
            Start::After(last) => (Some(last.as_str()), self.limit),
            Start::Offset(o) => (None, o.saturating_add(self.limit)),
        }
    }

    /// [`NamedPage::cut`] of a list read in part, as [`NamedPage::window`] says: `items` are
    /// sorted and hold the page, `before` is how many of the whole list's `total` sort at or
    /// before the cursor (and are not in `items`).
    pub fn cut_window<T>(&self, items: Vec<T>, before: usize, total: usize, name: impl Fn(&T) -> &str) -> (Vec<T>, Value) {
        let skip = match &self.start {
            Start::After(last) => items.partition_point(|i| name(i) <= last.as_str()),
            Start::Offset(o) => (*o).min(items.len()),
        };
        let position = match &self.start {
            Start::After(_) => before + skip,
            Start::Offset(o) => (*o).min(total),
        };
        let page: Vec<T> = items.into_iter().skip(skip).take(self.limit).collect();
        let has_more = position + page.len() < total;
        // `page` and `per_page` as well, for the admin API's clients, which page that way.
        let mut pagination = json!({ "total": total, "has_more": has_more, "limit": self.limit, "offset": position,
                                     "per_page": self.limit, "page": position / self.limit.max(1) + 1 });
        if let (true, Some(last), Some(p)) = (has_more, page.last(), pagination.as_object_mut()) {
            p.insert("next_cursor".into(), Value::String(name(last).to_owned()));
        }
        (page, pagination)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> QueryParams {
        QueryParams::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("q{i:03}")).collect()
    }

    #[test]
    fn pages_follow_the_cursor_to_the_end() {
        let all = names(120);
        let first = NamedPage::from_query(&query(&[])).unwrap();
        let (page, p) = first.cut(all.clone(), |s| s);
        assert_eq!((page.len(), &p["total"], &p["has_more"], &p["next_cursor"]), (50, &json!(120), &json!(true), &json!("q049")));
        let mut seen = page;
        let mut cursor = p["next_cursor"].as_str().map(str::to_owned);
        while let Some(c) = cursor {
            let (page, p) = NamedPage::from_query(&query(&[("cursor", &c)])).unwrap().cut(all.clone(), |s| s);
            seen.extend(page);
            cursor = p["next_cursor"].as_str().map(str::to_owned);
            if cursor.is_none() {
                assert_eq!(p["has_more"], json!(false));
            }
        }
        assert_eq!(seen, all);
        // A name removed since still positions the next page.
        let fewer: Vec<String> = all.iter().filter(|s| *s != "q049").cloned().collect();
        let (page, _) = NamedPage::from_query(&query(&[("cursor", "q049")])).unwrap().cut(fewer, |s| s);
        assert_eq!(page[0], "q050");
    }

    /// A list read in part (two sources, one read whole, one only as far as the window says)
    /// pages exactly as the whole list does.
    #[test]
    fn a_window_pages_as_the_whole_list() {
        let whole: Vec<String> = (0..40).map(|i| if i % 7 == 0 { format!("queue:{i:03}") } else { format!("k{i:03}") }).collect();
        let mut sorted = whole.clone();
        sorted.sort();
        let (few, many): (Vec<String>, Vec<String>) = sorted.iter().cloned().partition(|n| n.starts_with("queue:"));
        let mut requests: Vec<Vec<(&str, String)>> = vec![vec![], vec![("limit", "7".into())]];
        for o in [0, 3, 13, 35, 39, 40, 90] {
            requests.push(vec![("limit", "6".into()), ("offset", o.to_string())]);
        }
        for c in ["k001", "k013", "k039", "queue:007", "queue:035", "a", "z"] {
            requests.push(vec![("limit", "5".into()), ("cursor", c.to_string())]);
        }
        for r in requests {
            let pairs: Vec<(&str, &str)> = r.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let page = NamedPage::from_query(&query(&pairs)).unwrap();
            let expected = page.cut(sorted.clone(), |s| s);
            let (after, wanted) = page.window();
            let past = |n: &String| after.is_none_or(|c| n.as_str() > c);
            let mut items: Vec<String> = few.iter().filter(|n| past(n)).cloned().collect();
            items.extend(many.iter().filter(|n| past(n)).take(wanted).cloned());
            items.sort();
            let before = sorted.iter().filter(|n| !past(n)).count();
            assert_eq!(page.cut_window(items, before, sorted.len(), |s| s), expected, "{r:?}");
        }
    }

    #[test]
    fn offsets_pages_and_limits() {
        let all = names(10);
        let (page, p) = NamedPage::from_query(&query(&[("limit", "3"), ("offset", "8")])).unwrap().cut(all.clone(), |s| s);
        assert_eq!((page, &p["has_more"]), (vec!["q008".to_string(), "q009".to_string()], &json!(false)));
        assert!(p.get("next_cursor").is_none());
        let (page, _) = NamedPage::from_query(&query(&[("per_page", "4"), ("page", "2")])).unwrap().cut(all.clone(), |s| s);
        assert_eq!(page.first().map(String::as_str), Some("q004"));
        let (page, _) = NamedPage::from_query(&query(&[("offset", "99")])).unwrap().cut(all, |s| s);
        assert!(page.is_empty());
        for bad in [&[("limit", "0")][..], &[("limit", "201")], &[("cursor", "a"), ("offset", "1")], &[("cursor", "")], &[("offset", "-1")]] {
            assert!(NamedPage::from_query(&query(bad)).is_err(), "{bad:?}");
        }
    }
}
