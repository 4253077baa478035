//! The steady window of a trial and the verdict on it.
//!
//! The start of every trial is kept apart as its **cold start**: the first `--settle` of it, and
//! on to the profile's first denial after that (its burst may take a while to use up). What
//! was allowed then (the burst, admissions under the failsafe quota while the account's quota
//! was being fetched) is reported in its own column. The **steady** window runs from there to
//! the profile's last denial (see `SteadyWindow`); its allow rate is what is compared with the
//! expected rate. What was allowed after the last denial is the **tail**.

use std::fmt;
use std::time::Duration;

use crate::generator::ProfileTrial;
use crate::profile::Expected;

/// How a profile's steady allow rate compares with the rate it should get.
///
/// # Example
/// ```
/// assert_eq!(sluice_loadtest::Grade::NotSaturated.to_string(), "NOT SATURATED");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Grade {
    /// Within 1% or 1 request of the expected count.
    Pass,
    /// An unlimited profile (control, bypass) that was never denied.
    Unlimited,
    /// Nothing was denied after the cold start, so the limit was never reached (the offered
    /// load was below the quota, or a burst was not used up yet) and the rate was not tested.
    NotSaturated,
    /// Off by more than 1% and 1 request, or an unlimited profile that was denied.
    Fail,
}

impl fmt::Display for Grade {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Grade::Pass => "PASS",
            Grade::Unlimited => "UNLIMITED",
            Grade::NotSaturated => "NOT SATURATED",
            Grade::Fail => "FAIL",
        })
    }
}

/// The part of a trial whose allowed count measures the limit's rate.
///
/// When the profile was denied after the settling time, the window runs from the bucket after
/// its first such denial to the bucket of its last denial: at both ends the profile's allowance
/// was used up, so what was allowed in between is what the quota granted in that time, whatever
/// burst or failsafe quota came before, and however unevenly the load arrived meanwhile. With
/// no denial after the settling time, the limit was not reached: the window runs from the
/// settling time to the trial's end and only shows the load, unless the profile offered more
/// than its quota (`offered`) and was never refused: its excess waited at the server, and that
/// window measures the rate it was served at. Both ends are bucket boundaries, so the counts
/// are exact.
pub(super) struct SteadyWindow {
    pub buckets: std::ops::Range<usize>,
    pub start: Duration,
    pub end: Duration,
    pub saturated: bool,
}

impl SteadyWindow {
    pub fn of(counts: &ProfileTrial, settle: Duration, offered_over_quota: bool) -> Self {
        let at =
            |bucket: usize| (counts.bucket * u32::try_from(bucket).unwrap_or(u32::MAX)).min(counts.length);
        let settle_bucket =
            usize::try_from(settle.as_nanos().div_ceil(counts.bucket.as_nanos())).unwrap_or(usize::MAX);
        let denied_after_settle =
            |(i, denied): (usize, &u64)| (i >= settle_bucket && *denied > 0).then_some(i);
        let first = counts
            .denied_by_bucket
            .iter()
            .enumerate()
            .find_map(denied_after_settle);
        let last = counts
            .denied_by_bucket
            .iter()
            .enumerate()
            .rev()
            .find_map(denied_after_settle);
        match (first, last) {
            (Some(first), Some(last)) => {
                let buckets = first + 1..last.max(first + 1);
                SteadyWindow {
                    start: at(buckets.start),
                    end: at(buckets.end),
                    buckets,
                    saturated: true,
                }
            }
            _ => SteadyWindow {
                buckets: settle_bucket..counts.allowed_by_bucket.len(),
                start: at(settle_bucket),
                end: counts.length,
                saturated: offered_over_quota && counts.denied == 0,
            },
        }
    }
}

/// The error in percent and the verdict of a steady window.
///
/// The count allowed must be within 1% of `rate × seconds`, or within 1 request of the whole
/// counts next to it (`floor − 1 ..= ceil + 1`): a window's ends cut the quota's admissions at
/// arbitrary instants, so a token bucket may grant one more or one fewer than the count its
/// rate gives the window.
pub(super) fn judge(
    expected: Expected,
    allowed: u64,
    saturated: bool,
    secs: f64,
    denied: u64,
) -> (Option<f64>, Grade) {
    let Expected::Rate(rate) = expected else {
        return (
            None,
            if denied == 0 {
                Grade::Unlimited
            } else {
                Grade::Fail
            },
        );
    };
    let expected_count = rate * secs;
    let diff = allowed as f64 - expected_count;
    let error = if rate > 0.0 && secs > 0.0 {
        Some((allowed as f64 / secs - rate) / rate * 100.0)
    } else if allowed == 0 {
        Some(0.0)
    } else {
        None
    };
    let verdict = if !saturated || secs <= 0.0 {
        Grade::NotSaturated
    } else if diff.abs() <= expected_count * 0.01
        || (expected_count.floor() - 1.0..=expected_count.ceil() + 1.0).contains(&(allowed as f64))
    {
        Grade::Pass
    } else {
        Grade::Fail
    };
    (error, verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judges_within_one_percent_or_one_request() {
        // 1/s over 9 s: 8, 9, 10 pass; 11 fails; 5 without denials was never saturated.
        for allowed in [8, 9, 10] {
            assert_eq!(judge(Expected::Rate(1.0), allowed, true, 9.0, 5).1, Grade::Pass);
        }
        assert_eq!(judge(Expected::Rate(1.0), 11, true, 9.0, 5).1, Grade::Fail);
        assert_eq!(
            judge(Expected::Rate(1.0), 5, false, 9.0, 0).1,
            Grade::NotSaturated
        );
        // Above the rate but never denied: a burst still being used, not a measured rate.
        assert_eq!(
            judge(Expected::Rate(1.0), 15, false, 9.0, 4).1,
            Grade::NotSaturated
        );
        assert_eq!(judge(Expected::Rate(1.0), 5, true, 9.0, 3).1, Grade::Fail);
        // 10/s over 1.499 s (14.99): 13 to 16 pass.
        assert_eq!(judge(Expected::Rate(10.0), 16, true, 1.499, 5).1, Grade::Pass);
        assert_eq!(judge(Expected::Rate(10.0), 13, true, 1.499, 5).1, Grade::Pass);
        assert_eq!(judge(Expected::Rate(10.0), 17, true, 1.499, 5).1, Grade::Fail);
        assert_eq!(judge(Expected::Rate(10.0), 12, true, 1.499, 5).1, Grade::Fail);
        // 1000/s over 10 s: ±100 passes.
        assert_eq!(
            judge(Expected::Rate(1000.0), 10_100, true, 10.0, 1).1,
            Grade::Pass
        );
        assert_eq!(
            judge(Expected::Rate(1000.0), 10_101, true, 10.0, 1).1,
            Grade::Fail
        );
        // Unlimited: never denied, or it failed.
        assert_eq!(judge(Expected::Unlimited, 100, false, 9.0, 0).1, Grade::Unlimited);
        assert_eq!(judge(Expected::Unlimited, 100, true, 9.0, 1).1, Grade::Fail);
        // Quota 0: the error is 0% when nothing was allowed.
        assert_eq!(
            judge(Expected::Rate(0.0), 0, true, 9.0, 9),
            (Some(0.0), Grade::Pass)
        );
        assert_eq!(judge(Expected::Rate(0.0), 2, true, 9.0, 9), (None, Grade::Fail));
    }
}
