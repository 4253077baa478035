//! Rules reloaded over and over while checks race from several threads and time moves (the
//! engine's own monotonic clock, which the test reads too): one rule's quota lowered, raised,
//! the rule removed and added again, while another rule stays as it is. No check errs; every
//! answer names a quota its rule had in a generation in force while it was decided (no torn
//! generation); and no rule admits more than the quota change rule allows.
//!
//! The bound, for the token bucket (the engine's default): a counter's tokens are never fewer
//! than none and grow only by its refill at the rate in force, and by a reload that raises its
//! capacity: the rule (`Algorithm::carry_over`) keeps what was consumed, capped at the new
//! capacity and rounded up to whole units at another rate, so the tokens after a change are at
//! most those before plus the capacity's rise, if any. A removed rule's counter keeps the quota
//! it had (no check reaches it, and the reload leaves it), so "added again" is a change from
//! that quota. Each admission takes a token, so a counter admits at most its first capacity,
//! plus every rise, plus its refill. A reload puts the new quota on the counter at some time
//! between the reload's start and its end, so over that span the faster rate is counted.

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::Duration;

use sluice::{Clock, MonotonicClock, Quota};
use sluice_descriptors::RuleSet;
use sluice_service::{CheckRequest, Code, DescriptorRequest, Engine, EngineSettings};

/// The `user` rule's quota in the first generation.
const FIRST_USER: &str = "200/s";
/// Its quota in each generation of a cycle after it (`None`: the rule removed): lowered,
/// raised, removed, added again.
const USER_CYCLE: [Option<&str>; 4] = [Some("50/s"), Some("400/s"), None, Some("200/s")];
/// The `ip` rule's quota, in every generation.
const IP: &str = "300/s";
const RELOADS: usize = 200;
/// Between two reloads.
const PAUSE: Duration = Duration::from_millis(3);
const CHECKERS: usize = 3;

/// The `user` rule's quota in generation `g` (0 is the first), if it has the rule.
fn user_quota(g: usize) -> Option<&'static str> {
    if g == 0 {
        Some(FIRST_USER)
    } else {
        USER_CYCLE[(g - 1) % USER_CYCLE.len()]
    }
}

/// The quota the `user` counter holds once generation `g` is in force: the rule's, or while
/// the rule is removed, the one it had before.
fn user_counter_quota(g: usize) -> Quota {
    (0..=g)
        .rev()
        .find_map(user_quota)
        .expect("the first generation has the rule")
        .parse()
        .unwrap()
}

fn rules(g: usize) -> RuleSet {
    let mut text = String::from("domain: edge\ndescriptors:\n");
    if let Some(quota) = user_quota(g) {
        text += &format!("  - key: user\n    rate_limit: {{quota: {quota}}}\n");
    }
    text += &format!("  - key: ip\n    rate_limit: {{quota: {IP}}}\n");
    RuleSet::from_yaml(&text).unwrap()
}

fn request(key: &str, value: &str) -> CheckRequest {
    CheckRequest {
        domain: "edge".into(),
        descriptors: vec![DescriptorRequest {
            entries: vec![(key.into(), value.into())],
            ..Default::default()
        }],
        hits: None,
    }
}

/// Units a second: every quota here is per second.
fn per_second(quota: Quota) -> u128 {
    assert_eq!(quota.period(), Duration::from_secs(1), "{quota}");
    u128::from(quota.count())
}

/// The most a token bucket may admit from `start` to `end` when generation `g`'s quota is
/// `quota(g)`, generation `g ≥ 1` taking over somewhere within `reloads[g - 1]` (the
/// clock's readings before and after the reload), by the rule in the file's comment.
fn most_admitted(quota: impl Fn(usize) -> Quota, reloads: &[(u64, u64)], start: u64, end: u64) -> u64 {
    let mut units = u128::from(quota(0).capacity());
    // Units a second times nanoseconds.
    let mut refill: u128 = 0;
    // Generation `g` certainly holds from the end of its reload to the start of the next.
    let mut from = start;
    for (g, &(began, ended)) in reloads.iter().enumerate() {
        let (before, after) = (quota(g), quota(g + 1));
        refill += per_second(before) * u128::from(began - from);
        refill += per_second(before).max(per_second(after)) * u128::from(ended - began);
        units += u128::from(after.capacity().saturating_sub(before.capacity()));
        from = ended;
    }
    refill += per_second(quota(reloads.len())) * u128::from(end - from);
    u64::try_from(units + refill / 1_000_000_000).unwrap()
}

/// What the checkers saw.
#[derive(Default)]
struct Seen {
    user_admitted: u64,
    ip_admitted: u64,
    /// Checks decided while a reload ran (the generations in force were not one).
    across_a_reload: u64,
    /// The last generation in force at a check's start, for each generation.
    started_in: Vec<bool>,
    /// Answers no generation in force while they were decided could give.
    torn: Vec<String>,
}

/// What is wrong with an answer of `rule` decided on `quota` (`None`: no limit) while the
/// generations `in_force` were, if anything: a quota, or the lack of one, that none of them
/// gives the rule's counter.
fn torn(
    rule: &str,
    quota: Option<Quota>,
    in_force: RangeInclusive<usize>,
    user_quotas: &[Quota],
    ip: Quota,
) -> Option<String> {
    let whole = match (rule, quota) {
        ("user", Some(quota)) => in_force.clone().any(|g| user_quotas[g] == quota),
        ("user", None) => in_force.clone().any(|g| user_quota(g).is_none()),
        (_, quota) => quota == Some(ip),
    };
    let quota = quota.map_or("no limit".to_owned(), |q| q.to_string());
    (!whole).then(|| format!("{rule} decided on {quota} in generations {in_force:?}"))
}

#[test]
fn checks_racing_reloads_see_whole_generations_and_admit_no_more_than_the_carry_over_allows() {
    let clock = MonotonicClock;
    let engine = Engine::new(rules(0), EngineSettings::default()).unwrap();
    let user_quotas: Vec<Quota> = (0..=RELOADS).map(user_counter_quota).collect();
    let ip: Quota = IP.parse().unwrap();
    // The reload under way (`pending`) and the last one done: a check begun after reload
    // `done` ended and ended before reload `pending + 1` began was decided on generations
    // `done..=pending`.
    let pending = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(CHECKERS + 1);
    let seen = Mutex::new(Seen {
        started_in: vec![false; RELOADS + 1],
        ..Seen::default()
    });
    let mut reloads = Vec::with_capacity(RELOADS);
    let start = clock.now();
    thread::scope(|scope| {
        for t in 0..CHECKERS {
            let (engine, pending, done, stop, barrier, seen, user_quotas) =
                (&engine, &pending, &done, &stop, &barrier, &seen, &user_quotas);
            scope.spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
                let (user, by_ip) = (request("user", "alice"), request("ip", "10.0.0.1"));
                let mut mine = Seen {
                    started_in: vec![false; RELOADS + 1],
                    ..Seen::default()
                };
                barrier.wait();
                for i in (t..).step_by(CHECKERS) {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let asks_user = i % 2 == 0;
                    let lo = done.load(Ordering::SeqCst);
                    let verdict =
                        runtime.block_on(engine.check(if asks_user { &user } else { &by_ip }, false));
                    let hi = pending.load(Ordering::SeqCst);
                    let verdict = verdict.unwrap_or_else(|e| panic!("a check erred: {e}"));
                    mine.started_in[lo] = true;
                    mine.across_a_reload += u64::from(hi > lo);
                    let quota = verdict.statuses[0].limit.as_ref().map(|limit| limit.quota);
                    let rule = if asks_user { "user" } else { "ip" };
                    if let Some(torn) = torn(rule, quota, lo..=hi, user_quotas, ip)
                        && mine.torn.len() < 10
                    {
                        mine.torn.push(torn);
                    }
                    // Only what a rule counted: a removed rule's descriptor is not limited.
                    if verdict.overall == Code::Ok && quota.is_some() {
                        match rule {
                            "user" => mine.user_admitted += 1,
                            _ => mine.ip_admitted += 1,
                        }
                    }
                }
                let mut seen = seen.lock().unwrap();
                seen.user_admitted += mine.user_admitted;
                seen.ip_admitted += mine.ip_admitted;
                seen.across_a_reload += mine.across_a_reload;
                for (g, started) in mine.started_in.iter().enumerate() {
                    seen.started_in[g] |= started;
                }
                seen.torn.extend(mine.torn);
            });
        }
        barrier.wait();
        for g in 1..=RELOADS {
            thread::sleep(PAUSE);
            pending.store(g, Ordering::SeqCst);
            let began = clock.now();
            engine.reload(rules(g)).unwrap();
            reloads.push((began, clock.now()));
            done.store(g, Ordering::SeqCst);
        }
        thread::sleep(PAUSE);
        stop.store(true, Ordering::SeqCst);
    });
    let end = clock.now();
    let seen = seen.into_inner().unwrap();

    assert!(
        seen.torn.is_empty(),
        "answers from no generation in force: {:#?}",
        seen.torn
    );
    // The checks ran through the reloads: they began in most generations (each in force for
    // 3 ms or more), and some were decided while a reload ran.
    let generations = seen.started_in.iter().filter(|s| **s).count();
    assert!(
        generations >= RELOADS / 2 && seen.across_a_reload > 0,
        "checks began in {generations} of {} generations, {} while a reload ran",
        RELOADS + 1,
        seen.across_a_reload
    );
    let most_user = most_admitted(|g| user_quotas[g], &reloads, start, end);
    let most_ip = most_admitted(|_| ip, &reloads, start, end);
    assert!(
        seen.user_admitted <= most_user,
        "user admitted {}, at most {most_user} allowed",
        seen.user_admitted
    );
    assert!(
        seen.ip_admitted <= most_ip,
        "ip admitted {}, at most {most_ip} allowed",
        seen.ip_admitted
    );
}
