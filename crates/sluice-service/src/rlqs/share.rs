//! Max-min fair shares of one limit among the clients of a bucket.
//!
//! Each client asks for its demand (requests per second, as its reports measure it). When the
//! demands add up to more than the limit, the limit is water-filled: a client asking less than
//! an equal share of what is left gets what it asks, and what remains is split equally among
//! the others, so no client can gain without one that has no more taking less.
//!
//! When the demands add up to less than the limit, every client gets its demand and the
//! leftover is split **equally** among all of them (not in proportion to demand): a client
//! whose demand is growing, or that had none when it last reported, then finds room at once
//! instead of waiting a report interval for a share of zero. Either way the shares add up to
//! the limit, so the data planes together admit up to the limit and no more.

/// Splits `limit` (requests per second) among clients asking for `demands`, max-min fair; the
/// shares are in the order of the demands and add up to `limit` (within rounding) when there
/// is at least one client.
///
/// A demand that is negative or not a number counts as 0; an infinite one asks for all it can
/// get. A limit that is not a positive number gives every client 0.
///
/// # Example
/// ```
/// use sluice_service::rlqs::fair_shares;
/// // 1000/s among clients asking 150, 300 and 1050: the first two get what they ask.
/// assert_eq!(fair_shares(1000.0, &[150.0, 300.0, 1050.0]), [150.0, 300.0, 550.0]);
/// // Asking 100 in all of 400: each gets its demand and a third of the 300 left.
/// assert_eq!(fair_shares(400.0, &[10.0, 40.0, 50.0]), [110.0, 140.0, 150.0]);
/// ```
pub fn fair_shares(limit: f64, demands: &[f64]) -> Vec<f64> {
    let n = demands.len();
    let mut shares = vec![0.0; n];
    if n == 0 || !(limit.is_finite() && limit > 0.0) {
        return shares;
    }
    let demand = |i: usize| demands.get(i).copied().filter(|d| *d >= 0.0).unwrap_or(0.0);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| demand(a).total_cmp(&demand(b)));
    let mut remaining = limit;
    for (k, &i) in order.iter().enumerate() {
        // What is left, split equally among the clients not served yet.
        let equal = remaining / (n - k) as f64;
        if demand(i) <= equal {
            shares[i] = demand(i);
            remaining -= demand(i);
        } else {
            // This client and every one after it ask for more: each gets the equal share.
            for &j in &order[k..] {
                shares[j] = equal;
            }
            remaining = 0.0;
            break;
        }
    }
    if remaining > 0.0 {
        let extra = remaining / n as f64;
        for share in &mut shares {
            *share += extra;
        }
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::fair_shares;
    use proptest::prelude::*;

    /// The reference: water poured in small steps. Round after round, every client still below
    /// its demand takes a step (or what it still lacks, or what is left), until the limit is
    /// gone or every demand is met; what remains is then split equally. Off from the exact
    /// shares by at most a step each.
    fn poured(limit: f64, demands: &[f64], step: f64) -> Vec<f64> {
        let mut shares = vec![0.0; demands.len()];
        let mut left = limit;
        loop {
            let mut poured = false;
            for (share, demand) in shares.iter_mut().zip(demands) {
                let take = step.min(demand - *share).min(left);
                if take > 0.0 {
                    *share += take;
                    left -= take;
                    poured = true;
                }
            }
            if !poured || left <= 0.0 {
                break;
            }
        }
        if left > 0.0 && !shares.is_empty() {
            let extra = left / shares.len() as f64;
            shares.iter_mut().for_each(|share| *share += extra);
        }
        shares
    }

    fn demands() -> impl Strategy<Value = Vec<f64>> {
        prop::collection::vec(prop_oneof![Just(0.0), 0.0..2000.0f64, Just(1000.0)], 1..8)
    }

    fn close(a: f64, b: f64, within: f64) -> bool {
        (a - b).abs() <= within
    }

    #[test]
    fn the_examples() {
        assert_eq!(fair_shares(1000.0, &[]), Vec::<f64>::new());
        assert_eq!(fair_shares(0.0, &[5.0, 6.0]), [0.0, 0.0]);
        assert_eq!(fair_shares(f64::NAN, &[5.0]), [0.0]);
        assert_eq!(
            fair_shares(90.0, &[f64::INFINITY, 30.0, f64::NAN]),
            [60.0, 30.0, 0.0]
        );
        assert_eq!(fair_shares(1000.0, &[600.0, 1050.0]), [500.0, 500.0]);
        assert_eq!(fair_shares(1000.0, &[0.0, 0.0]), [500.0, 500.0]);
        assert_eq!(fair_shares(1000.0, &[300.0, 1050.0]), [300.0, 700.0]);
    }

    proptest! {
        #[test]
        fn matches_the_poured_reference(limit in 1.0..3000.0f64, demands in demands()) {
            let most = demands.iter().copied().fold(limit, f64::max);
            let step = most / 20_000.0;
            let exact = fair_shares(limit, &demands);
            let reference = poured(limit, &demands, step);
            for (a, b) in exact.iter().zip(&reference) {
                prop_assert!(close(*a, *b, 2.0 * step), "{exact:?} against {reference:?}");
            }
        }

        #[test]
        fn adds_up_to_the_limit(limit in 0.001..1e9f64, demands in demands()) {
            let sum: f64 = fair_shares(limit, &demands).iter().sum();
            prop_assert!(close(sum, limit, limit * 1e-9), "{sum} of {limit}");
        }

        #[test]
        fn no_client_below_its_demand_or_an_equal_share(limit in 1.0..3000.0f64, demands in demands()) {
            let shares = fair_shares(limit, &demands);
            let equal = limit / demands.len() as f64;
            for (share, demand) in shares.iter().zip(&demands) {
                prop_assert!(*share >= demand.min(equal) - limit * 1e-9, "{shares:?} for {demands:?}");
            }
            // Over the limit, nobody gets more than it asks.
            if demands.iter().sum::<f64>() >= limit {
                for (share, demand) in shares.iter().zip(&demands) {
                    prop_assert!(*share <= demand + limit * 1e-9);
                }
            }
        }

        #[test]
        fn asking_more_never_gives_less_nor_gives_others_more(
            limit in 1.0..3000.0f64,
            demands in demands(),
            which in any::<prop::sample::Index>(),
            more in 0.0..1500.0f64,
        ) {
            let before = fair_shares(limit, &demands);
            let j = which.index(demands.len());
            let mut raised = demands.clone();
            raised[j] += more;
            let after = fair_shares(limit, &raised);
            let slack = limit * 1e-9;
            prop_assert!(after[j] >= before[j] - slack, "{before:?} -> {after:?}");
            for (i, (a, b)) in after.iter().zip(&before).enumerate() {
                if i != j {
                    prop_assert!(*a <= b + slack, "{before:?} -> {after:?}");
                }
            }
        }

        #[test]
        fn the_order_of_clients_does_not_matter(limit in 1.0..3000.0f64, demands in demands()) {
            let shares = fair_shares(limit, &demands);
            let reversed: Vec<f64> = demands.iter().rev().copied().collect();
            let back: Vec<f64> = fair_shares(limit, &reversed).into_iter().rev().collect();
            for (a, b) in shares.iter().zip(&back) {
                prop_assert!(close(*a, *b, limit * 1e-9));
            }
        }
    }
}
