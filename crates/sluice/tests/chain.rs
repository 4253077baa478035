//! Chains: all-or-nothing admission over several links, under 8 threads on a frozen clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use sluice::{
    ChainError, CheckError, FixedWindow, FnSource, KeyedLimiter, KeyedLink, LeakyBucket, Link, ManualClock,
    Quota, RateLimiter, SlidingWindowCounter, SlidingWindowLog, TokenBucket, check_chain,
};

const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];

/// Eight threads send chains of three shapes over five direct links and a keyed one. With the
/// clock frozen nothing refills, so each link's remaining capacity at the end must be exactly
/// its capacity minus the costs of the chains admitted: no link admits more than its limit and
/// no denied chain leaves anything consumed anywhere.
#[test]
fn chains_are_all_or_nothing_under_eight_threads() {
    for round in 0..6u64 {
        let clock = ManualClock::new(round * 1_000_000_007);
        let l0 =
            RateLimiter::with_clock(TokenBucket, "1000/s burst 300".parse().unwrap(), clock.clone()).unwrap();
        let l1 = RateLimiter::with_clock(FixedWindow, "200/h".parse().unwrap(), clock.clone()).unwrap();
        let l3 =
            RateLimiter::with_clock(SlidingWindowCounter, "150/min".parse().unwrap(), clock.clone()).unwrap();
        let l4 = RateLimiter::with_clock(
            LeakyBucket::meter(),
            "100/s burst 250".parse().unwrap(),
            clock.clone(),
        )
        .unwrap();
        let keyed = KeyedLimiter::<String, _>::builder(SlidingWindowLog, "60/s".parse().unwrap())
            .unknown_key_quota("60/s".parse().unwrap())
            .clock(clock.clone())
            .build()
            .unwrap();
        let admitted: [AtomicU64; 4] = Default::default(); // l0, l1, l3, l4
        let admitted_key: [AtomicU64; 4] = Default::default();
        let denied = AtomicU64::new(0);
        thread::scope(|s| {
            for t in 0..8u64 {
                let (l0, l1, l3, l4, keyed) = (&l0, &l1, &l3, &l4, &keyed);
                let (admitted, admitted_key, denied) = (&admitted, &admitted_key, &denied);
                s.spawn(move || {
                    for i in 0..400u64 {
                        let k = ((t + i + round) % 4) as usize;
                        let key = KeyedLink::new(keyed, KEYS[k]);
                        let c0 = 1 + (i + t) % 2;
                        let c4 = 1 + (i * 7 + t + round) % 3;
                        // (links, costs, which counters the costs go to)
                        let (result, counted): (_, Vec<(usize, u64)>) = match (i + t) % 3 {
                            0 => (
                                check_chain(&[(l0, c0), (&key, 5), (l1, 1)]),
                                vec![(0, c0), (4, 5), (1, 1)],
                            ),
                            1 => (
                                check_chain(&[(l3, 3), (l0, c0), (l4, c4)]),
                                vec![(2, 3), (0, c0), (3, c4)],
                            ),
                            _ => (
                                check_chain(&[(l4, c4), (l1, 1), (l3, 3), (&key, 5)]),
                                vec![(3, c4), (1, 1), (2, 3), (4, 5)],
                            ),
                        };
                        let decision = result.unwrap();
                        if decision.is_allowed() {
                            for (counter, cost) in counted {
                                let target = if counter == 4 {
                                    &admitted_key[k]
                                } else {
                                    &admitted[counter]
                                };
                                target.fetch_add(cost, Ordering::Relaxed);
                            }
                        } else {
                            assert!(decision.retry_after() > Duration::ZERO);
                            denied.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let check = |name: &str, remaining: u64, capacity: u64, admitted: &AtomicU64| {
            let admitted = admitted.load(Ordering::Relaxed);
            assert!(
                admitted <= capacity,
                "round {round}: {name} admitted {admitted} > {capacity}"
            );
            assert_eq!(remaining, capacity - admitted, "round {round}: {name} leaked");
        };
        check("l0", l0.check_n(0).unwrap().remaining(), 300, &admitted[0]);
        check("l1", l1.check_n(0).unwrap().remaining(), 200, &admitted[1]);
        check("l3", l3.check_n(0).unwrap().remaining(), 150, &admitted[2]);
        check("l4", l4.check_n(0).unwrap().remaining(), 250, &admitted[3]);
        for (k, key) in KEYS.iter().enumerate() {
            let remaining = keyed.check_n(*key, 0).unwrap().remaining();
            check(key, remaining, 60, &admitted_key[k]);
        }
        // Every link was driven to its limit, so denials were plentiful.
        assert!(denied.load(Ordering::Relaxed) > 1000, "round {round}");
    }
}

#[test]
fn a_denial_names_the_first_denying_link_and_the_latest_retry_after() {
    let clock = ManualClock::new(0);
    let per_second = RateLimiter::with_clock(TokenBucket, "1/s".parse().unwrap(), clock.clone()).unwrap();
    let per_minute = RateLimiter::with_clock(FixedWindow, "1/min".parse().unwrap(), clock.clone()).unwrap();
    let roomy = RateLimiter::with_clock(TokenBucket, "100/s".parse().unwrap(), clock.clone()).unwrap();
    let links: [(&dyn Link, u64); 3] = [(&roomy, 10), (&per_second, 1), (&per_minute, 1)];
    assert!(check_chain(&links).unwrap().is_allowed());
    let denied = check_chain(&links).unwrap();
    assert!(!denied.is_allowed());
    assert_eq!(denied.denied_by(), Some(1));
    assert_eq!(denied.decision().retry_after(), Duration::from_secs(1));
    assert_eq!(denied.retry_after(), Duration::from_secs(60));
    assert_eq!(roomy.check_n(0).unwrap().remaining(), 90);
    // After a second only the per-minute link denies.
    clock.advance(Duration::from_secs(1));
    let denied = check_chain(&links).unwrap();
    assert_eq!(denied.denied_by(), Some(2));
    assert_eq!(denied.retry_after(), Duration::from_secs(59));
    assert_eq!(per_second.check_n(0).unwrap().remaining(), 1);
    assert!(roomy.check_n(0).unwrap().remaining() >= 90);
}

#[test]
fn an_allowed_chain_reports_its_tightest_link() {
    let clock = ManualClock::new(0);
    let a = RateLimiter::with_clock(TokenBucket, "10/s".parse().unwrap(), clock.clone()).unwrap();
    let b = RateLimiter::with_clock(SlidingWindowLog, "3/s".parse().unwrap(), clock.clone()).unwrap();
    let decision = check_chain(&[(&a, 1), (&b, 1)]).unwrap();
    assert!(decision.is_allowed());
    assert_eq!(decision.retry_after(), Duration::ZERO);
    assert_eq!(decision.decision().remaining(), 2);
}

#[test]
fn a_cost_no_link_can_hold_is_an_error_and_consumes_nothing() {
    let clock = ManualClock::new(0);
    let a = RateLimiter::with_clock(TokenBucket, "10/s".parse().unwrap(), clock.clone()).unwrap();
    let b = RateLimiter::with_clock(FixedWindow, "3/s".parse().unwrap(), clock.clone()).unwrap();
    assert_eq!(
        check_chain(&[(&a, 4), (&b, 4)]),
        Err(ChainError {
            link: 1,
            error: CheckError::CostExceedsCapacity { cost: 4, capacity: 3 }
        })
    );
    assert_eq!(a.check_n(0).unwrap().remaining(), 10);
}

#[test]
fn a_give_back_after_a_quota_change_gives_nothing_back() {
    let clock = ManualClock::new(0);
    let a = RateLimiter::with_clock(TokenBucket, "10/s".parse().unwrap(), clock.clone()).unwrap();
    let (_, receipt) = a.take(4).unwrap();
    a.set_quota("20/s".parse().unwrap()).unwrap();
    a.give_back(receipt, 4);
    // The 4 stay consumed under the new quota: a refund never over-admits.
    assert_eq!(a.check_n(0).unwrap().remaining(), 16);
}

/// The same on a keyed link, whose quota changes when the take's own check refreshes it: the
/// give-back gives nothing back, for every algorithm, also those whose carry-over keeps the
/// entry's epoch (the window algorithms keep their grid).
#[test]
fn a_keyed_give_back_after_a_quota_change_gives_nothing_back() {
    fn drive<A: sluice::Algorithm>(algorithm: A) {
        let name = algorithm.name();
        let quota = Arc::new(Mutex::new("10/s".parse::<Quota>().unwrap()));
        let source = {
            let quota = Arc::clone(&quota);
            FnSource(move |_: &String| std::future::ready(Ok(Some(*quota.lock().unwrap()))))
        };
        let clock = ManualClock::new(0);
        let limiter = KeyedLimiter::builder(algorithm, "1/s".parse().unwrap())
            .source(source)
            .refresh_every(Duration::from_secs(1))
            .clock(clock.clone())
            .build()
            .unwrap();
        let link = KeyedLink::new(&limiter, "a");
        assert_eq!(link.take(0).unwrap().0.remaining(), 10);
        clock.advance(Duration::from_millis(1_200));
        // Same window length (1 s), capacity 2: the 4 taken are carried, capped at 2.
        *quota.lock().unwrap() = "2/s".parse().unwrap();
        let (taken, receipt) = link.take(4).unwrap();
        assert!(taken.is_allowed(), "{name}: {taken:?}");
        assert_eq!(limiter.quota_of("a").map(|q| q.capacity()), Some(2), "{name}");
        link.give_back(receipt, 4);
        let peek = link.take(0).unwrap().0;
        assert_eq!(peek.remaining(), 0, "{name}: {peek:?}");
    }
    drive(TokenBucket);
    drive(LeakyBucket::meter());
    drive(FixedWindow);
    drive(SlidingWindowLog);
    drive(SlidingWindowCounter);
}

#[test]
fn a_keyed_link_refreshes_its_quota_as_a_check_does() {
    let clock = ManualClock::new(0);
    let quotas = sluice::StaticQuotas::from_iter([("a".to_string(), "5/s".parse().unwrap())]);
    let limiter = KeyedLimiter::builder(TokenBucket, "1/s".parse().unwrap())
        .source(quotas)
        .refresh_every(Duration::from_secs(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    let link = KeyedLink::new(&limiter, "a");
    assert_eq!(link.take(1).unwrap().0.remaining(), 4);
    let fetched = limiter.metrics().fetches;
    clock.advance(Duration::from_secs(2));
    let _ = link.take(1).unwrap();
    assert_eq!(limiter.metrics().fetches, fetched + 1);
}

mod model {
    use proptest::prelude::*;
    use sluice::{
        Algorithm, Decision, FixedWindow, LeakyBucket, Link, ManualClock, RateLimiter, SlidingWindowCounter,
        SlidingWindowLog, TokenBucket, check_chain,
    };

    /// Each link twice: the one the chains use, and a shadow that receives only the costs of
    /// admitted chains. Peeks compare all decision fields.
    struct Pair<A: Algorithm> {
        link: RateLimiter<A, ManualClock>,
        shadow: RateLimiter<A, ManualClock>,
    }

    impl<A: Algorithm + Copy> Pair<A> {
        fn new(algorithm: A, quota: &str, clock: &ManualClock) -> Self {
            let make = || RateLimiter::with_clock(algorithm, quota.parse().unwrap(), clock.clone()).unwrap();
            Self {
                link: make(),
                shadow: make(),
            }
        }
    }

    trait Shadowed {
        fn link(&self) -> &dyn Link;
        fn peeks(&self) -> (Decision, Decision);
        fn admit_shadow(&self, cost: u64) -> bool;
    }

    impl<A: Algorithm> Shadowed for Pair<A> {
        fn link(&self) -> &dyn Link {
            &self.link
        }
        fn peeks(&self) -> (Decision, Decision) {
            (self.link.check_n(0).unwrap(), self.shadow.check_n(0).unwrap())
        }
        fn admit_shadow(&self, cost: u64) -> bool {
            self.shadow.check_n(cost).unwrap().is_allowed()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// A chain is admitted exactly when every link has room for its cost, and then takes
        /// exactly those costs; a denied chain leaves every link as it was.
        #[test]
        fn chains_match_independent_links_that_see_only_admitted_chains(
            ops in prop::collection::vec((0u64..400_000_000, prop::collection::vec(0u64..=6, 5), 1usize..=5), 1..80)
        ) {
            let clock = ManualClock::new(0);
            let links: Vec<Box<dyn Shadowed>> = vec![
                Box::new(Pair::new(TokenBucket, "5/s burst 8", &clock)),
                Box::new(Pair::new(FixedWindow, "10/s", &clock)),
                Box::new(Pair::new(SlidingWindowLog, "7/s", &clock)),
                Box::new(Pair::new(SlidingWindowCounter, "9/s", &clock)),
                Box::new(Pair::new(LeakyBucket::meter(), "3/s burst 6", &clock)),
            ];
            for (advance, costs, len) in ops {
                clock.advance_nanos(advance);
                // A chain over the first `len` links, rotated by the clock so orders vary.
                let start = (advance % 5) as usize;
                let chosen: Vec<usize> = (0..len).map(|i| (start + i) % 5).collect();
                let chain: Vec<(&dyn Link, u64)> = chosen.iter().map(|&i| (links[i].link(), costs[i])).collect();
                let room: Vec<bool> = chosen.iter().map(|&i| costs[i] <= links[i].peeks().1.remaining()).collect();
                let decision = check_chain(&chain).unwrap();
                prop_assert_eq!(decision.is_allowed(), room.iter().all(|&r| r));
                prop_assert_eq!(decision.denied_by(), room.iter().position(|&r| !r));
                if decision.is_allowed() {
                    for &i in &chosen {
                        prop_assert!(links[i].admit_shadow(costs[i]));
                    }
                }
                for (i, link) in links.iter().enumerate() {
                    let (real, shadow) = link.peeks();
                    prop_assert_eq!(real, shadow, "link {}", i);
                }
            }
        }
    }
}
