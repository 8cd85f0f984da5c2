//! Integration tests of the HTTP API, driving the whole router in process against a fresh
//! Postgres database per test. (One test binary: linking the server is the slow part.)

mod admin;
mod auth;
mod common;
mod connections;
mod cron;
mod cut_off;
mod event_streams;
mod hostile_inputs;
mod hostile_values;
mod jobs;
mod maintenance;
mod metrics;
mod policies;
mod sdk_compat;
mod lock_timeout;
mod workflows;
