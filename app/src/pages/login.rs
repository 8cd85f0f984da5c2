//! The login page. The form posts to the server's `/auth/login` handler (not a server
//! function: it sets the session cookie and redirects, which is all a login needs).

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use crate::auth::use_me;

#[component]
pub fn LoginPage() -> impl IntoView {
    let q = use_query_map();
    // The server decides where a sign-in goes (it parses and rebuilds `next`); this only keeps
    // obvious junk out of the form.
    let next = move || {
        q.with(|q| q.get("next"))
            .filter(|n| n.starts_with('/') && !n.starts_with("//") && !n.chars().any(|c| c.is_control() || c == '\\'))
            .unwrap_or_else(|| "/".into())
    };
    let failed = move || q.with(|q| q.get("error").is_some());
    let logged_out = move || q.with(|q| q.get("logged_out").is_some());
    let me = use_me();
    view! {
        <section class="login">
            <h1>"Sign in to Rebound"</h1>
            <Transition fallback=|| ()>
                {move || me.get().map(|m| view! { <p class="note">"You are signed in as " <strong>{m.username}</strong> ". " <a href="/">"Go to the overview"</a></p> })}
            </Transition>
            {move || failed().then(|| view! { <div class="alert error" role="alert">"Wrong username or password."</div> })}
            {move || logged_out().then(|| view! { <div class="alert success" role="status">"You have been logged out."</div> })}
            <form method="post" action="/auth/login" class="login-form">
                <input type="hidden" name="next" value=next/>
                <label>"Username" <input name="username" autocomplete="username" maxlength="64" required autofocus/></label>
                <label>"Password" <input name="password" type="password" autocomplete="current-password" required/></label>
                <button type="submit" class="primary">"Sign in"</button>
            </form>
            <p class="muted">"Operators are created on the server with " <code>"rebound-server user add NAME --role operator"</code> "."</p>
        </section>
    }
}
