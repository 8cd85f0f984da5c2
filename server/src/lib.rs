//! `rebound-server`: the process operators and other languages talk to.
//!
//! * [`ojs`]: the Open Job Spec HTTP API under `/ojs` and Rebound's admin endpoints.
//! * [`auth`]: bearer tokens for API clients; [`passwords`]: argon2 for dashboard operators.
//! * [`metrics`]: `/metrics`; [`health`]: `/healthz`, `/readyz`.
//! * [`maintenance`]: the scheduler / rescuer / TTL loop, run while this process leads.
//! * [`dashboard`]: where the Leptos dashboard is mounted; [`dashboard_auth`] signs operators in
//!   and out, [`dashboard_guard`] checks every dashboard request first, [`login_throttle`]
//!   slows password guessing.
//! * [`security_headers`]: CSP, framing, sniffing and referrer headers on every response.
//! * [`config`]: the command line; [`commands`]: what each subcommand does.
//!
//! The library exposes [`router`] so tests can drive the whole server in process.

pub mod auth;
pub mod commands;
pub mod config;
pub mod connections;
pub mod dashboard;
pub mod dashboard_auth;
pub mod dashboard_guard;
pub mod health;
pub mod known_browser_turns;
pub mod login_throttle;
pub mod maintenance;
pub mod metrics;
pub mod ojs;
pub mod passwords;
pub mod request_body;
pub mod request_task;
pub mod security_headers;
pub mod unknown_credentials;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::http::{HeaderValue, Request};
use axum::middleware::{map_request, map_response};
use axum::routing::get;
use rebound_queue::Store;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower_http::request_id::{MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use uuid::Uuid;

use crate::config::ServerConfig;
use crate::metrics::Metrics;

/// What every handler can reach.
#[derive(Clone, Debug)]
pub struct AppState {
    pub store: Store,
    pub config: Arc<ServerConfig>,
    pub metrics: Arc<Metrics>,
    pub started_at: Instant,
    /// Where offset-paged listings continue (see [`ojs::offset_pages`]).
    pub offset_pages: Arc<ojs::offset_pages::OffsetPages>,
    /// Turns at checking a dashboard password: argon2 takes ~19 MiB per check, so only
    /// [`CONCURRENT_PASSWORD_CHECKS`] run at once for strangers' sign-ins however many arrive
    /// (known browsers have [`known_browser_turns`] of their own).
    pub password_checks: Arc<Semaphore>,
    /// Turns kept for sign-ins from browsers their operators signed in from before.
    pub known_browser_turns: Arc<known_browser_turns::KnownBrowserTurns>,
    /// Cancelled when the server shuts down: long-lived responses (event streams) end then.
    pub shutdown: CancellationToken,
    /// Places for open event streams (`max_event_streams`): each polls the store for as long
    /// as it is open, so without a bound a few clients could hold the whole pool.
    pub event_streams: Arc<Semaphore>,
    /// Every request's handler, detached from its caller (see [`request_task`]).
    pub request_tasks: request_task::RequestTasks,
    /// The bytes of OJS request bodies that may be handled at once (see
    /// [`ojs::body_budget`]), in units of a KiB, and how many units it has.
    pub body_budget: Arc<Semaphore>,
    pub body_budget_units: usize,
    /// Each API caller's bucket of requests (`api_rate_limit`); `None` without a limit.
    pub request_limits: Option<Arc<ojs::request_limit::RequestLimits>>,
    /// The health probes' shared looks at the database (see [`health`]).
    pub probes: Arc<health::Probes>,
    /// Unknown credentials seen per client address (see [`unknown_credentials`]).
    pub unknown_credentials: Arc<unknown_credentials::UnknownCredentials>,
}

/// How many argon2 password checks run at once.
pub const CONCURRENT_PASSWORD_CHECKS: usize = 2;

impl AppState {
    /// State for a server on `store` with `config`, and fresh metrics.
    pub fn new(store: Store, config: ServerConfig) -> Self {
        // Beyond MAX_PERMITS the semaphore would panic; that many is no limit anyway.
        let event_streams = Arc::new(Semaphore::new(config.max_event_streams.min(Semaphore::MAX_PERMITS)));
        let body_budget = ojs::body_budget::budget(config.max_body_bytes_in_flight);
        let request_limits = ojs::request_limit::RequestLimits::new(config.api_rate_limit, config.api_rate_burst).map(Arc::new);
        AppState {
            store,
            config: Arc::new(config),
            metrics: Arc::new(Metrics::default()),
            started_at: Instant::now(),
            offset_pages: Arc::default(),
            password_checks: Arc::new(Semaphore::new(CONCURRENT_PASSWORD_CHECKS)),
            known_browser_turns: Arc::default(),
            shutdown: CancellationToken::new(),
            event_streams,
            request_tasks: request_task::RequestTasks::default(),
            body_budget_units: body_budget.available_permits(),
            body_budget,
            request_limits,
            probes: Arc::default(),
            unknown_credentials: Arc::default(),
        }
    }
}

/// Request ids in the form OJS recommends, `req_<UUIDv7>`, unless the client sent one.
#[derive(Clone, Copy, Debug, Default)]
struct RequestIdV7;

impl MakeRequestId for RequestIdV7 {
    fn make_request_id<B>(&mut self, _request: &Request<B>) -> Option<RequestId> {
        HeaderValue::from_str(&format!("req_{}", Uuid::now_v7())).ok().map(RequestId::new)
    }
}

/// The longest client `X-Request-Id` kept.
const MAX_CLIENT_REQUEST_ID: usize = 128;

/// A client's `X-Request-Id` is kept only if it is one plain token (at most
/// [`MAX_CLIENT_REQUEST_ID`] of `A-Z a-z 0-9 . _ : -`), sent once: it is echoed in the answer
/// and its error body and written into every log line of the request, where anything else
/// could pass for other text. Otherwise the request gets one of ours.
async fn keep_plain_request_id(mut req: axum::extract::Request) -> axum::extract::Request {
    let values = req.headers().get_all("x-request-id");
    let mut sent = values.iter();
    let plain = match (sent.next(), sent.next()) {
        (None, _) => true,
        (Some(v), None) => {
            let b = v.as_bytes();
            !b.is_empty() && b.len() <= MAX_CLIENT_REQUEST_ID && b.iter().all(|c| c.is_ascii_alphanumeric() || b"._:-".contains(c))
        }
        (Some(_), Some(_)) => false,
    };
    if !plain {
        req.headers_mut().remove("x-request-id");
    }
    req
}

/// The span of one request, at INFO so that the default filter keeps it: every line a handler
/// logs (on its own task, see [`request_task`]) then says which request it served.
fn request_span<B>(req: &Request<B>) -> tracing::Span {
    let id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("");
    tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id = id)
}

/// The whole server: the OJS API under `/ojs`, the probes, `/metrics`, then the dashboard.
/// Every response carries `X-Request-Id` (the client's, if it sent one) and the
/// [`security_headers`]. Bodies are limited where they are read: the OJS API to
/// `max_body_bytes` (with its own error body), the dashboard to
/// [`dashboard_guard::MAX_FORM_BYTES`]; the probes, metrics and static files never read one.
pub fn router(state: AppState) -> Router {
    // Metrics name every job type and queue: behind the API's token unless told otherwise.
    let metrics = Router::new().route("/metrics", get(metrics::serve_metrics));
    let metrics = if state.config.public_metrics {
        metrics
    } else {
        metrics.route_layer(axum::middleware::from_fn_with_state(state.clone(), auth::require_token))
    };
    let app = Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .merge(metrics)
        .with_state(state.clone())
        .nest("/ojs", ojs::router(state.clone()));
    let tasks = state.request_tasks.clone();
    dashboard::mount(app, state)
        // Innermost: a client hanging up drops only the wait for the answer (see `request_task`).
        .layer(axum::middleware::from_fn_with_state(tasks, request_task::run_to_completion))
        .layer(map_response(security_headers::add))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(TraceLayer::new_for_http().make_span_with(request_span))
        .layer(SetRequestIdLayer::x_request_id(RequestIdV7))
        .layer(map_request(keep_plain_request_id))
}
