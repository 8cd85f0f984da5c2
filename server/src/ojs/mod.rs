//! The Open Job Spec HTTP binding under `/ojs`, plus Rebound's admin endpoints.
//!
//! One module per resource; every handler parses the request, calls the store, and maps the
//! answer. [`response`] gives every response the OJS headers and error shape.

mod admin;
pub mod body;
pub mod body_budget;
pub mod cron;
mod dead_letter;
pub mod envelope;
pub mod error;
mod events;
mod jobs;
mod manifest;
mod named_pages;
pub mod offset_pages;
mod policies;
pub mod query;
pub mod request_limit;
mod queues;
mod rate_limits;
mod replay_rules;
pub mod response;
mod test_mode;
pub mod unsupported;
mod workers;
mod workflows;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{get, post, put};
use tower_http::limit::RequestBodyLimitLayer;

use crate::{AppState, auth};

pub use jobs::MAX_BATCH;

/// The routes under `/ojs` (nest them there). Everything but the manifest and the health check
/// needs a bearer token unless `--api-auth none`. The reset route exists only in test mode.
pub fn router(state: AppState) -> Router {
    let mut protected = Router::new()
        .route("/v1/jobs", post(jobs::enqueue))
        .route("/v1/jobs/batch", post(jobs::enqueue_batch))
        .route("/v1/jobs/{id}", get(jobs::get).delete(jobs::cancel))
        .route("/v1/jobs/{id}/activate", post(jobs::activate))
        .route("/v1/workflows", post(workflows::create))
        .route("/v1/workflows/{id}", get(workflows::get).delete(workflows::cancel))
        .route("/v1/workers/fetch", post(workers::fetch))
        .route("/v1/workers/ack", post(workers::ack))
        .route("/v1/workers/nack", post(workers::nack))
        .route("/v1/workers/heartbeat", post(workers::heartbeat).layer(from_fn(response::safe_to_resend)))
        .route("/v1/workers/progress", post(workers::progress))
        .route("/v1/jobs/{id}/progress", get(jobs::progress))
        .route("/v1/dead-letter", get(dead_letter::list).delete(dead_letter::purge))
        .route("/v1/dead-letter/stats", get(dead_letter::stats))
        .route("/v1/dead-letter/retry", post(dead_letter::retry_matching))
        .route("/v1/dead-letter/replay-rules", get(replay_rules::list))
        .route("/v1/dead-letter/replay-rules/{name}", get(replay_rules::get).put(replay_rules::put).delete(replay_rules::delete))
        .route("/v1/dead-letter/{id}", get(dead_letter::get).delete(dead_letter::delete))
        .route("/v1/dead-letter/{id}/retry", post(dead_letter::retry))
        .route("/v1/queues", get(queues::list))
        .route("/v1/queues/{name}/stats", get(queues::stats))
        .route("/v1/queues/{name}/pause", post(queues::pause))
        .route("/v1/queues/{name}/resume", post(queues::resume))
        .route("/v1/cron", get(cron::list).post(cron::register))
        .route("/v1/cron/{name}", get(cron::get).delete(cron::delete).patch(cron::toggle))
        .route("/v1/cron/{name}/pause", post(cron::pause))
        .route("/v1/cron/{name}/resume", post(cron::resume))
        .route("/v1/cron/{name}/trigger", post(cron::trigger))
        .route("/v1/events", get(events::list))
        .route("/v1/events/stream", get(events::stream))
        .route("/v1/jobs/{id}/events", get(events::job_stream))
        .route("/v1/queues/{name}/events", get(events::queue_stream))
        .route("/v1/rate-limits", get(rate_limits::list))
        .route("/v1/rate-limits/{key}", get(rate_limits::get).put(rate_limits::put))
        .route("/v1/admin/queues", get(admin::queues))
        .route("/v1/admin/queues/{name}", get(admin::queue))
        .route("/v1/admin/queues/{name}/pause", post(admin::pause_queue))
        .route("/v1/admin/queues/{name}/resume", post(admin::resume_queue))
        .route("/v1/admin/queues/{name}/jobs", axum::routing::delete(admin::purge_queue))
        .route("/v1/admin/queues/{name}/config", put(admin::queue_config))
        .route("/v1/admin/queues/{name}/rate-limit", put(rate_limits::put_queue))
        .route("/v1/admin/jobs", get(admin::jobs))
        .route("/v1/admin/jobs/bulk/{action}", post(admin::bulk))
        .route("/v1/admin/jobs/{id}", get(admin::job))
        .route("/v1/admin/jobs/{id}/cancel", post(admin::cancel_job))
        .route("/v1/admin/jobs/{id}/retry", post(admin::retry_job))
        .route("/v1/admin/workers", get(admin::workers))
        .route("/v1/admin/workers/{id}", get(admin::worker).delete(admin::deregister_worker))
        .route("/v1/admin/workers/{id}/quiet", post(admin::quiet_worker))
        .route("/v1/admin/stats", get(admin::stats))
        .route("/v1/admin/stats/history", get(admin::stats_history))
        .route("/v1/admin/dead-letter", get(admin::dead_letters).delete(admin::purge_dead_letters))
        .route("/v1/admin/dead-letter/{id}/retry", post(admin::retry_dead_letter))
        .route("/v1/admin/system/config", get(admin::system_config))
        .route("/v1/admin/system/maintenance", post(admin::system_maintenance))
        .route("/v1/admin/policies", get(policies::list))
        .route("/v1/admin/policies/preview", post(policies::preview).layer(from_fn(response::safe_to_resend)))
        .route("/v1/admin/policies/{type}", get(policies::get).put(policies::put).delete(policies::delete))
        .route("/v1/admin/policies/{type}/versions", get(policies::versions));
    if state.config.test_mode {
        protected = protected.route("/v1/admin/reset", post(test_mode::reset));
    }
    // Checked after authentication (the outer layer), so strangers learn nothing from it, nor
    // take the budget of bodies in flight.
    let protected = protected
        .route_layer(from_fn_with_state(state.clone(), body_budget::admit))
        .route_layer(from_fn(query::refuse_nul))
        .route_layer(from_fn_with_state(state.clone(), request_limit::limit))
        .route_layer(from_fn_with_state(state.clone(), auth::require_token))
        .route_layer(from_fn(auth::refuse_cross_site));

    Router::new()
        .route("/manifest", get(manifest::manifest))
        .route("/v1/health", get(manifest::health))
        .merge(protected)
        .fallback(response::no_route)
        // axum's extractors have their own 2 MB default; the configured limit replaces it.
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(RequestBodyLimitLayer::new(state.config.max_body_bytes))
        // A request that takes too long is answered 408; its handler is never cut off (a
        // transaction dropped halfway, see `request_task`).
        .layer(from_fn_with_state((state.request_tasks.clone(), state.config.request_timeout), crate::request_task::run_to_completion_within))
        .layer(from_fn(unsupported::require_known_version))
        .layer(from_fn(response::ojs_response))
        .with_state(state)
}
