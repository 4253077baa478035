//! The engine's decisions against a plain model of envoy ratelimit's semantics: ordinary,
//! shadow-mode and quota-mode limits, counted all-or-nothing or each on its own, with the
//! global shadow and quota modes. Hour-long quotas, so nothing refills during a case.

use proptest::prelude::*;
use sluice_descriptors::RuleSet;
use sluice_service::{CheckRequest, Code, Counting, DescriptorRequest, Engine, EngineSettings};

/// One rule: key `k{i}`, its limit per hour, whether it is in shadow mode, in quota mode.
#[derive(Debug, Clone, Copy)]
struct ModelRule {
    limit: u64,
    shadow: bool,
    quota: bool,
}

fn rules_yaml(rules: &[ModelRule]) -> String {
    let mut text = String::from("domain: d\ndescriptors:\n");
    for (i, rule) in rules.iter().enumerate() {
        text.push_str(&format!(
            "  - key: k{i}\n    shadow_mode: {}\n    quota_mode: {}\n    rate_limit: {{unit: hour, requests_per_unit: {}}}\n",
            rule.shadow, rule.quota, rule.limit
        ));
    }
    text
}

/// What the model answers: overall OK, each descriptor's over-or-not; `used` updated.
fn model(
    rules: &[ModelRule],
    used: &mut [u64],
    request: &[(usize, u64)],
    counting: Counting,
    (global_shadow, global_quota): (bool, bool),
) -> (bool, Vec<bool>) {
    let over: Vec<bool> = request
        .iter()
        .map(|&(i, hits)| used[i] + hits > rules[i].limit)
        .collect();
    let (mut ordinary, mut quotas, mut quotas_over) = (false, 0, 0);
    for (&(i, _), &over) in request.iter().zip(&over) {
        let denies = over && !rules[i].shadow;
        if rules[i].quota || global_quota {
            quotas += 1;
            quotas_over += u32::from(denies);
        } else {
            ordinary |= denies;
        }
    }
    let denied = ordinary || (quotas > 0 && quotas == quotas_over);
    if !(denied && counting == Counting::AllOrNothing) {
        for (&(i, hits), &over) in request.iter().zip(&over) {
            if !over {
                used[i] += hits;
            }
        }
    }
    (!denied || global_shadow, over)
}

fn rule() -> impl Strategy<Value = ModelRule> {
    (1..5u64, prop::bool::weighted(0.2), prop::bool::weighted(0.4))
        .prop_map(|(limit, shadow, quota)| ModelRule { limit, shadow, quota })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn decisions_agree_with_the_model(
        rules in prop::collection::vec(rule(), 1..5),
        seed in prop::collection::vec(prop::collection::btree_map(0..4usize, 1..3u64, 1..=4), 1..25),
        independent in any::<bool>(),
        global_shadow in prop::bool::weighted(0.2),
        global_quota in prop::bool::weighted(0.2),
    ) {
        let n = rules.len();
        let requests: Vec<Vec<(usize, u64)>> = seed
            .into_iter()
            .map(|m| m.into_iter().filter(|(i, _)| *i < n).collect::<Vec<_>>())
            .filter(|r| !r.is_empty())
            .collect();
        let counting = if independent { Counting::Independent } else { Counting::AllOrNothing };
        let settings = EngineSettings {
            counting,
            shadow: global_shadow,
            quota_mode: global_quota,
            ..EngineSettings::default()
        };
        let engine = Engine::new(RuleSet::from_yaml(&rules_yaml(&rules)).unwrap(), settings).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let mut used = vec![0; n];
        for request in requests {
            let asked = CheckRequest {
                domain: "d".into(),
                descriptors: request
                    .iter()
                    .map(|&(i, hits)| DescriptorRequest {
                        entries: vec![(format!("k{i}"), "v".into())],
                        hits: Some(hits),
                        ..Default::default()
                    })
                    .collect(),
                hits: None,
            };
            let verdict = runtime.block_on(engine.check(&asked, false)).unwrap();
            let (ok, over) = model(&rules, &mut used, &request, counting, (global_shadow, global_quota));
            prop_assert_eq!(verdict.overall == Code::Ok, ok, "{:?} after {:?}: {:?}", request, used, verdict);
            let codes: Vec<bool> = verdict.statuses.iter().map(|s| s.code == Code::OverLimit).collect();
            prop_assert_eq!(codes, over, "{:?}: {:?}", request, verdict);
        }
    }
}
