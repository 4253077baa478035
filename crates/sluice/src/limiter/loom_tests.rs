//! The direct limiter's retire-and-publish protocol under loom: the limit pointer, the
//! replacement mutex and the GCRA word are loom's here (see `crate::sync`), so loom runs the
//! checks and the replacement in every interleaving (up to its preemption bound). Time stands
//! still on a `ManualClock`, so every difference between runs comes from the interleaving.

use loom::sync::Arc;
use loom::thread;

use super::{RateLimiter, reclaim};
use crate::sync::{model, model_failure};
use crate::{ManualClock, Quota, TokenBucket};

type Limiter = RateLimiter<TokenBucket, ManualClock>;

std::thread_local! {
    /// Makes replacements free every retired limit, named in a slot or not: the broken
    /// reclamation that `loom_catches_a_limit_freed_under_a_check` must catch. (Std's, set
    /// outside the model: loom runs a model's threads on the test's own thread, and the other
    /// tests, on theirs, do not see it.)
    pub(super) static IGNORE_HAZARDS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn quota(text: &str) -> Quota {
    text.parse().expect("a valid quota")
}

/// A checker thread checks twice while the main thread checks, changes the quota to
/// `new_quota` (a capacity of `new_capacity`) and checks again: four checks against a capacity
/// of 2, and the checker's may land on the state being retired. Each decision names the quota
/// it was decided under (its limit), and the admissions must follow the rule of a change: what
/// the old quota admitted stays consumed, capped at the new capacity, and the new quota admits
/// only what is left. The final peek shows every admission counted exactly once.
///
/// (One checker thread, not two beside a third that changes the quota: two threads that both
/// spin on a third, as checks do on a state being retired, can make loom's scheduler alternate
/// between them forever.)
fn checks_racing_a_quota_change(new_quota: &'static str, new_capacity: u64) {
    model(move || {
        let limiter = Arc::new(Limiter::with_clock(TokenBucket, quota("2/s"), ManualClock::new(0)).unwrap());
        let checker = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || [limiter.check(), limiter.check()])
        };
        let before = limiter.check();
        limiter.set_quota(quota(new_quota)).unwrap();
        let after = limiter.check();
        let mut decisions = vec![before, after];
        decisions.extend(checker.join().unwrap());

        assert_eq!(
            before.limit(),
            2,
            "a check before the change was decided under the new quota"
        );
        assert_eq!(
            after.limit(),
            new_capacity,
            "a check after the change was decided under the old quota"
        );
        assert!(
            decisions
                .iter()
                .all(|d| d.limit() == 2 || d.limit() == new_capacity),
            "a check decided under neither quota: {decisions:?}"
        );
        let admitted_under = |limit| {
            decisions
                .iter()
                .filter(|d| d.is_allowed() && d.limit() == limit)
                .count() as u64
        };
        let old = admitted_under(2);
        let carried = old.min(new_capacity);
        let new = admitted_under(new_capacity);
        assert!(old <= 2, "the old quota admitted {old} of 2");
        assert!(
            carried + new <= new_capacity,
            "{old} admitted before the change, {new} after it, under a capacity of {new_capacity}"
        );
        // Nothing lost, nothing counted twice: what remains is the capacity less exactly
        // what was carried over and admitted since.
        let peek = limiter.check_n(0).unwrap();
        assert_eq!(peek.limit(), new_capacity);
        assert_eq!(peek.remaining(), new_capacity - carried - new, "{decisions:?}");
        assert_eq!(limiter.installed(), 2, "one change installs one limit");
    });
}

/// Lowering the capacity to 1: admissions under the old quota use up the new one.
#[test]
fn loom_checks_racing_a_lower_quota_admit_what_the_rule_allows() {
    checks_racing_a_quota_change("1/s", 1);
}

/// Raising the capacity to 3: the old quota's admissions stay consumed under the new one.
#[test]
fn loom_checks_racing_a_higher_quota_admit_what_the_rule_allows() {
    checks_racing_a_quota_change("3/s", 3);
}

/// Two checks that both find the limit past its horizon both try to move the epoch: exactly
/// one replacement happens, the other thread finds it done and checks on the successor, and
/// neither check is lost (the bucket, long refilled, admits both and shows both taken).
#[test]
fn loom_an_epoch_move_raced_by_two_checks_happens_once() {
    model(|| {
        let clock = ManualClock::new(0);
        let limiter = Arc::new(Limiter::with_clock(TokenBucket, quota("2/s"), clock.clone()).unwrap());
        assert!(limiter.check().is_allowed());
        let last_valid = limiter.load(&mut reclaim::pin()).last_valid;
        clock.set(last_valid + 1);
        let other = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check())
        };
        let here = limiter.check();
        let there = other.join().unwrap();
        assert!(here.is_allowed() && there.is_allowed());
        assert_eq!(limiter.check_n(0).unwrap().remaining(), 0);
        assert_eq!(limiter.installed(), 2, "the epoch moved once");
        // The thread that moved it was in a check: the limit it retired waits for a later
        // replacement, by a thread in none, which frees it (no check is left).
        limiter.set_quota(quota("2/s")).unwrap();
        assert_eq!(limiter.held(), 1, "every retired limit freed");
    });
}

/// A checker thread takes and gives back while the main thread changes the quota twice, and
/// every replacement tries to free what was retired (see `RECLAIM_AT`): a retired limit is
/// freed only once no check may still read it (a read of a freed limit, or one not ordered
/// before the freeing, fails the model), and once the checker is done every retired limit
/// is freed.
#[test]
fn loom_retired_limits_are_freed_after_the_checks_reading_them() {
    model(|| {
        let limiter = Arc::new(Limiter::with_clock(TokenBucket, quota("2/s"), ManualClock::new(0)).unwrap());
        let checker = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                let (decision, receipt) = limiter.take_n(1).unwrap();
                limiter.refund_n(receipt, 1);
                [decision, limiter.check()]
            })
        };
        limiter.set_quota(quota("3/s")).unwrap();
        limiter.set_quota(quota("4/s")).unwrap();
        let decisions = checker.join().unwrap();
        assert!(
            decisions.iter().all(|d| [2, 3, 4].contains(&d.limit())),
            "{decisions:?}"
        );
        // With the checker gone, a replacement frees every limit retired before it.
        limiter.set_quota(quota("5/s")).unwrap();
        assert_eq!(limiter.held(), 1, "every retired limit freed");
        assert_eq!(limiter.installed(), 4);
    });
}

/// The model has teeth: freeing retired limits without reading the slots lets a check read a
/// freed limit, and the model reports it. (Two changes: the first limit, held inline, is never
/// freed; the second is, under a check that reads it.)
#[test]
fn loom_catches_a_limit_freed_under_a_check() {
    IGNORE_HAZARDS.set(true);
    let failure = model_failure(|| {
        let limiter = Arc::new(Limiter::with_clock(TokenBucket, quota("2/s"), ManualClock::new(0)).unwrap());
        let checker = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check())
        };
        limiter.set_quota(quota("3/s")).unwrap();
        limiter.set_quota(quota("4/s")).unwrap();
        let _ = checker.join().unwrap();
    });
    IGNORE_HAZARDS.set(false);
    assert!(
        failure.contains("Causality violation") || failure.contains("a check read a freed limit"),
        "{failure}"
    );
}
