//! Who is looking at the dashboard, and what they may do.
//!
//! The server's session middleware resolves the session cookie once per request and puts a
//! [`SignedIn`] into the request's extensions; server functions read it from there. Reading is
//! open to every role; every mutation goes through [`authorize_mutation`], which checks the
//! form's CSRF token against the session and the role, so a viewer's attempt is a 403 that
//! changes nothing.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::AppError;

/// The signed-in operator as the pages see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Me {
    pub username: String,
    /// `"viewer"` or `"operator"`.
    pub role: String,
    /// Echoed in a hidden field of every mutating form.
    pub csrf: String,
}

impl Me {
    /// Whether this person may act (re-drive, cancel, edit policies, pause queues).
    pub fn can_act(&self) -> bool {
        self.role == "operator"
    }
}

/// The signed-in operator, or `None` on the login page.
#[server(endpoint = "whoami")]
pub async fn whoami() -> Result<Option<Me>, AppError> {
    Ok(server::current_session().map(|s| Me {
        username: s.operator.username.clone(),
        role: s.operator.role.as_str().to_string(),
        csrf: s.csrf_token.clone(),
    }))
}

/// The signed-in operator, loaded once at the top of the app.
#[derive(Clone, Copy)]
pub struct MeResource(pub Resource<Result<Option<Me>, AppError>>);

/// The signed-in operator, if loaded.
pub fn use_me() -> Signal<Option<Me>> {
    let me = expect_context::<MeResource>().0;
    Signal::derive(move || me.get().and_then(Result::ok).flatten())
}

/// The hidden CSRF field every mutating form carries.
#[component]
pub fn CsrfField() -> impl IntoView {
    let me = use_me();
    view! { <input type="hidden" name="csrf" value=move || me.get().map(|m| m.csrf).unwrap_or_default()/> }
}

/// Shown instead of action buttons' effect for viewers: they see what operators can do.
#[component]
pub fn ReadOnlyNote() -> impl IntoView {
    let me = use_me();
    view! {
        <Transition fallback=|| ()>
            {move || {
                me.get()
                    .filter(|m| !m.can_act())
                    .map(|_| view! { <p class="note">"You are signed in as a viewer: you can look at everything, but actions are disabled."</p> })
            }}
        </Transition>
    }
}

/// Whether the signed-in person may act; for `disabled=` on buttons.
pub fn use_can_act() -> Signal<bool> {
    let me = use_me();
    Signal::derive(move || me.get().map(|m| m.can_act()).unwrap_or(false))
}

#[cfg(feature = "ssr")]
pub use server::{SignedIn, authorize_mutation, signed_in};

#[cfg(feature = "ssr")]
mod server {
    use leptos::prelude::*;
    use rebound_queue::store::{Actor, Role, Session};

    use crate::error::AppError;

    /// Put into the request extensions by the server's session middleware.
    #[derive(Clone, Debug)]
    pub struct SignedIn(pub Session);

    /// Sets the response status for an auth refusal, then returns the error.
    fn refuse(e: AppError) -> AppError {
        crate::error::set_status(&e);
        e
    }

    /// The session of the current request, if any.
    pub fn current_session() -> Option<Session> {
        use_context::<http::request::Parts>().and_then(|parts| parts.extensions.get::<SignedIn>().map(|s| s.0.clone()))
    }

    /// The session of the current request, or 401.
    pub fn signed_in() -> Result<Session, AppError> {
        current_session().ok_or_else(|| refuse(AppError::Unauthorized))
    }

    /// Checks that the request may change something: a live session, the form's CSRF token
    /// equal to the session's, and the operator role. Returns who is acting, for the audit log.
    pub fn authorize_mutation(csrf: &str) -> Result<Actor, AppError> {
        let session = signed_in()?;
        if !constant_time_eq(csrf.as_bytes(), session.csrf_token.as_bytes()) {
            return Err(refuse(AppError::Csrf));
        }
        if session.operator.role != Role::Operator {
            return Err(refuse(AppError::Forbidden(format!(
                "{} is a viewer: viewers can look but not act; ask an operator",
                session.operator.username
            ))));
        }
        Ok(Actor::new(session.operator.username))
    }

    /// Compares without an early exit, so the time taken says nothing about the token.
    fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}
