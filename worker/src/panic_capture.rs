//! Turning a handler panic into a failed attempt whose details carry the panic.
//!
//! A panic hook sees the message, location and a backtrace, but only for the thread that
//! panicked; the executor sees the unwind. The two meet in a thread-local: while a handler is
//! being polled the hook stores what it saw there instead of printing it, and the poll
//! wrapper picks it up after `catch_unwind`. Panics elsewhere go to the previous hook as usual.

use std::any::Any;
use std::backtrace::Backtrace;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Once;
use std::task::{Context, Poll};

use serde_json::{Value, json};

/// What a handler's panic left behind.
#[derive(Clone, Debug, PartialEq)]
pub struct CapturedPanic {
    pub message: String,
    /// `file:line:column` of the panic.
    pub location: Option<String>,
    pub backtrace: Option<String>,
}

impl CapturedPanic {
    /// The `details` of the failed attempt.
    pub fn details(&self) -> Value {
        json!({ "panic": self.message, "location": self.location, "backtrace": self.backtrace })
    }
}

thread_local! {
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
    static CAPTURED: RefCell<Option<CapturedPanic>> = const { RefCell::new(None) };
}

/// Installs the hook (once per process; later calls do nothing).
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_HANDLER.with(Cell::get) {
                let captured = CapturedPanic {
                    message: message_of(info.payload()),
                    location: info.location().map(|l| l.to_string()),
                    backtrace: Some(Backtrace::force_capture().to_string()),
                };
                CAPTURED.with(|c| *c.borrow_mut() = Some(captured));
            } else {
                previous(info);
            }
        }));
    });
}

/// The text of a panic payload (`panic!("...")` gives a `&str` or a `String`).
pub fn message_of(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// Runs `f` as handler code: a panic becomes `Err` with what the hook captured.
pub fn call<T>(f: impl FnOnce() -> T) -> Result<T, CapturedPanic> {
    IN_HANDLER.with(|h| h.set(true));
    let out = catch_unwind(AssertUnwindSafe(f));
    IN_HANDLER.with(|h| h.set(false));
    out.map_err(|payload| {
        CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_else(|| CapturedPanic {
            message: message_of(payload.as_ref()),
            location: None,
            backtrace: None,
        })
    })
}

/// A future whose panics, at any poll, become `Err(CapturedPanic)`.
pub struct CatchPanic<F> {
    inner: F,
}

impl<F: Future + Unpin> Future for CatchPanic<F> {
    type Output = Result<F::Output, CapturedPanic>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = Pin::new(&mut self.inner);
        match call(move || inner.poll(cx)) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(p) => Poll::Ready(Err(p)),
        }
    }
}

/// Wraps a future (a boxed handler future, typically) so its panics are captured.
pub fn catch<F: Future + Unpin>(fut: F) -> CatchPanic<F> {
    CatchPanic { inner: fut }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn panics_while_polling_are_captured_with_their_message_and_location() {
        install();
        let fut: Pin<Box<dyn Future<Output = u32> + Send>> = Box::pin(async {
            tokio::task::yield_now().await;
            if std::hint::black_box(true) {
                panic!("the printer is on fire");
            }
            1
        });
        let err = catch(fut).await.unwrap_err();
        assert_eq!(err.message, "the printer is on fire");
        assert!(err.location.as_deref().unwrap_or("").contains("panic_capture.rs"), "{err:?}");
        assert!(err.details()["panic"] == "the printer is on fire");

        let ok: Pin<Box<dyn Future<Output = u32> + Send>> = Box::pin(async { 7 });
        assert_eq!(catch(ok).await.unwrap(), 7);
        let formatted = call(|| -> u32 { panic!("{} {}", "formatted", 42) }).unwrap_err();
        assert_eq!(formatted.message, "formatted 42");
    }
}
