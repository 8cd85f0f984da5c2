//! The operators' dashboard (the Leptos app in `app/`), mounted into the server's router.
//!
//! * Pages and server functions come from `leptos_axum`, with the store provided as context
//!   so server functions can reach it.
//! * [`dashboard_auth`](crate::dashboard_auth) signs operators in and out and resolves the
//!   session for every dashboard request.
//! * The compiled front end (`/pkg/*`: the wasm, its JS glue and the CSS) and the public
//!   assets are served from the site root built by `scripts/build-site.sh`
//!   (`LEPTOS_SITE_ROOT`, default `target/site`).

use std::path::PathBuf;

use axum::Router;
use axum::middleware::from_fn_with_state;
use axum::routing::post;
use leptos::config::LeptosOptions;
use leptos::prelude::provide_context;
use leptos_axum::{LeptosRoutes, generate_route_list};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::services::{ServeDir, ServeFile};

use crate::AppState;
use crate::dashboard_auth::{login, logout, session_middleware};


/// The front end's output name: `/pkg/rebound.js`, `rebound.wasm`, `rebound.css`.
const OUTPUT_NAME: &str = "rebound";

/// Leptos' settings from the `LEPTOS_*` environment variables, with this project's defaults
/// when they are not set (running the binary by hand, or from tests).
pub fn leptos_options() -> LeptosOptions {
    let from_env = leptos::config::get_configuration(None).map(|c| c.leptos_options);
    let mut options = match from_env {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(error = %e, "LEPTOS_* settings are invalid; using the defaults");
            LeptosOptions::builder().output_name(OUTPUT_NAME).site_root("target/site").build()
        }
    };
    if options.output_name.is_empty() {
        options.output_name = OUTPUT_NAME.into();
    }
    options
}

/// Adds the dashboard's pages, server functions, login/logout and static files.
pub fn mount(router: Router, state: AppState) -> Router {
    let options = leptos_options();
    let site_root = PathBuf::from(options.site_root.as_ref());
    let pkg_dir = site_root.join(options.site_pkg_dir.as_ref());
    let routes = generate_route_list(app::App);
    let store = state.store.clone();
    let shell_options = options.clone();
    let pages = Router::<LeptosOptions>::new()
        .leptos_routes_with_context(
            &options,
            routes,
            move || provide_context(store.clone()),
            move || app::shell(shell_options.clone()),
        )
        .with_state(options);
    let auth = Router::new().route("/auth/login", post(login)).route("/auth/logout", post(logout)).with_state(state.clone());
    // The body limit is outermost: a large body is refused (413) before the session is looked
    // up, signed in or not.
    let dashboard = pages
        .merge(auth)
        .layer(from_fn_with_state(state, session_middleware))
        .layer(RequestBodyLimitLayer::new(crate::dashboard_guard::MAX_FORM_BYTES));
    let assets = Router::new()
        .nest_service("/pkg", ServeDir::new(pkg_dir))
        .route_service("/favicon.svg", ServeFile::new(site_root.join("favicon.svg")));
    router.merge(dashboard).merge(assets)
}
