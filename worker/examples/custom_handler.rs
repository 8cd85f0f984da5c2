//! A job type handled by Rust code instead of a command or a URL.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/rebound cargo run -p rebound-worker --example custom_handler
//! ```
//!
//! It migrates the database, enqueues four `payments.charge` jobs on the `payments` queue and
//! runs a worker until they are all settled, showing each way a handler can end an attempt:
//! success with a result, a retryable error, a snooze (`RetryAfter`) and a permanent failure.

use std::time::Duration;

use anyhow::Context;
use rebound_queue::{HandlerError, NewJob, Outcome, Store};
use rebound_worker::handler::retry;
use rebound_worker::{Handler, HandlerFuture, HandlerResult, JobContext, Worker};
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The job's first argument.
#[derive(Deserialize)]
struct Charge {
    card: String,
    cents: u64,
}

/// Charges a card. State a real handler would keep (an API client, a pool) lives here.
struct ChargeCard {
    gateway: String,
}

impl ChargeCard {
    async fn charge(&self, job: JobContext) -> HandlerResult {
        let charge: Charge = serde_json::from_value(job.arg(0).cloned().unwrap_or_default())
            // Bad input will not get better by retrying: straight to the dead letters.
            .map_err(|e| Outcome::DeadLetter(HandlerError::new("payments.bad_args", format!("cannot read the charge: {e}"))))?;
        match charge.card.as_str() {
            "declined" => Err(Outcome::Fail(
                HandlerError::new("payments.declined", "the card was declined").with_details(json!({ "gateway": self.gateway })),
            )),
            // The gateway said when to come back: snooze without spending an attempt (the
            // snooze is recorded as the job's last error, which is how we know it happened).
            "busy" if !snoozed_before(&job) => Err(Outcome::RetryAfter {
                at: jiff::Timestamp::now() + jiff::SignedDuration::from_secs(1),
                error: Some(HandlerError::new("payments.rate_limited", "gateway asked us to wait")),
            }),
            // A transient failure: the type's retry policy decides when to try again.
            "flaky" if job.attempt() < 2 => Err(retry("payments.gateway_timeout", "the gateway did not answer in time")),
            _ => Ok(Some(json!({ "charged_cents": charge.cents, "gateway": self.gateway }))),
        }
    }
}

fn snoozed_before(job: &JobContext) -> bool {
    job.job().last_error.as_ref().is_some_and(|e| e["type"] == "payments.rate_limited")
}

impl Handler for ChargeCard {
    fn handle(&self, job: JobContext) -> HandlerFuture<'_> {
        Box::pin(self.charge(job))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let url = std::env::var("DATABASE_URL").context("set DATABASE_URL")?;
    let store = Store::connect(&url, 8).await?;
    store.migrate().await?;

    let mut ids = Vec::new();
    for card in ["ok", "flaky", "busy", "declined"] {
        let job = NewJob::new("payments.charge", json!([{ "card": card, "cents": 1250 }])).queue("payments");
        ids.push(store.enqueue(job).await?.job.id);
    }

    let worker = Worker::builder(store.clone())
        .queue("payments", 4)
        .handler("payments.charge", ChargeCard { gateway: "example-gateway".into() })
        .configure(|s| s.poll_interval = Duration::from_millis(200))
        .build()?;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));

    // Wait until every job is settled (completed or given up), or Ctrl-C.
    loop {
        let mut settled = 0;
        for id in &ids {
            if store.job(*id).await?.state.is_terminal() {
                settled += 1;
            }
        }
        if settled == ids.len() {
            break;
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
    shutdown.cancel();
    running.await?;

    for id in ids {
        let job = store.job(id).await?;
        let attempts = store.attempts(id).await?;
        let story: Vec<String> = attempts.iter().map(|a| format!("{}{}", a.outcome, a.error_type.as_deref().map(|t| format!(" ({t})")).unwrap_or_default())).collect();
        println!("{} {:<9} {}", job.args[0]["card"], job.state.to_string(), story.join(" → "));
    }
    Ok(())
}
