//! Telling the operator what happened: an action's result or a page's load error.

use leptos::prelude::*;
use leptos::server_fn::ServerFn;

use crate::error::AppError;

/// A failed load, with the way out for an expired session. On the server it also answers the
/// page with the error's status ([`AppError::status`]): a refused filter or id is a 4xx, a
/// missing job a 404, a failure inside the server a 500, not a 200 that merely says so.
#[component]
pub fn ErrorBox(error: AppError) -> impl IntoView {
    #[cfg(feature = "ssr")]
    crate::error::set_status(&error);
    let login = matches!(error, AppError::Unauthorized).then(|| view! { " " <a href="/login" rel="external">"Log in"</a> });
    view! { <div class="alert error" role="alert">{error.to_string()} {login}</div> }
}

/// The outcome of the latest submission of `action`: a success message or the error. After a
/// form post without JavaScript, the error comes back in the URL and shows here too: the post
/// itself is answered with a redirect (and the flash cookie that lets this page show the
/// error), and the page it lands on answers with the error's status, so a refused action is a
/// 4xx whether or not JavaScript ran.
#[component]
pub fn ActionResult<S>(action: ServerAction<S>) -> impl IntoView
where
    S: ServerFn<Output = String, Error = AppError> + Clone + Send + Sync + 'static,
    S::Output: Send + Sync + 'static,
{
    let value = action.value();
    let pending = action.pending();
    #[cfg(feature = "ssr")]
    value.with_untracked(|v| {
        if let Some(Err(e)) = v {
            crate::error::set_status(e);
        }
    });
    move || {
        if pending.get() {
            return view! { <div class="alert pending" role="status">"Working…"</div> }.into_any();
        }
        match value.get() {
            Some(Ok(msg)) => view! { <div class="alert success" role="status">{msg}</div> }.into_any(),
            Some(Err(e)) => view! { <div class="alert error" role="alert">{e.to_string()}</div> }.into_any(),
            None => ().into_any(),
        }
    }
}

/// Whether `action`'s latest answer refused its values: only then does a page put back into
/// its form the values a refused post carried to its URL (see [`back_with_typed_values`]).
/// Without JavaScript that answer comes from the refusal's own redirect, which the flash
/// cookie vouches for; so a link with values in it fills no form, nor does the page come back
/// with them after a later post that succeeded.
pub fn refused_for_values<S>(action: ServerAction<S>) -> bool
where
    S: ServerFn<Output = String, Error = AppError> + Clone + Send + Sync + 'static,
{
    action.value().with_untracked(|v| matches!(v, Some(Err(AppError::Invalid { .. }))))
}

/// Without JavaScript, a form post refused for its values sends the browser back to `back`
/// (a dashboard path whose query carries what was typed, which the page puts back into its
/// form) with the reason, as a refused post's redirect carries it: a plain form post otherwise
/// returns to the page as it was loaded, and every edit is lost. With JavaScript the form
/// keeps its values and shows the error itself, so nothing changes; nor for other errors.
#[cfg(feature = "ssr")]
pub fn back_with_typed_values<S: ServerFn>(back: &str, error: AppError) -> AppError {
    use leptos::server_fn::error::ServerFnUrlError;
    let plain_form = use_context::<http::request::Parts>()
        .and_then(|p| p.headers.get(http::header::ACCEPT).and_then(|a| a.to_str().ok()).map(|a| a.contains("text/html")))
        .unwrap_or(false);
    // A way back longer than a few KiB (a form's worth of text, percent-encoded) could pass
    // the longest URL a server takes; such a post comes back to the page as it was.
    if plain_form && back.len() <= 8 * 1024 && matches!(error, AppError::Invalid { .. }) {
        // Only the path and query are used: the origin is a placeholder to build the URL on.
        if let Ok(url) = ServerFnUrlError::new(S::PATH, error.clone()).to_url(&format!("http://dashboard.invalid{back}")) {
            leptos_axum::redirect(&format!("{}?{}", url.path(), url.query().unwrap_or_default()));
        }
    }
    error
}
