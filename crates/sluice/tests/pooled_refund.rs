//! Give-backs on keys admitted through the failsafe pool: a take on a pooled key given back
//! restores both the key's state and the pool, whatever the entry went through before the
//! take; a give-back after the key's state was replaced (an epoch move, a fetched quota, a
//! requote) gives back nothing, on the key or the pool.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use sluice::{
    FetchResult, KeyedLimiter, KeyedLink, Link, ManualClock, Quota, QuotaSource, RateLimiter, Task,
    TokenBucket, check_chain,
};

fn quota(text: &str) -> Quota {
    text.parse().unwrap()
}

/// The failsafe quota: a burst of 10 at a rate whose reduced count (2^21 − 1 per 10^6 ns) puts
/// the horizon just past 2^40 ns, so a manual clock moves the key's epoch in a few steps.
const FAILSAFE: &str = "2097151/ms burst 10";

/// Just past the failsafe quota's horizon (2^61 / (2^21 − 1) ns): the next check moves the
/// key's epoch, by the horizon. (Not much further: a check more than two horizons past the
/// epoch is decided at the horizon, not at its own time.)
const PAST_HORIZON: Duration = Duration::from_nanos((1 << 40) + (1 << 20));

/// A source whose fetches answer `answer` once it is set, and stay pending until then; the
/// limiter's tasks are held here and run only by [`Cold::run_fetches`].
#[derive(Clone, Default)]
struct Cold {
    answer: Arc<Mutex<Option<Quota>>>,
    tasks: Arc<Mutex<Vec<Task>>>,
}

/// The source of [`Cold`].
struct ColdSource(Arc<Mutex<Option<Quota>>>);

impl QuotaSource<String> for ColdSource {
    fn fetch(&self, _: &String) -> impl Future<Output = FetchResult> + Send + 'static {
        let answer = Arc::clone(&self.0);
        std::future::poll_fn(move |_| match *answer.lock().unwrap() {
            Some(quota) => Poll::Ready(Ok(Some(quota))),
            None => Poll::Pending,
        })
    }
}

impl Cold {
    fn source(&self) -> ColdSource {
        ColdSource(Arc::clone(&self.answer))
    }

    fn spawner(&self) -> impl Fn(Task) + Send + Sync + 'static + use<> {
        let tasks = Arc::clone(&self.tasks);
        move |task| tasks.lock().unwrap().push(task)
    }

    /// Answers every fetch in flight with `quota`.
    fn run_fetches(&self, quota: Quota) {
        *self.answer.lock().unwrap() = Some(quota);
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap());
        assert!(!tasks.is_empty(), "a fetch in flight");
        for mut task in tasks {
            let polled = task.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            assert!(polled.is_ready(), "the fetch answered");
        }
    }
}

type Limiter = KeyedLimiter<String, TokenBucket, ColdSource, ManualClock>;

/// A limiter whose keys stay on the failsafe quota under a pool of 10 an hour (refilling
/// slower than any step here can tell), until `cold` answers.
fn pooled(clock: &ManualClock, cold: &Cold) -> Limiter {
    KeyedLimiter::builder(TokenBucket, quota(FAILSAFE))
        .failsafe_pool(quota("10/h"))
        .clock(clock.clone())
        .source(cold.source())
        .spawner(cold.spawner())
        .build()
        .unwrap()
}

/// What the key has left and what the pool has in use.
fn standing(limiter: &Limiter, key: &str) -> (u64, u64) {
    let peek = KeyedLink::new(limiter, key).take(0).unwrap().0;
    (peek.remaining(), limiter.metrics().pool_used)
}

/// A take on a pooled key given back leaves the key and the pool as they were, on a fresh
/// entry and after each of several epoch moves (each counted in the entry's receipts' names).
#[test]
fn a_give_back_on_a_pooled_key_restores_the_key_and_the_pool() {
    let clock = ManualClock::new(0);
    let cold = Cold::default();
    let limiter = pooled(&clock, &cold);
    let link = KeyedLink::new(&limiter, "bob");
    assert_eq!(standing(&limiter, "bob"), (10, 0));
    for moves in 0..4 {
        let (taken, receipt) = link.take(3).unwrap();
        assert!(taken.is_allowed(), "after {moves} epoch moves: {taken:?}");
        assert_eq!(standing(&limiter, "bob"), (7, 3), "after {moves} epoch moves");
        link.give_back(receipt, 3);
        assert_eq!(
            standing(&limiter, "bob"),
            (10, 0),
            "after {moves} epoch moves: the give-back restores the key and the pool"
        );
        clock.advance(PAST_HORIZON);
        let _ = link.take(0); // moves the epoch
    }
}

/// The same through a chain whose second link denies: everything the pooled key took, from
/// its own state and from the pool, is given back.
#[test]
fn a_denied_chain_gives_back_a_pooled_key_after_an_epoch_move() {
    let clock = ManualClock::new(0);
    let cold = Cold::default();
    let limiter = pooled(&clock, &cold);
    for moves in 0..3 {
        let closed = RateLimiter::with_clock(TokenBucket, quota("1/h"), clock.clone()).unwrap();
        assert!(closed.check().is_allowed());
        for _ in 0..5 {
            let chain = check_chain(&[(&KeyedLink::new(&limiter, "bob"), 2), (&closed, 1)]).unwrap();
            assert_eq!(chain.denied_by(), Some(1), "after {moves} epoch moves");
        }
        assert_eq!(standing(&limiter, "bob"), (10, 0), "after {moves} epoch moves");
        clock.advance(PAST_HORIZON);
        let _ = limiter.check_n("bob", 0); // moves the epoch
    }
}

/// A receipt taken before an epoch move gives nothing back after it: the carried-over state
/// no longer tells that take apart (keeping it only under-admits), and the pool keeps it too.
#[test]
fn a_give_back_after_an_epoch_move_gives_nothing_back() {
    let clock = ManualClock::new(0);
    let cold = Cold::default();
    let limiter = pooled(&clock, &cold);
    let link = KeyedLink::new(&limiter, "bob");
    for moves in 0..3 {
        let (taken, receipt) = link.take(3).unwrap();
        assert!(taken.is_allowed());
        // The pool's 10/h cannot give back a unit in this step: 3 stay in use.
        let used = limiter.metrics().pool_used;
        clock.advance(PAST_HORIZON);
        let _ = link.take(0); // moves the epoch; the key's bucket has long refilled
        let after_move = standing(&limiter, "bob");
        link.give_back(receipt, 3);
        assert_eq!(standing(&limiter, "bob"), after_move, "after {moves} moves");
        assert!(limiter.metrics().pool_used <= used, "after {moves} moves");
    }
}

/// A pooled key whose state was replaced by a new quota (its fetch answering, or a requote)
/// gives nothing back for a take decided before: not to its new state, not to the pool. Also
/// after epoch moves before the take, which the receipt's name must count.
#[test]
fn a_give_back_after_the_pooled_key_got_its_quota_gives_nothing_back() {
    for moves in 0..3 {
        for by_fetch in [true, false] {
            let what = if by_fetch { "a fetch" } else { "a requote" };
            let clock = ManualClock::new(0);
            let cold = Cold::default();
            let limiter = pooled(&clock, &cold);
            let link = KeyedLink::new(&limiter, "bob");
            for _ in 0..moves {
                let _ = link.take(0);
                clock.advance(PAST_HORIZON);
            }
            let (taken, receipt) = link.take(4).unwrap();
            assert!(taken.is_allowed(), "{taken:?}");
            assert_eq!(
                standing(&limiter, "bob"),
                (6, 4),
                "after {moves} moves, {what}: {taken:?}"
            );
            // The same rate, a burst of 20: the 4 taken are carried exactly.
            let own = quota("2097151/ms burst 20");
            if by_fetch {
                cold.run_fetches(own);
            } else {
                assert_eq!(limiter.requote(|_| Some(own)), 1);
            }
            assert_eq!(limiter.quota_of("bob"), Some(own), "{what}");
            let (left, used) = standing(&limiter, "bob");
            assert_eq!((left, used), (16, 4), "{what} after {moves} moves");
            link.give_back(receipt, 4);
            assert_eq!(
                standing(&limiter, "bob"),
                (16, 4),
                "{what} after {moves} moves: a stale receipt gave something back"
            );
        }
    }
}
