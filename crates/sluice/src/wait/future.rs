//! The async acquire, on tokio's timer: the head sleeps until its retry-after inside its own
//! future; the others sleep until woken.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::task::Poll;
use std::time::Duration;

use tokio::time::{Instant, Sleep, sleep_until};

use super::queue::{Step, Wake};
use super::{Arrival, Host, Ticket, WaitError, arrive, never, timed_out};

/// Far enough to mean "never" (tokio's own far future is about 30 years).
const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);

fn after(now: Instant, wait: Duration) -> Instant {
    now.checked_add(wait).unwrap_or_else(|| now + FAR)
}

pub(crate) async fn acquire<H: Host>(
    host: &H,
    cost: u64,
    timeout: Option<Duration>,
) -> Result<H::Grant, WaitError> {
    let id = match arrive(host, cost, timeout)? {
        Arrival::Granted(grant) => return Ok(grant),
        Arrival::Queued(id) => id,
    };
    // Boxed: the timers live only in futures that wait, so one that does not stays small.
    let wait: Pin<Box<dyn Future<Output = Result<H::Grant, WaitError>> + Send + '_>> =
        Box::pin(wait_turn(Ticket::new(host, id, cost), timeout));
    wait.await
}

/// Waits in the queue until granted, evicted or timed out.
async fn wait_turn<H: Host>(
    mut ticket: Ticket<'_, H>,
    timeout: Option<Duration>,
) -> Result<H::Grant, WaitError> {
    let cost = ticket.cost;
    let start = Instant::now();
    let waited = timeout.unwrap_or(Duration::MAX);
    let deadline = timeout.map(|t| after(start, t));
    let mut deadline_timer = pin!(deadline.map(sleep_until));
    let mut nap: Pin<&mut Sleep> = pin!(sleep_until(start));
    poll_fn(|cx| {
        if let Some(timer) = deadline_timer.as_mut().as_pin_mut()
            && timer.poll(cx).is_ready()
        {
            return Poll::Ready(Err(timed_out(cost, waited, None)));
        }
        // Every poll steps: a waiter is polled only when woken (by the queue or a timer).
        loop {
            return match ticket.step(|| Wake::Task(cx.waker().clone())) {
                Step::Granted(grant) => Poll::Ready(Ok(grant)),
                Step::Evicted => Poll::Ready(Err(WaitError::Evicted)),
                Step::Never { capacity } => Poll::Ready(Err(never(cost, capacity))),
                Step::Wait => Poll::Pending,
                Step::Sleep(ns) => {
                    let now = Instant::now();
                    let wake_at = after(now, Duration::from_nanos(ns));
                    if deadline.is_some_and(|d| wake_at > d) {
                        return Poll::Ready(Err(timed_out(cost, waited, Some(ns))));
                    }
                    nap.as_mut().reset(wake_at);
                    if nap.as_mut().poll(cx).is_ready() {
                        continue; // already due: ask again
                    }
                    Poll::Pending
                }
            };
        }
    })
    .await
}
