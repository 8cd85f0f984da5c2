//! The built-in handlers a config file can map job types to.

pub mod demo;
pub mod exec;
pub mod http;

use std::sync::Arc;

use crate::handler::Handler;

/// A built-in handler as configured (`kind = "exec" | "http" | "demo"`).
#[derive(Clone, Debug)]
pub enum BuiltinHandler {
    Exec(exec::ExecConfig),
    Http(http::HttpConfig),
    Demo(demo::DemoBehaviour),
}

impl BuiltinHandler {
    /// The runnable handler. `http_client` is shared so all `http` handlers share one
    /// connection pool.
    pub fn build(&self, http_client: &reqwest::Client) -> Arc<dyn Handler> {
        match self {
            BuiltinHandler::Exec(c) => Arc::new(exec::ExecHandler::new(c.clone())),
            BuiltinHandler::Http(c) => Arc::new(http::HttpHandler::new(http_client.clone(), c.clone())),
            BuiltinHandler::Demo(b) => Arc::new(demo::DemoHandler::new(*b)),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            BuiltinHandler::Exec(_) => "exec",
            BuiltinHandler::Http(_) => "http",
            BuiltinHandler::Demo(_) => "demo",
        }
    }
}
