//! Requests over their quota waiting in the layer (`on_excess`), on tokio's paused clock: the
//! limiter reads the same clock ([`TokioClock`]), so every instant below is the limiter's own
//! schedule, not the machine's speed.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use sluice::{KeyedLimiter, QueueOrder, StaticQuotas, TokenBucket, TokioClock, WaitPolicy};
use sluice_http::{KeyPart, RateLimit, RateLimitLayer, WaitRoom};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

#[derive(Clone)]
struct Hello;

impl Service<Request<()>> for Hello {
    type Response = Response<&'static str>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        std::future::ready(Ok(Response::new("Hello World!")))
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<&'static str>, Infallible>> + Send>>;

/// A layer over alice at `quota` (10/s burst 1 unless said), waiting by `policy`.
fn service(quota: &str, policy: WaitPolicy, room: Arc<WaitRoom>) -> RateLimit<Hello> {
    let quotas = StaticQuotas::from_iter([
        ("alice".to_string(), quota.parse().unwrap()),
        ("bob".to_string(), quota.parse().unwrap()),
    ]);
    let limiter = KeyedLimiter::builder(TokenBucket, "1/s".parse().unwrap())
        .source(quotas)
        .clock(TokioClock::new())
        .build()
        .unwrap();
    RateLimitLayer::builder(limiter)
        .key([KeyPart::Header(http::HeaderName::from_static("x-account-id"))])
        .on_excess(policy)
        .on_excess_for("bob", WaitPolicy::reject())
        .wait_room(room)
        .build()
        .unwrap()
        .layer(Hello)
}

fn ask(service: &mut RateLimit<Hello>, who: &str) -> Answer {
    let request = Request::builder().header("x-account-id", who).body(()).unwrap();
    Box::pin(service.call(request))
}

/// Whether `answer` is done now, without letting time pass.
fn now_or_never(answer: &mut Answer) -> Option<Response<&'static str>> {
    match answer
        .as_mut()
        .poll(&mut Context::from_waker(std::task::Waker::noop()))
    {
        Poll::Ready(response) => Some(response.unwrap()),
        Poll::Pending => None,
    }
}

fn header<'r>(response: &'r Response<&'static str>, name: &str) -> Option<&'r str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

fn wait_up_to(ms: u64) -> WaitPolicy {
    WaitPolicy::wait_up_to(Duration::from_millis(ms))
}

/// Spawns every answer and records when each completed, by index.
async fn finish_times(answers: Vec<Answer>) -> Vec<(Duration, Response<&'static str>)> {
    let start = Instant::now();
    let tasks: Vec<_> = answers
        .into_iter()
        .map(|answer| {
            tokio::spawn(async move {
                let response = answer.await.unwrap();
                (start.elapsed(), response)
            })
        })
        .collect();
    let mut done = Vec::new();
    for task in tasks {
        done.push(task.await.unwrap());
    }
    done
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_order_one_interval_apart() {
    let room = Arc::new(WaitRoom::new(100));
    let mut service = service("10/s burst 1", wait_up_to(1_000), Arc::clone(&room));
    let mut answers: Vec<Answer> = (0..5).map(|_| ask(&mut service, "alice")).collect();
    let first = now_or_never(&mut answers[0]).expect("the first is served at once");
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(header(&first, "server-timing"), None);
    assert_eq!(room.waiters(), 4);
    assert_eq!(room.queued_keys(), 1);
    let done = finish_times(answers.split_off(1)).await;
    for (i, (at, response)) in done.iter().enumerate() {
        assert_eq!(response.status(), StatusCode::OK, "waiter {i}");
        // One interval (100 ms) apart, on the limiter's schedule; tokio's timer rounds up
        // to the millisecond.
        let due = Duration::from_millis(100 * (i as u64 + 1));
        assert!(
            *at >= due && *at <= due + Duration::from_millis(2),
            "waiter {i} served at {at:?}"
        );
        let timing = header(response, "server-timing").expect("a waited response says so");
        let ms: f64 = timing
            .strip_prefix("ratelimit-wait;dur=")
            .unwrap()
            .parse()
            .unwrap();
        assert!((ms - due.as_secs_f64() * 1e3).abs() <= 2.0, "{timing}");
    }
    assert_eq!(room.waiters(), 0);
    assert_eq!(
        room.queued_keys(),
        0,
        "no queue is left for a key without waiters"
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_that_cannot_be_served_within_max_wait_is_refused_at_once() {
    let room = Arc::new(WaitRoom::new(100));
    // 250 ms: the waiters due at 100 and 200 ms wait; the one due at 300 ms is refused.
    let mut service = service("10/s burst 1", wait_up_to(250), Arc::clone(&room));
    let mut answers: Vec<Answer> = (0..3).map(|_| ask(&mut service, "alice")).collect();
    assert!(now_or_never(&mut answers[0]).is_some());
    let mut refused = ask(&mut service, "alice");
    let response = now_or_never(&mut refused).expect("refused at once, without waiting");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&response, "retry-after"), Some("1")); // 300 ms, in whole seconds
    assert_eq!(header(&response, "server-timing"), None);
    assert_eq!(room.waiters(), 2);
    let done = finish_times(answers.split_off(1)).await;
    assert!(done.iter().all(|(_, r)| r.status() == StatusCode::OK));
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_at_once_and_other_keys_are_untouched() {
    let room = Arc::new(WaitRoom::new(100));
    let mut service = service(
        "10/s burst 1",
        wait_up_to(10_000).with_queue_limit(2),
        Arc::clone(&room),
    );
    let mut answers: Vec<Answer> = (0..3).map(|_| ask(&mut service, "alice")).collect();
    assert!(now_or_never(&mut answers[0]).is_some());
    let mut over = ask(&mut service, "alice");
    let response = now_or_never(&mut over).expect("refused at once");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    // bob's requests are refused, never queued: his policy is reject.
    let mut bob: Vec<Answer> = (0..2).map(|_| ask(&mut service, "bob")).collect();
    assert_eq!(now_or_never(&mut bob[0]).unwrap().status(), StatusCode::OK);
    assert_eq!(
        now_or_never(&mut bob[1]).unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(room.waiters(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_room_bounds_waiters_over_all_keys() {
    let room = Arc::new(WaitRoom::new(3));
    let mut service = service("10/s burst 1", wait_up_to(10_000), Arc::clone(&room));
    let mut first = ask(&mut service, "alice");
    assert!(now_or_never(&mut first).is_some());
    let mut held: Vec<Answer> = (0..3).map(|_| ask(&mut service, "alice")).collect();
    assert!(
        held.iter_mut().all(|answer| now_or_never(answer).is_none()),
        "they wait"
    );
    assert_eq!(room.waiters(), 3);
    let mut one_more = ask(&mut service, "alice");
    let response = now_or_never(&mut one_more).expect("refused at once: the room is full");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(held);
    assert_eq!(room.waiters(), 0);
    assert_eq!(room.queued_keys(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_leaves_its_place_and_the_next_moves_up() {
    let room = Arc::new(WaitRoom::new(100));
    let mut service = service("10/s burst 1", wait_up_to(1_000), Arc::clone(&room));
    let mut answers: Vec<Answer> = (0..4).map(|_| ask(&mut service, "alice")).collect();
    assert!(now_or_never(&mut answers[0]).is_some());
    assert!(now_or_never(&mut answers[1]).is_none());
    assert!(now_or_never(&mut answers[2]).is_none());
    assert!(now_or_never(&mut answers[3]).is_none());
    // The head (due at 100 ms) and the one behind it go: the last is served at 100 ms.
    drop(answers.remove(1));
    drop(answers.remove(1));
    assert_eq!(room.waiters(), 1);
    let done = finish_times(answers.split_off(1)).await;
    let (at, response) = &done[0];
    assert_eq!(response.status(), StatusCode::OK);
    assert!(*at <= Duration::from_millis(102), "served at {at:?}");
}

#[tokio::test(start_paused = true)]
async fn newest_first_serves_the_newest_and_refuses_those_it_pushes_past_their_deadline() {
    let room = Arc::new(WaitRoom::new(100));
    let policy = wait_up_to(250).with_queue_order(QueueOrder::NewestFirst);
    let mut service = service("10/s burst 1", policy, Arc::clone(&room));
    let mut answers: Vec<Answer> = (0..4).map(|_| ask(&mut service, "alice")).collect();
    assert!(now_or_never(&mut answers[0]).is_some());
    // Three waiters, newest first: served at 100 (the 3rd), 200 (the 2nd), and the 1st,
    // due at 300 ms, is past its 250 ms: refused at once.
    let first_waiter = now_or_never(&mut answers[1]).expect("pushed past its deadline");
    assert_eq!(first_waiter.status(), StatusCode::TOO_MANY_REQUESTS);
    let done = finish_times(answers.split_off(2)).await;
    let (second_at, second) = &done[0];
    let (third_at, third) = &done[1];
    assert_eq!(
        (second.status(), third.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    assert!(
        third_at < second_at,
        "newest first: {third_at:?} then {second_at:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_that_never_fits_is_refused_at_once() {
    let room = Arc::new(WaitRoom::new(100));
    let mut service = service("0/s", wait_up_to(1_000), Arc::clone(&room));
    let mut answer = ask(&mut service, "alice");
    let response = now_or_never(&mut answer).expect("refused at once");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(room.waiters(), 0);
}

/// A backend that answers later, as a remote store does.
struct Later(KeyedLimiter<String, TokenBucket, StaticQuotas<String>, TokioClock>);

impl sluice_http::LimitBackend for Later {
    fn check(&self, key: &str, cost: u64) -> sluice_http::CheckFuture {
        let answer = self.0.check_n(key, cost);
        sluice_http::CheckFuture::pending(async move {
            tokio::task::yield_now().await;
            answer
        })
    }

    fn quota(&self, key: &str) -> Option<sluice::Quota> {
        self.0.quota_of(key)
    }
}

#[tokio::test(start_paused = true)]
async fn a_backend_that_answers_later_is_waited_for_then_queued_for() {
    let quotas = StaticQuotas::from_iter([("alice".to_string(), "10/s burst 1".parse().unwrap())]);
    let limiter = KeyedLimiter::builder(TokenBucket, "1/s".parse().unwrap())
        .source(quotas)
        .clock(TokioClock::new())
        .build()
        .unwrap();
    let room = Arc::new(WaitRoom::new(100));
    let mut service = RateLimitLayer::builder(Later(limiter))
        .key([KeyPart::Header(http::HeaderName::from_static("x-account-id"))])
        .on_excess(wait_up_to(1_000))
        .wait_room(Arc::clone(&room))
        .build()
        .unwrap()
        .layer(Hello);
    let answers: Vec<Answer> = (0..3).map(|_| ask(&mut service, "alice")).collect();
    let done = finish_times(answers).await;
    let statuses: Vec<_> = done.iter().map(|(_, r)| r.status()).collect();
    assert_eq!(statuses, [StatusCode::OK; 3]);
    assert_eq!(
        header(&done[0].1, "server-timing"),
        None,
        "admitted on the first answer"
    );
    // The two denied join the queue in the order their first answers came back (the same
    // instant here): one is served one interval on, the other two.
    let mut waited: Vec<Duration> = done[1..].iter().map(|(at, _)| *at).collect();
    waited.sort();
    for (i, at) in waited.iter().enumerate() {
        let due = Duration::from_millis(100 * (i as u64 + 1));
        assert!(*at >= due && *at <= due + Duration::from_millis(2), "{waited:?}");
    }
    assert!(
        done[1..]
            .iter()
            .all(|(_, r)| header(r, "server-timing").is_some())
    );
    assert_eq!(room.counts().served, 2);
    assert_eq!(room.waiters(), 0);
}

/// What a FIFO queue on an exact token bucket serves, request by request: when (ms after the
/// start), or `None` for a refusal. A request is served at the earliest instant the bucket
/// admits its cost after everyone accepted before it; it is refused when that is more than
/// `max_wait` away, or when the cost still waiting at its arrival and its own pass
/// `queue_limit`. Waiters due at an arrival's instant are served before it.
fn fifo_bucket(burst: u64, max_wait: u64, queue_limit: u64, requests: &[(u64, u64)]) -> Vec<Option<u64>> {
    const T: i64 = 100; // ms per unit at 10/s
    let mut tat: i64 = 0;
    let mut accepted: Vec<(u64, u64)> = Vec::new(); // (served at, cost)
    let mut outcome = Vec::new();
    for &(at, cost) in requests {
        let earliest = (tat + (cost as i64 - burst as i64) * T).max(at as i64) as u64;
        let waiting: u64 = accepted.iter().filter(|(s, _)| *s > at).map(|(_, c)| c).sum();
        let refused = earliest > at && (earliest - at > max_wait || waiting + cost > queue_limit);
        if refused {
            outcome.push(None);
        } else {
            tat = tat.max(earliest as i64) + cost as i64 * T;
            accepted.push((earliest, cost));
            outcome.push(Some(earliest));
        }
    }
    outcome
}

/// The same requests through the layer, on tokio's paused clock: when each was answered (ms
/// after the start) and whether it was served.
async fn through_the_layer(
    burst: u64,
    max_wait: u64,
    queue_limit: u64,
    requests: &[(u64, u64)],
) -> (Vec<Option<u64>>, sluice_http::WaitCounts) {
    let quota = format!("10/s burst {burst}");
    let room = Arc::new(WaitRoom::new(1000));
    let quotas = StaticQuotas::from_iter([("alice".to_string(), quota.parse().unwrap())]);
    let start = Instant::now();
    let limiter = KeyedLimiter::builder(TokenBucket, "1/s".parse().unwrap())
        .source(quotas)
        .clock(TokioClock::new())
        .build()
        .unwrap();
    let costs = sluice_http::RouteCosts::new([
        sluice_http::CostRule::new("/2", None, 2),
        sluice_http::CostRule::new("/3", None, 3),
    ]);
    let mut service = RateLimitLayer::builder(limiter)
        .key([KeyPart::Header(http::HeaderName::from_static("x-account-id"))])
        .costs(costs)
        .on_excess(wait_up_to(max_wait).with_queue_limit(queue_limit))
        .wait_room(Arc::clone(&room))
        .build()
        .unwrap()
        .layer(Hello);
    let mut tasks = Vec::new();
    for &(at, cost) in requests {
        tokio::time::sleep_until(start + Duration::from_millis(at)).await;
        // Let every waiter due now be served first.
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        let request = Request::builder()
            .uri(format!("/{cost}"))
            .header("x-account-id", "alice")
            .body(())
            .unwrap();
        let answer: Answer = Box::pin(service.call(request));
        tasks.push(tokio::spawn(async move {
            let response = answer.await.unwrap();
            let ms = start.elapsed().as_millis() as u64;
            (response.status() == StatusCode::OK).then_some(ms)
        }));
    }
    let mut outcome = Vec::new();
    for task in tasks {
        outcome.push(task.await.unwrap());
    }
    (outcome, room.counts())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    /// Oldest-first waiting is exactly a FIFO queue on the bucket: every request accepted is
    /// served when the model says, none waits only to be refused, and every one refused at
    /// once could not have been served within its `max_wait` or its queue limit.
    #[test]
    fn oldest_first_waiting_matches_a_fifo_queue_on_the_bucket(
        burst in 1u64..=3,
        max_wait in proptest::sample::select(vec![150u64, 250, 450, 1000]),
        queue_limit in 1u64..=6,
        steps in proptest::collection::vec((0u64..=120, 1u64..=3), 1..=20),
    ) {
        let mut at = 0;
        let requests: Vec<(u64, u64)> = steps
            .iter()
            .map(|&(gap, cost)| {
                at += gap;
                (at, cost.min(burst))
            })
            .collect();
        let expected = fifo_bucket(burst, max_wait, queue_limit, &requests);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let (got, counts) = runtime.block_on(through_the_layer(burst, max_wait, queue_limit, &requests));
        proptest::prop_assert_eq!(&got, &expected, "requests (ms, cost): {:?}", requests);
        proptest::prop_assert_eq!(counts.late, 0);
    }
}
