//! Pages refresh themselves by polling: a tick every few seconds that page resources depend
//! on. The tick pauses while the tab is hidden (no load from forgotten tabs) and while the
//! operator is in the middle of something on the page (rows ticked, a field focused), so a
//! refresh never wipes a selection or a half-typed value.

use leptos::prelude::*;

/// Seconds between refreshes.
pub const REFRESH_SECS: u64 = 5;

#[derive(Clone, Copy)]
struct RefreshTick(RwSignal<u64>);

/// Starts the ticking (in the browser only; the server renders once).
pub fn provide_refresh() {
    let tick = RwSignal::new(0u64);
    provide_context(RefreshTick(tick));
    #[cfg(feature = "hydrate")]
    Effect::new(move |_| {
        let handle = set_interval_with_handle(
            move || {
                if should_refresh() {
                    tick.update(|t| *t += 1);
                }
            },
            std::time::Duration::from_secs(REFRESH_SECS),
        );
        if let Ok(handle) = handle {
            on_cleanup(move || handle.clear());
        }
    });
}

/// The tick: read it inside a resource's source to refetch on every refresh.
pub fn use_refresh() -> Signal<u64> {
    let tick = use_context::<RefreshTick>().map(|t| t.0).unwrap_or_else(|| RwSignal::new(0));
    tick.into()
}

#[cfg(feature = "hydrate")]
fn should_refresh() -> bool {
    let Some(doc) = web_sys::window().and_then(|w| w.document()) else { return false };
    if doc.visibility_state() != web_sys::VisibilityState::Visible {
        return false;
    }
    // Someone is selecting rows or typing: leave the page alone.
    let busy = "main input[type=checkbox]:checked, main input:focus, main textarea:focus, main select:focus, main details[open]";
    !matches!(doc.query_selector(busy), Ok(Some(_)))
}
