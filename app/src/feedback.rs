//! Telling the operator what happened: an action's result or a page's load error.

use leptos::prelude::*;
use leptos::server_fn::ServerFn;

use crate::error::AppError;

/// A failed load, with the way out for an expired session.
#[component]
pub fn ErrorBox(error: AppError) -> impl IntoView {
    let login = matches!(error, AppError::Unauthorized).then(|| view! { " " <a href="/login" rel="external">"Log in"</a> });
    view! { <div class="alert error" role="alert">{error.to_string()} {login}</div> }
}

/// The outcome of the latest submission of `action`: a success message or the error. After a
/// form post without JavaScript, the error comes back in the URL and shows here too.
#[component]
pub fn ActionResult<S>(action: ServerAction<S>) -> impl IntoView
where
    S: ServerFn<Output = String, Error = AppError> + Clone + Send + Sync + 'static,
    S::Output: Send + Sync + 'static,
{
    let value = action.value();
    let pending = action.pending();
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
