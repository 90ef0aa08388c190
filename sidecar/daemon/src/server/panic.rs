//! Catching a panic in a future, so that one bad request or epoch is
//! logged and answered instead of silently ending its task.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::task::Poll;

/// Runs `fut` to completion, turning a panic inside it into `Err` with the
/// panic's message. The future is dropped after a panic, which runs the
/// destructors of what it held (GPU locks, a waiting allocate's guard);
/// state it was changing stays as far as the panic left it, as after a
/// panic under any lock the daemon tolerates (it never unwraps a poisoned
/// lock).
pub(super) async fn catch<F: Future>(fut: F) -> Result<F::Output, String> {
    let mut fut = Box::pin(fut);
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(message(payload.as_ref()))),
        }
    })
    .await
}

/// The text of a panic's payload (`panic!("...")` gives a `&str` or a
/// `String`).
pub(super) fn message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(ToString::to_string)
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
