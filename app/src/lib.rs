//! Rebound's operators' dashboard: a Leptos app rendered on the server (every page works
//! without JavaScript) and hydrated in the browser (live policy preview, auto-refresh, forms
//! that submit without a page reload).
//!
//! * [`pages`]: one module per page, each with its server functions next to its components.
//! * [`auth`]: who is signed in; CSRF and role checks on every mutation.
//! * [`filters`]: the job filter shared by the jobs list and the dead-letter page.
//! * [`charts`]: SVG charts; [`time_text`]: how times and durations are written.
//! * [`refresh`]: polling while the tab is visible.
//!
//! Server functions call `rebound_queue` and nothing else; the server (`rebound-server`)
//! mounts the routes and provides the store as context.

pub mod auth;
pub mod charts;
pub mod error;
pub mod feedback;
pub mod filters;
pub mod layout;
pub mod pages;
pub mod refresh;
pub mod state;
pub mod time_text;

use leptos::prelude::*;
use leptos_meta::{MetaTags, Stylesheet, Title, provide_meta_context};
use leptos_router::components::{Route, Router, Routes};
use leptos_router::{SsrMode, path};

use crate::auth::{MeResource, whoami};
use crate::layout::Header;
use crate::pages::*;

/// The Content-Security-Policy of a dashboard page: scripts only from this site or inline with
/// this response's nonce (Leptos puts it on its hydration and resource scripts), WebAssembly
/// compilation (`'wasm-unsafe-eval'`, which the hydration bundle needs), no framing, no
/// plugins, forms only to this site.
pub fn content_security_policy(nonce: &str) -> String {
    format!(
        "default-src 'self'; script-src 'self' 'nonce-{nonce}' 'wasm-unsafe-eval'; style-src 'self'; img-src 'self' data:; \
         connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )
}

/// The HTML document around the app; the server renders it for every page.
pub fn shell(options: LeptosOptions) -> impl IntoView {
    #[cfg(feature = "ssr")]
    if let (Some(nonce), Some(res)) = (leptos::nonce::use_nonce(), use_context::<leptos_axum::ResponseOptions>())
        && let Ok(value) = http::HeaderValue::from_str(&content_security_policy(&nonce))
    {
        res.insert_header(http::header::CONTENT_SECURITY_POLICY, value);
    }
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <link rel="icon" href="/favicon.svg" type="image/svg+xml"/>
                <AutoReload options=options.clone()/>
                <HydrationScripts options/>
                <MetaTags/>
            </head>
            <body>
                <App/>
            </body>
        </html>
    }
}

/// The dashboard. Every route renders with `SsrMode::Async`: the server waits for the page's
/// data before sending it, so a page (and a form's redirect back to it) is complete without
/// JavaScript.
#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    let me = Resource::new_blocking(|| (), |_| whoami());
    provide_context(MeResource(me));
    refresh::provide_refresh();
    // Tells tests (and curious operators) that the wasm has taken over the page.
    #[cfg(feature = "hydrate")]
    Effect::new(|_| {
        if let Some(body) = document().body() {
            let _ = body.set_attribute("data-hydrated", "true");
        }
    });
    view! {
        <Stylesheet id="leptos" href="/pkg/rebound.css"/>
        <Title text="Rebound"/>
        <Router>
            <Header/>
            <main>
                <Routes fallback=|| view! { <NotFound/> }>
                    <Route path=path!("/login") view=LoginPage ssr=SsrMode::Async/>
                    <Route path=path!("/") view=OverviewPage ssr=SsrMode::Async/>
                    <Route path=path!("/jobs") view=JobsPage ssr=SsrMode::Async/>
                    <Route path=path!("/jobs/:id") view=JobDetailPage ssr=SsrMode::Async/>
                    <Route path=path!("/dead-letters") view=DeadLettersPage ssr=SsrMode::Async/>
                    <Route path=path!("/dead-letters/replay-rules") view=ReplayRulesPage ssr=SsrMode::Async/>
                    <Route path=path!("/policies") view=PoliciesPage ssr=SsrMode::Async/>
                    <Route path=path!("/policies/edit") view=PolicyEditorPage ssr=SsrMode::Async/>
                    <Route path=path!("/queues") view=QueuesPage ssr=SsrMode::Async/>
                    <Route path=path!("/cron") view=CronPage ssr=SsrMode::Async/>
                    <Route path=path!("/workers") view=WorkersPage ssr=SsrMode::Async/>
                    <Route path=path!("/workflows") view=WorkflowsPage ssr=SsrMode::Async/>
                    <Route path=path!("/workflows/:id") view=WorkflowPage ssr=SsrMode::Async/>
                    <Route path=path!("/audit") view=AuditPage ssr=SsrMode::Async/>
                </Routes>
            </main>
        </Router>
    }
}

#[component]
fn NotFound() -> impl IntoView {
    #[cfg(feature = "ssr")]
    if let Some(res) = use_context::<leptos_axum::ResponseOptions>() {
        res.set_status(http::StatusCode::NOT_FOUND);
    }
    view! {
        <h1>"Not found"</h1>
        <p>"There is no such page. " <a href="/">"Back to the overview"</a></p>
    }
}

/// The browser entry point: attaches the app to the server-rendered page.
#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_body(App);
}
