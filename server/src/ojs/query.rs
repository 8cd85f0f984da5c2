//! Reading query strings, with errors that name the parameter.

use axum::extract::{FromRequestParts, Query, Request};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use uuid::Uuid;

use super::body::parse_uuid;
use super::error::ApiError;

/// The query parameters of a request, in order.
#[derive(Clone, Debug, Default)]
pub struct QueryParams(Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for QueryParams {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Query(pairs) = Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::invalid_field("query", e.body_text()))?;
        Ok(QueryParams(pairs))
    }
}

impl QueryParams {
    /// Parameters as given, in order.
    #[cfg(test)]
    pub fn from_pairs(pairs: Vec<(String, String)>) -> QueryParams {
        QueryParams(pairs)
    }

    /// Refuses parameters outside `allowed`, so a misspelt filter is an error rather than a
    /// silently unfiltered answer.
    pub fn only(&self, allowed: &[&str]) -> Result<(), ApiError> {
        match self.0.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
            Some((k, _)) => Err(ApiError::invalid_field(k, format!("unknown query parameter; expected one of {}", allowed.join(", ")))),
            None => Ok(()),
        }
    }

    /// A parameter given at most once.
    pub fn one(&self, key: &str) -> Result<Option<&str>, ApiError> {
        let mut values = self.0.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str());
        let first = values.next();
        if values.next().is_some() {
            return Err(ApiError::invalid_field(key, "must be given at most once"));
        }
        Ok(first)
    }

    /// Every value of a list parameter, given repeatedly and/or comma-separated; empty items
    /// are dropped.
    pub fn list(&self, key: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .flat_map(|(_, v)| v.split(','))
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .collect()
    }

    /// An integer within `min..=max`.
    pub fn i64_in(&self, key: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        let Some(raw) = self.one(key)? else { return Ok(None) };
        let n: i64 = raw.parse().map_err(|_| ApiError::invalid_field(key, format!("must be an integer, got {raw:?}")))?;
        if !(min..=max).contains(&n) {
            return Err(ApiError::invalid_field(key, format!("must be between {min} and {max}, got {n}")));
        }
        Ok(Some(n))
    }

    pub fn uuid(&self, key: &str) -> Result<Option<Uuid>, ApiError> {
        match self.one(key)? {
            None => Ok(None),
            Some(raw) => parse_uuid(raw).map(Some).map_err(|r| ApiError::invalid_field(key, r)),
        }
    }
}

/// Middleware: a NUL character (`%00`) anywhere in the path or the query string is refused
/// with 400 naming the path or the parameter. Postgres cannot store NUL in text, so a job
/// type, queue, worker id or filter carrying one would otherwise fail at the database.
pub async fn refuse_nul(req: Request, next: Next) -> Response {
    let uri = req.uri();
    if uri.path().contains("%00") {
        return ApiError::invalid_field("path", "contains a NUL character (%00)").into_response();
    }
    if let Some(query) = uri.query()
        && query.contains("%00")
    {
        let pair = query.split('&').find(|p| p.contains("%00")).unwrap_or(query);
        let key = pair.split('=').next().unwrap_or("");
        let field = if key.contains("%00") || key.is_empty() { "query".to_owned() } else { key.to_owned() };
        return ApiError::invalid_field(&field, "contains a NUL character (%00)").into_response();
    }
    next.run(req).await
}
