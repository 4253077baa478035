//! Usage reported after the fact ([`Engine::report`]): each descriptor's hits charged to its
//! limits whatever is left, without a decision (`POST /v1/report`, the HTTP layer's
//! `charge_from`).

use std::time::Duration;

use crate::answer::AppliedLimit;
use crate::engine::Engine;
use crate::request::{CheckRequest, Request, RequestError};
use crate::store::Tally;

impl Engine {
    /// Charges each descriptor's hits to its limits whatever is left, without a decision: usage
    /// known only once a request was served (tokens generated, bytes sent), reported after it.
    /// A limit goes below empty down to its quota's debt ([`sluice::Quota::max_debt`]), and
    /// the checks that follow are denied until refill has repaid it. Nothing is recorded as a
    /// decision.
    ///
    /// # Errors
    /// The request is outside the bounds ([`crate::RequestBounds`]); a limit counted on Redis
    /// by an algorithm whose script takes no charge (only the token bucket's does:
    /// [`RequestError::ChargeUnsupported`]); Redis did not take the charge
    /// ([`RequestError::NotCharged`]). Limits charged before the one that failed stay charged.
    ///
    /// # Example
    /// ```
    /// use sluice_descriptors::RuleSet;
    /// use sluice_service::{CheckRequest, DescriptorRequest, Engine, EngineSettings};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let rules = RuleSet::from_yaml("domain: llm\ndescriptors:\n  - key: user\n    rate_limit: {quota: 1000/min}\n")?;
    /// let engine = Engine::new(rules, EngineSettings::default())?;
    /// let used = CheckRequest {
    ///     domain: "llm".into(),
    ///     descriptors: vec![DescriptorRequest {
    ///         entries: vec![("user".into(), "alice".into())],
    ///         hits: Some(1_500), // tokens generated
    ///         limit: None,
    ///     }],
    ///     hits: None,
    /// };
    /// let report = engine.report(&used).await?;
    /// assert_eq!(report.statuses[0][0].balance, -500); // 1 000 a minute, 500 below empty
    /// let next = CheckRequest {
    ///     descriptors: vec![DescriptorRequest { hits: Some(1), ..used.descriptors[0].clone() }],
    ///     ..used
    /// };
    /// let verdict = engine.check(&next, false).await?;
    /// // 501 units at 1 000 a minute (less the time since the report).
    /// assert!((30_000..=30_060).contains(&verdict.statuses[0].retry_after.as_millis()));
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(run()).unwrap();
    /// ```
    pub async fn report(&self, request: &CheckRequest) -> Result<Report, RequestError> {
        let entries = request.entries();
        let descriptors = request.descriptors(&entries);
        let view = Request {
            domain: &request.domain,
            descriptors: &descriptors,
        };
        view.validate(self.settings.bounds)?;
        let generation = self.current.load_full();
        let mut tally = Tally::new(String::new());
        self.plan(&generation, view, false, &mut tally);
        let mut statuses: Vec<Vec<Reported>> = vec![Vec::new(); descriptors.len()];
        for count in &tally.counts {
            if count.cost == 0 {
                continue;
            }
            let (charge, quota) = generation.store.charge(count, &tally.keys).await?;
            let decision = charge.decision();
            let rule = count.rule;
            if let Some(list) = statuses.get_mut(count.index) {
                list.push(Reported {
                    limit: AppliedLimit {
                        quota,
                        name: rule.name.clone(),
                        rule: rule.id.clone(),
                        shadow_mode: rule.shadow_mode,
                        quota_mode: count.quota_mode,
                    },
                    charged: charge.charged(),
                    balance: charge.balance(),
                    reset_after: decision.reset_after(),
                    retry_after: decision.retry_after(),
                });
            }
        }
        Ok(Report { statuses })
    }
}

/// One limit's account after a report ([`Engine::report`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported {
    /// The limit charged.
    pub limit: AppliedLimit,
    /// Units taken: the hits, or less where the quota's debt stopped them.
    pub charged: u64,
    /// Units left, negative while in debt.
    pub balance: i64,
    /// Until the limit is whole again.
    pub reset_after: Duration,
    /// Until the debt is repaid (zero if the limit is not below empty).
    pub retry_after: Duration,
}

/// What a report charged ([`Engine::report`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// One list per descriptor, in order: each limit it was charged to (its rule's quotas in
    /// the rule's order), none when nothing limits it.
    pub statuses: Vec<Vec<Reported>>,
}
