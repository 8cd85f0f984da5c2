//! Rebound's worker: the runtime that claims jobs out of Postgres and runs them, the handler
//! API for job types written in Rust, the built-in `exec`, `http` and `demo.*` handlers, and the
//! maintenance services one elected worker runs for everyone.
//!
//! ```no_run
//! use rebound_worker::{Worker, handler_fn};
//! # async fn demo(store: rebound_queue::Store) {
//! let worker = Worker::builder(store)
//!     .queue("default", 10)
//!     .handler("email.send", handler_fn(|job| async move {
//!         tracing::info!(id = %job.id(), "sending");
//!         Ok(None)
//!     }))
//!     .build()
//!     .expect("valid worker");
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! worker.run(shutdown).await;
//! # }
//! ```
//!
//! How the parts fit (River's layout, see DESIGN §4 and §9):
//!
//! * [`runtime`]: [`Worker`] and its builder; starts every part and runs the shutdown sequence.
//! * [`claimer`]: a queue's claim loops (one per claim batch of slots), each claiming up to
//!   the free slots; woken by [`notifier`] (which also keeps [`live_policies`] fresh), paused while the completer is behind.
//! * [`executor`]: runs one attempt: timeout, panic capture, lost locks, shutdown aborts;
//!   and runs a failure again at once, in place, when its policy has no backoff
//!   ([`live_policies`] is the copy of the policies it decides with).
//! * [`completer`]: writes results in batches, a few at once, and keeps them until the
//!   database takes them.
//! * [`heartbeat`]: extends the locks of running jobs and the worker's own registry row.
//! * [`maintenance`]: leader election and the scheduler, rescuer, expirer and pruner.
//! * [`handler`] / [`registry`]: the handler trait and the job type → handler map.
//! * [`handlers`]: the built-in `exec`, `http` and `demo.*` handlers.
//! * [`config`]: the TOML file of the `rebound-worker` binary; [`systemd`]: sd_notify.
//! * Supporting pieces: [`settings`] (the knobs and their defaults), [`running`] (jobs held
//!   until their result is written), [`outage`] (waiting out a database that is down),
//!   [`panic_capture`] (handler panics as failed attempts), [`identity`] (the worker id).

pub mod claimer;
pub mod completer;
pub mod config;
pub mod executor;
pub mod handler;
pub mod handlers;
pub mod health;
pub mod heartbeat;
pub mod identity;
pub mod live_policies;
pub mod maintenance;
pub mod notifier;
pub mod orphans;
pub mod outage;
pub mod panic_capture;
pub mod registry;
pub mod running;
pub mod runtime;
pub mod settings;
pub mod systemd;
pub mod usage;

pub use handler::{Handler, HandlerFuture, HandlerResult, JobContext, handler_fn};
pub use rebound_queue::{HandlerError, Outcome};
pub use registry::HandlerRegistry;
pub use runtime::{BuildError, RunReport, Worker, WorkerBuilder};
pub use settings::{CompleterSettings, MaintenanceSettings, PrunerSettings, RuntimeSettings};
