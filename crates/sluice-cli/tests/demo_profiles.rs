//! `sluice loadtest --profiles demo` against `sluice serve`'s built-in config: the two halves
//! of the demo, kept in agreement.

use sluice::Quota;
use sluice_config::{DEFAULT_CONFIG, parse};
use sluice_loadtest::{Account, Expected, ProfileSet};

/// `sluice loadtest --profiles demo` expects of each profile what the built-in config grants
/// it: the accounts' quotas, and for a new account per request the failsafe pool.
#[test]
fn the_demo_profiles_expect_what_the_demo_grants() {
    let s = parse(DEFAULT_CONFIG).unwrap();
    let rate = |q: Quota| q.count() as f64 / q.period().as_secs_f64();
    for profile in ProfileSet::demo().profiles {
        let granted = match &profile.account {
            Account::Fixed(key) if s.bypass.contains(key) => Expected::Unlimited,
            Account::Fixed(key) => Expected::Rate(s.accounts.get(key).map_or(0.0, |q| rate(*q))),
            Account::None => Expected::Rate(rate(s.accounts[&s.default_key])),
            Account::Unique { .. } => Expected::Rate(rate(s.limiter.failsafe_pool.unwrap())),
        };
        assert_eq!(profile.expected, granted, "{}", profile.name);
    }
}
