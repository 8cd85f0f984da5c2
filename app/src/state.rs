//! What the server hands to the app's server functions: the store. The server provides it as
//! context for every page render and server-function call (`leptos_routes_with_context`).

#[cfg(feature = "ssr")]
pub fn store() -> Result<rebound_queue::Store, crate::error::AppError> {
    leptos::prelude::use_context::<rebound_queue::Store>()
        .ok_or_else(|| crate::error::AppError::internal("the dashboard has no store in its context"))
}
