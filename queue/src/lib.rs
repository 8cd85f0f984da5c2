//! Rebound's core: what a job is, what happens when it fails, and the Postgres store that
//! makes it so.
//!
//! * [`job`]: the job model and its eight OJS states.
//! * [`policy`]: retry policies (OJS shape), their merge and their delay math. Pure.
//! * [`outcome`]: what a handler says happened, and [`outcome::decide`], the pure function
//!   that turns a failure plus the effective policy into the job's next state.
//! * [`store`]: every SQL statement of the system.
//! * [`config_duration`]: durations as operators write them in configuration.
//! * [`bounds`]: the largest durations and the range of timestamps accepted anywhere.
//! * [`storable`]: JSON Postgres can store and give back (no NUL, readable numbers).
//! * [`storage_retry`]: retrying storage operations through transient database errors.
//! * [`retention`]: one pass of the pruner, as whichever process leads pruning runs it.

pub mod bounds;
pub mod config_duration;
pub mod cron_schedule;
pub mod job;
pub mod outcome;
pub mod policy;
pub mod retention;
pub mod storage_retry;
pub mod storable;
pub mod store;
pub mod unique_key;

pub use job::{Job, JobState, NewJob};
pub use outcome::{Decision, HandlerError, Outcome};
pub use policy::{PolicyError, PolicyPatch, RetryPolicy};
pub use store::{Store, StoreError};

#[cfg(feature = "testing")]
#[allow(clippy::expect_used, clippy::unwrap_used)]
pub mod testing;
