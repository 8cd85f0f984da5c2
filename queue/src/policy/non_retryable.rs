//! `non_retryable_errors` patterns: exact names, `prefix.*`, or a bare `*`.
//!
//! OJS error types are dot-namespaced (`auth.token_expired`). `auth.*` matches every type
//! below `auth.` (`auth.token_expired`, `auth.forbidden`) but neither `auth` itself nor
//! `external.auth.failure`; `*` matches everything. Matching is case-sensitive, since OJS
//! clients send classes such as `Auth.TokenExpired` verbatim.

use super::RetryPolicy;

/// Whether `error_type` matches one `pattern` (assumed valid; an invalid pattern can only
/// match exactly).
pub fn pattern_matches(pattern: &str, error_type: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    match pattern.strip_suffix(".*") {
        Some(prefix) => error_type
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('.'))
            .is_some_and(|rest| !rest.is_empty()),
        None => pattern == error_type,
    }
}

/// Checks one pattern's shape, returning the reason it is malformed. Rejected: empty
/// patterns, whitespace or control characters, empty segments (`a..b`, `.a`, `a.`), and any
/// `*` other than a bare `*` or a final `.*` segment (`auth*`, `a.*.b`, `*.b`).
pub fn validate_pattern(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if pattern == "*" {
        return Ok(());
    }
    if pattern.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain whitespace or control characters".to_owned());
    }
    let name = pattern.strip_suffix(".*").unwrap_or(pattern);
    if name.contains('*') {
        return Err("'*' is only allowed alone (\"*\") or as a final segment (\"prefix.*\")"
            .to_owned());
    }
    if name.split('.').any(str::is_empty) {
        return Err("must not have empty dot-separated segments".to_owned());
    }
    Ok(())
}

impl RetryPolicy {
    /// Whether an error of type `error_type` must not be retried under this policy (exact or
    /// `prefix.*` match against `non_retryable_errors`, or a bare `*`). Such an error ends
    /// the job at once by `on_exhaustion`, whatever attempts remain.
    pub fn is_non_retryable(&self, error_type: &str) -> bool {
        self.non_retryable_errors.iter().any(|p| pattern_matches(p, error_type))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_004_table() {
        let p = RetryPolicy {
            non_retryable_errors: vec!["validation.payload_invalid".into(), "auth.*".into()],
            ..RetryPolicy::default()
        };
        assert!(p.is_non_retryable("auth.token_expired"));
        assert!(p.is_non_retryable("auth.forbidden"));
        assert!(!p.is_non_retryable("auth"));
        assert!(!p.is_non_retryable("external.auth.failure"));
        assert!(p.is_non_retryable("validation.payload_invalid"));
        assert!(!p.is_non_retryable("validation.other"));
        assert!(!p.is_non_retryable("validation.payload_invalid.deep"));
    }

    #[test]
    fn prefix_edges() {
        assert!(pattern_matches("auth.*", "auth.a.b"));
        assert!(!pattern_matches("auth.*", "auth."));
        assert!(!pattern_matches("auth.*", "authz.x"));
        assert!(!pattern_matches("auth.*", "Auth.x"));
        assert!(pattern_matches("Auth.*", "Auth.TokenExpired"));
        assert!(pattern_matches("FatalError", "FatalError"));
        assert!(pattern_matches("*", ""));
        assert!(pattern_matches("*", "anything.at.all"));
        assert!(!RetryPolicy::default().is_non_retryable("anything"));
    }

    #[test]
    fn pattern_validation() {
        for ok in ["*", "auth.*", "a.b.*", "FatalError", "http.5xx", "Auth.TokenExpired"] {
            assert_eq!(validate_pattern(ok), Ok(()), "{ok:?}");
        }
        for bad in ["", "a.*.b", "auth*", "*.b", ".*", "a..b", ".a", "a.", "a b", "**", "a.**"] {
            assert!(validate_pattern(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
