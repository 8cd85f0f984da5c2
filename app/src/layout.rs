//! The frame around every page: the header with navigation and who is signed in.

use leptos::prelude::*;
use leptos_router::components::A;

use crate::auth::use_me;
use crate::refresh::REFRESH_SECS;

#[component]
pub fn Header() -> impl IntoView {
    let me = use_me();
    view! {
        <header class="top">
            <a class="brand" href="/">"Rebound"</a>
            <Transition fallback=|| ()>
                {move || {
                    me.get()
                        .map(|me| {
                            view! {
                                <nav>
                                    <A href="/" exact=true>"Overview"</A>
                                    <A href="/jobs">"Jobs"</A>
                                    <A href="/dead-letters">"Dead letters"</A>
                                    <A href="/policies">"Retry policies"</A>
                                    <A href="/queues">"Queues"</A>
                                    <A href="/workflows">"Workflows"</A>
                                    <A href="/cron">"Cron"</A>
                                    <A href="/workers">"Workers"</A>
                                    <A href="/audit">"Audit log"</A>
                                </nav>
                                <div class="who">
                                    <span class="refresh-note" title=format!("Pages refresh every {REFRESH_SECS} s while the tab is visible and you are not selecting or typing")>
                                        "live"
                                    </span>
                                    <span class="user">{me.username.clone()} " · " <span class=format!("role role-{}", me.role)>{me.role.clone()}</span></span>
                                    <form method="post" action="/auth/logout" class="inline">
                                        <input type="hidden" name="csrf" value=me.csrf.clone()/>
                                        <button type="submit" class="link">"Log out"</button>
                                    </form>
                                </div>
                            }
                        })
                }}
            </Transition>
        </header>
    }
}
