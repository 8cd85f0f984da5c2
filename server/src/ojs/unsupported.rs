//! What Rebound does not implement, answered the way OJS asks: `422` with code `unsupported`
//! ("feature requires a higher conformance level"), rather than a bare `404` that reads like a
//! typo in the URL. Covers the spec's endpoints of features Rebound lacks and a requested
//! `OJS-Version` it does not speak.

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Map;

use super::error::ApiError;

/// Spec endpoints (under `/ojs/v1`) of features this server does not offer, by path prefix,
/// with the feature's name.
const UNSUPPORTED: [(&str, &str); 6] = [
    ("/schemas", "schema registry"),
    ("/admin/schemas", "schema registry"),
    ("/webhooks", "webhooks"),
    ("/agents", "agents (labs)"),
    ("/attest", "attestation (labs)"),
    ("/jobs/fetch", "WASI aliases (labs)"),
];

/// Job sub-resources of features this server does not offer.
const UNSUPPORTED_JOB_PARTS: [(&str, &str); 2] = [("checkpoint", "checkpoints"), ("receipt", "receipts")];

/// The unsupported feature a path under `/ojs/v1` belongs to, if any.
pub fn feature_of(path: &str) -> Option<&'static str> {
    let rest = path.strip_prefix("/ojs/v1")?;
    if let Some((_, feature)) = UNSUPPORTED.iter().find(|(prefix, _)| rest == *prefix || rest.starts_with(&format!("{prefix}/"))) {
        return Some(feature);
    }
    let mut parts = rest.trim_start_matches('/').split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("jobs"), Some(_), Some(part)) => UNSUPPORTED_JOB_PARTS.iter().find(|(p, _)| *p == part).map(|(_, f)| *f),
        _ => None,
    }
}

/// The `422 unsupported` error.
pub fn unsupported(what: impl std::fmt::Display) -> ApiError {
    ApiError {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        code: "unsupported",
        kind: "unsupported",
        message: format!("{what} is not supported by this server"),
        retryable: false,
        details: Map::new(),
        hint: "see GET /ojs/manifest for the conformance level and extensions this server implements".into(),
        may_have_landed: false,
    }
}

/// Refuses requests that ask for an `OJS-Version` other than 1.x (the only one spoken here).
pub async fn require_known_version(req: Request, next: Next) -> Response {
    if let Some(v) = req.headers().get("ojs-version") {
        let v = v.to_str().unwrap_or("");
        if !(v == "1" || v.starts_with("1.")) {
            return unsupported(format!("OJS-Version {v:?}")).detail("requested_version", v).detail("supported_versions", "1.0").into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_the_features_it_lacks() {
        assert_eq!(feature_of("/ojs/v1/workflows"), None, "workflows are served");
        assert_eq!(feature_of("/ojs/v1/schemas/x"), Some("schema registry"));
        assert_eq!(feature_of("/ojs/v1/jobs/abc/checkpoint"), Some("checkpoints"));
        assert_eq!(feature_of("/ojs/v1/jobs/abc/progress"), None, "progress is reported and read");
        assert_eq!(feature_of("/ojs/v1/jobs/abc"), None);
        assert_eq!(feature_of("/ojs/v1/schemasx"), None);
        assert_eq!(feature_of("/ojs/v2/schemas"), None);
    }
}
