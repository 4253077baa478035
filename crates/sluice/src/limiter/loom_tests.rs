//! The direct limiter's retire-and-publish protocol under loom: the limit pointer, the
//! replacement mutex and the GCRA word are loom's here (see `crate::sync`), so loom runs the
//! checks and the replacement in every interleaving (up to its preemption bound). Time stands
//! still on a `ManualClock`, so every difference between runs comes from the interleaving.

use loom::sync::Arc;
use loom::thread;

use super::RateLimiter;
use crate::sync::{lock, model};
use crate::{ManualClock, Quota, TokenBucket};

type Limiter = RateLimiter<TokenBucket, ManualClock>;

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
        assert_eq!(lock(&limiter.installed).len(), 2, "one change installs one limit");
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
        clock.set(limiter.current().last_valid + 1);
        let other = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check())
        };
        let here = limiter.check();
        let there = other.join().unwrap();
        assert!(here.is_allowed() && there.is_allowed());
        assert_eq!(limiter.check_n(0).unwrap().remaining(), 0);
        assert_eq!(lock(&limiter.installed).len(), 2, "the epoch moved once");
    });
}
