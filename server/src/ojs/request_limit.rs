//! Per-caller request limits on the OJS API (ojs-rate-limiting §10.4): each caller (an API
//! token, or with `--api-auth none` a client address) has a bucket of `burst` requests that
//! refills at `per_second`; a request that finds it empty is answered `429 rate_limited` with
//! `Retry-After`, and every answer says where the caller stands in `X-RateLimit-Limit`,
//! `X-RateLimit-Remaining` and `X-RateLimit-Reset`.
//!
//! The buckets live in this process: a fleet of servers behind a balancer gives each caller
//! one bucket per server. That is what the limit is for: to keep one runaway client from taking
//! a server's share of the database, not to meter use. A refused request costs the lookup of
//! its token (authentication comes first, so that strangers cannot empty a caller's bucket)
//! and nothing else.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};

use super::error::ApiError;
use crate::AppState;
use crate::auth::Caller;
use crate::config::ApiAuth;
use crate::login_throttle::{address_key, client_address};

static LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Buckets left untouched long enough to be full again are forgotten every this many
/// requests, so callers that come and go (addresses) do not grow the map without bound.
const FORGET_EVERY: u64 = 4096;

type Limiter = RateLimiter<String, DefaultKeyedStateStore<String>, DefaultClock, StateInformationMiddleware>;

/// The buckets of every caller.
pub struct RequestLimits {
    limiter: Limiter,
    burst: u32,
    per_second: u32,
    checks: AtomicU64,
}

impl std::fmt::Debug for RequestLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestLimits").field("per_second", &self.per_second).field("burst", &self.burst).finish_non_exhaustive()
    }
}

/// Where one caller stands after a request was let through or refused.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Standing {
    Allowed { remaining: u32, reset_in: Duration },
    Refused { retry_in: Duration },
}

impl RequestLimits {
    /// Buckets of `burst` requests refilled at `per_second`; `None` when `per_second` is 0
    /// (no limit). A `burst` of 0 is twice the rate.
    pub fn new(per_second: u32, burst: u32) -> Option<Self> {
        let rate = NonZeroU32::new(per_second)?;
        let burst = NonZeroU32::new(burst).unwrap_or(rate.saturating_mul(NonZeroU32::MIN.saturating_add(1)));
        let limiter = RateLimiter::keyed(Quota::per_second(rate).allow_burst(burst)).with_middleware::<StateInformationMiddleware>();
        Some(RequestLimits { limiter, burst: burst.get(), per_second, checks: AtomicU64::new(0) })
    }

    /// Takes one request from `key`'s bucket.
    pub fn take(&self, key: &str) -> Standing {
        if self.checks.fetch_add(1, Ordering::Relaxed) % FORGET_EVERY == FORGET_EVERY - 1 {
            self.limiter.retain_recent();
            self.limiter.shrink_to_fit();
        }
        match self.limiter.check_key(&key.to_owned()) {
            Ok(snapshot) => {
                let remaining = snapshot.remaining_burst_capacity();
                // When the next request past the bucket would be let through: now while some are
                // left, else when one more has dripped in.
                let reset_in = if remaining > 0 { Duration::ZERO } else { Duration::from_secs(1) / self.per_second };
                Standing::Allowed { remaining, reset_in }
            }
            Err(not_until) => Standing::Refused { retry_in: not_until.wait_time_from(self.limiter.clock().now()) },
        }
    }

    /// The bucket size, as `X-RateLimit-Limit` says it.
    pub fn burst(&self) -> u32 {
        self.burst
    }
}

/// The bucket a request draws from: its API token's, or without API authentication its
/// client address's.
fn caller_key(state: &AppState, req: &Request) -> String {
    match (state.config.api_auth, req.extensions().get::<Caller>()) {
        (ApiAuth::Token, Some(caller)) => format!("token:{}", caller.name),
        _ => {
            let peer = req.extensions().get::<ConnectInfo<SocketAddr>>();
            address_key(client_address(req.headers(), peer, state.config.behind_proxy))
        }
    }
}

/// A Unix time in whole seconds, `after` from now, rounded up: the reset is never early.
fn unix_seconds_after(after: Duration) -> u64 {
    let at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default() + after;
    at.as_secs() + u64::from(at.subsec_nanos() > 0)
}

fn put_standing(headers: &mut HeaderMap, burst: u32, remaining: u32, reset_in: Duration) {
    headers.insert(LIMIT.clone(), HeaderValue::from(burst));
    headers.insert(REMAINING.clone(), HeaderValue::from(remaining));
    headers.insert(RESET.clone(), HeaderValue::from(unix_seconds_after(reset_in)));
}

/// The middleware: runs after authentication (it needs the caller), before anything else.
pub async fn limit(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(limits) = state.request_limits.clone() else {
        return next.run(req).await;
    };
    match limits.take(&caller_key(&state, &req)) {
        Standing::Allowed { remaining, reset_in } => {
            let mut res = next.run(req).await;
            put_standing(res.headers_mut(), limits.burst(), remaining, reset_in);
            res
        }
        Standing::Refused { retry_in } => {
            let err = ApiError::rate_limited(
                format!("too many requests: at most {} at once, then {} a second, for each caller", limits.burst(), limits.per_second),
                "retry after the Retry-After header's seconds, or spread the requests out (a fetch can take many jobs at once)",
            )
            .detail("retry_after_seconds", retry_in.as_secs_f64());
            let mut res = err.into_response();
            // OJS: seconds as a decimal, so a client waits no longer than it must; rounded up to
            // the millisecond, so one that waits exactly that long is let in.
            let millis = retry_in.as_micros().div_ceil(1000).max(1);
            if let Ok(v) = HeaderValue::from_str(&format!("{}.{:03}", millis / 1000, millis % 1000)) {
                res.headers_mut().insert(RETRY_AFTER, v);
            }
            put_standing(res.headers_mut(), limits.burst(), 0, retry_in);
            res
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_lets_its_burst_through_then_refuses_until_it_refills() {
        // Slow enough that a stalled test thread does not refill the bucket between takes.
        let limits = RequestLimits::new(2, 3).expect("a limit");
        let taken: Vec<Standing> = (0..4).map(|_| limits.take("token:a")).collect();
        assert!(matches!(taken[0], Standing::Allowed { remaining: 2, reset_in } if reset_in == Duration::ZERO), "{taken:?}");
        assert!(matches!(taken[2], Standing::Allowed { remaining: 0, reset_in } if reset_in == Duration::from_millis(500)), "{taken:?}");
        let Standing::Refused { retry_in } = taken[3] else { panic!("the fourth must wait: {taken:?}") };
        assert!(retry_in > Duration::ZERO && retry_in <= Duration::from_millis(500), "{retry_in:?}");
        assert!(matches!(limits.take("token:b"), Standing::Allowed { remaining: 2, .. }), "each caller has a bucket of its own");
        std::thread::sleep(retry_in + Duration::from_millis(5));
        assert!(matches!(limits.take("token:a"), Standing::Allowed { .. }), "refilled");
    }

    #[test]
    fn zero_is_no_limit_and_the_burst_defaults_to_twice_the_rate() {
        assert!(RequestLimits::new(0, 5).is_none());
        assert_eq!(RequestLimits::new(7, 0).map(|l| l.burst()), Some(14));
    }

    #[test]
    fn the_reset_rounds_up() {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let at = unix_seconds_after(Duration::from_millis(1));
        assert!(at == now + 1 || at == now + 2, "{at} vs {now}");
    }
}
