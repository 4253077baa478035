//! What the engine answers: per descriptor and overall, borrowed from the rules while it is
//! being decided ([`Outcome`]), and owned for the wire ([`Verdict`]) with the rate-limit fields
//! of the most restrictive status.

use std::time::Duration;

use std::collections::BTreeMap;

use sluice::{CheckError, Decision, Quota};
use sluice_descriptors::{Metadata, Rule};

use crate::generation::Generation;
use crate::request::CheckRequest;
use crate::settings::FieldSet;
use crate::store::Count;

/// The answer for one descriptor, or for a whole request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Within its limits (or not limited).
    Ok,
    /// Over a limit.
    OverLimit,
}

/// The limit a descriptor was counted against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedLimit {
    /// The quota its counter was decided under: its rule's, the request's override, or the
    /// quota its value's source gave.
    pub quota: Quota,
    /// The rule's name, if it has one.
    pub name: Option<String>,
    /// The rule's place in the rules.
    pub rule: sluice_descriptors::RuleId,
    /// Counted and reported, never denying.
    pub shadow_mode: bool,
    /// Over its limit, it denies only with every other quota-mode limit of the request (its
    /// rule's `quota_mode`, or `rls.quota_mode`).
    pub quota_mode: bool,
}

/// One descriptor's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorStatus {
    /// Over its limit or not (a shadow rule over its limit says so here, and the request
    /// is still admitted).
    pub code: Code,
    /// The limit counted, if a rule with a limit matched.
    pub limit: Option<AppliedLimit>,
    /// Units left.
    pub remaining: u64,
    /// Until the limit is whole again.
    pub reset_after: Duration,
    /// Until this descriptor's hits could be admitted (zero if admitted).
    pub retry_after: Duration,
    /// With several limits (its rule's quotas, `quota: [..]`): each one's status, in the rule's
    /// order, of which the fields above are the tightest's; empty with one.
    pub each: Vec<DescriptorStatus>,
}

/// A request's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Over a limit if any descriptor not in shadow mode is.
    pub overall: Code,
    /// One per descriptor, in order.
    pub statuses: Vec<DescriptorStatus>,
    /// The rate-limit fields for the client's response, from the most restrictive status.
    pub headers: Vec<(String, String)>,
    /// With `rls.dynamic_metadata`: a map of the request (`domain`, `descriptors` with their
    /// `entries` as `key=value`, and `limit` and `hitsAddend` where given, `hitsAddend`) and
    /// `metadata`, the `metadata:` of every rule that admitted its descriptor merged in order
    /// ([`Metadata::merge`]), as envoy ratelimit writes it.
    pub dynamic_metadata: Option<Metadata>,
}

/// One descriptor's answer while the rules it was decided on are at hand.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Status<'g> {
    /// The rule it was counted under; `None` when nothing limits it.
    pub(crate) rule: Option<&'g Rule>,
    /// The quota its counter was decided under.
    pub(crate) quota: Quota,
    pub(crate) decision: Decision,
    /// The hits, when its quota can never admit them.
    pub(crate) never_fits: Option<u64>,
}

impl<'g> Status<'g> {
    /// A descriptor nothing limits.
    pub(crate) const UNLIMITED: Self = Self {
        rule: None,
        quota: Quota::deny_all(),
        decision: Decision::allowed(u64::MAX, u64::MAX, 0),
        never_fits: None,
    };

    /// The status of a take's answer under `rule`.
    #[inline]
    pub(crate) fn of(rule: &'g Rule, quota: Quota, answer: Result<Decision, CheckError>) -> Self {
        match answer {
            Ok(decision) => Self {
                rule: Some(rule),
                quota,
                decision,
                never_fits: None,
            },
            Err(CheckError::CostExceedsCapacity { cost, .. }) => Self::never_fits(rule, quota, cost),
        }
    }

    /// The status of `hits` its quota can never admit.
    #[inline]
    pub(crate) fn never_fits(rule: &'g Rule, quota: Quota, hits: u64) -> Self {
        Self {
            rule: Some(rule),
            quota,
            decision: Decision::denied(quota.capacity(), 0, 0, u64::MAX),
            never_fits: Some(hits),
        }
    }

    #[inline]
    pub(crate) fn is_over(&self) -> bool {
        !self.decision.is_allowed()
    }

    /// Over a limit that may deny (not in shadow mode).
    #[inline]
    pub(crate) fn denies(&self) -> bool {
        self.is_over() && self.rule.is_some_and(|rule| !rule.shadow_mode)
    }

    /// What a take of `cost` would have said, from a look (a take of nothing): over if the
    /// look leaves less than `cost`, told to retry when the limit is whole again (a bound: a
    /// look does not say when `cost` fits); never fitting if `cost` is beyond the quota.
    #[inline]
    pub(crate) fn as_take(self, cost: u64) -> Self {
        let (Some(rule), d) = (self.rule, self.decision) else {
            return self;
        };
        if self.never_fits.is_some() || !d.is_allowed() || d.remaining() >= cost {
            return self;
        }
        if cost > self.quota.capacity() {
            return Self::never_fits(rule, self.quota, cost);
        }
        let reset = nanos(d.reset_after());
        Self {
            decision: Decision::denied(d.limit(), d.remaining(), reset, reset),
            ..self
        }
    }

    /// After its take of `cost` was given back.
    pub(crate) fn given_back(&mut self, cost: u64) {
        let d = self.decision;
        let remaining = d.remaining().saturating_add(cost).min(self.quota.capacity());
        self.decision = Decision::allowed(d.limit(), remaining, nanos(d.reset_after()));
    }

    /// As the HTTP layer reads it: the decision, or the error of a cost that never fits,
    /// admitted whenever the request was (a shadow rule's denial admits).
    #[inline]
    pub(crate) fn to_layer(self, denied: bool) -> (Result<Decision, CheckError>, Option<Quota>) {
        if self.rule.is_none() {
            return (Ok(self.decision), None);
        }
        let d = self.decision;
        let answer = match self.never_fits {
            Some(cost) if denied => Err(CheckError::CostExceedsCapacity {
                cost,
                capacity: self.quota.capacity(),
            }),
            _ if denied || d.is_allowed() => Ok(d),
            _ => Ok(Decision::allowed(
                d.limit(),
                d.remaining(),
                nanos(d.reset_after()),
            )),
        };
        (answer, Some(self.quota))
    }

    fn to_public(self, quota_mode: bool) -> DescriptorStatus {
        let Some(rule) = self.rule else {
            return DescriptorStatus {
                code: Code::Ok,
                limit: None,
                remaining: 0,
                reset_after: Duration::ZERO,
                retry_after: Duration::ZERO,
                each: Vec::new(),
            };
        };
        let d = self.decision;
        DescriptorStatus {
            code: if self.is_over() { Code::OverLimit } else { Code::Ok },
            limit: Some(AppliedLimit {
                quota: self.quota,
                name: rule.name.clone(),
                rule: rule.id.clone(),
                shadow_mode: rule.shadow_mode,
                quota_mode,
            }),
            remaining: d.remaining(),
            reset_after: d.reset_after(),
            retry_after: if self.never_fits.is_some() {
                Duration::MAX
            } else {
                d.retry_after()
            },
            each: Vec::new(),
        }
    }
}

/// A decided request: whether it is denied, and the status of each limit counted (a
/// descriptor no rule limits has none).
pub(crate) struct Outcome<'a, 'g> {
    pub(crate) denied: bool,
    /// How many descriptors the request has.
    pub(crate) descriptors: usize,
    pub(crate) counts: &'a [Count<'g>],
    /// One per count, in the same order.
    pub(crate) statuses: &'a [Status<'g>],
    pub(crate) generation: &'a Generation,
}

impl Outcome<'_, '_> {
    /// The answer for the wire, with the header fields of `headers`.
    pub(crate) fn to_verdict(&self, headers: FieldSet) -> Verdict {
        let mut counted = self.counts.iter().zip(self.statuses).peekable();
        let statuses = (0..self.descriptors)
            .map(|index| {
                // A descriptor of several limits (its rule's stacked quotas) answers with the
                // tightest.
                let Some(first) = counted.next_if(|(count, _)| count.index == index) else {
                    return Status::UNLIMITED.to_public(false);
                };
                let Some(second) = counted.next_if(|(count, _)| count.index == index) else {
                    return first.1.to_public(first.0.quota_mode);
                };
                // Several limits: each listed, the tightest answering.
                let mut each = vec![
                    first.1.to_public(first.0.quota_mode),
                    second.1.to_public(second.0.quota_mode),
                ];
                let mut chosen = tighter(first, second);
                while let Some(next) = counted.next_if(|(count, _)| count.index == index) {
                    each.push(next.1.to_public(next.0.quota_mode));
                    chosen = tighter(chosen, next);
                }
                let (count, status) = chosen;
                DescriptorStatus {
                    each,
                    ..status.to_public(count.quota_mode)
                }
            })
            .collect();
        Verdict {
            overall: if self.denied { Code::OverLimit } else { Code::Ok },
            statuses,
            headers: self.headers(headers),
            dynamic_metadata: None,
        }
    }

    /// The dynamic metadata of `request`'s answer ([`Verdict::dynamic_metadata`]).
    pub(crate) fn dynamic_metadata(&self, request: &CheckRequest) -> Metadata {
        let text = |text: &str| Metadata::String(text.to_owned());
        let number = |n: u64| Metadata::Number(n as f64);
        let mut fields = BTreeMap::new();
        fields.insert("domain".to_owned(), text(&request.domain));
        let descriptors = (request.descriptors.iter())
            .map(|descriptor| {
                let mut fields = BTreeMap::new();
                let entries = (descriptor.entries.iter())
                    .map(|(key, value)| Metadata::String(format!("{key}={value}")))
                    .collect();
                fields.insert("entries".to_owned(), Metadata::List(entries));
                if let Some(limit) = descriptor.limit {
                    fields.insert("limit".to_owned(), text(&limit.to_string()));
                }
                if let Some(hits) = descriptor.hits {
                    fields.insert("hitsAddend".to_owned(), number(hits));
                }
                Metadata::Map(fields)
            })
            .collect();
        fields.insert("descriptors".to_owned(), Metadata::List(descriptors));
        if let Some(hits) = request.hits.filter(|hits| *hits != 0) {
            fields.insert("hitsAddend".to_owned(), number(hits));
        }
        // The metadata of every rule that admitted its descriptor (a shadow rule always does).
        let mut passed = Metadata::Map(BTreeMap::new());
        for status in self.statuses {
            if let Some(rule) = status.rule
                && (!status.is_over() || rule.shadow_mode)
                && let Some(metadata) = &rule.metadata
            {
                passed.merge(metadata);
            }
        }
        if matches!(&passed, Metadata::Map(map) if !map.is_empty()) {
            fields.insert("metadata".to_owned(), passed);
        }
        Metadata::Map(fields)
    }

    /// The header fields: `X-RateLimit-*` and `Retry-After` of the most restrictive status (a
    /// denying one, else the limited one with the fewest units left); `RateLimit-Policy` and
    /// `RateLimit` list every limited status, one item each named by its rule's policy, the
    /// most restrictive first and the others in the request's order.
    fn headers(&self, set: FieldSet) -> Vec<(String, String)> {
        match set {
            FieldSet::None => return Vec::new(),
            FieldSet::Envoy => return self.envoy_headers(),
            FieldSet::Draft | FieldSet::Legacy | FieldSet::All => {}
        }
        let counts = |status: &&Status<'_>| status.rule.is_some_and(|rule| !rule.shadow_mode);
        let mut counting = self
            .statuses
            .iter()
            .enumerate()
            .filter(|(_, status)| counts(status));
        let chosen = if self.denied {
            counting.find(|(_, status)| status.is_over())
        } else {
            counting.min_by_key(|(_, status)| status.decision.remaining())
        };
        let Some((chosen_at, status)) = chosen else {
            return Vec::new();
        };
        let fields_of = |at: usize, status: &Status<'_>| {
            let rule = status.rule?;
            let policy = match self.counts.get(at).map_or(0, |count| count.nth) {
                0 => self.generation.policies.get(&rule.id)?,
                nth => self.generation.stacked_policies.get(&rule.id)?.get(nth - 1)?,
            };
            Some(policy.fields(&status.decision, Some(status.quota)))
        };
        let Some(fields) = fields_of(chosen_at, status) else {
            return Vec::new();
        };
        let wanted = |name: &str| match set {
            FieldSet::None | FieldSet::Envoy => false,
            FieldSet::All => true,
            FieldSet::Draft => !name.starts_with("x-"),
            FieldSet::Legacy => !name.starts_with("ratelimit"),
        };
        let mut answer: Vec<(String, String)> = fields
            .iter()
            .filter(|(name, _)| wanted(name.as_str()))
            .filter_map(|(name, value)| Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned())))
            .collect();
        let others = (self.statuses.iter().enumerate())
            .filter(|(at, status)| *at != chosen_at && counts(status))
            .filter_map(|(at, status)| fields_of(at, status));
        for other in others {
            for (name, list) in &mut answer {
                if !name.starts_with("ratelimit") {
                    continue;
                }
                if let Some(item) = other.get(name.as_str()).and_then(|value| value.to_str().ok()) {
                    list.push_str(", ");
                    list.push_str(item);
                }
            }
        }
        answer
    }
}

impl Outcome<'_, '_> {
    /// envoy ratelimit's three fields (`LIMIT_RESPONSE_HEADERS_ENABLED`), chosen as it chooses:
    /// the limited status with the fewest units left, and the last ordinary one over its limit
    /// whatever the others have left. Reset is when that limit is whole again, in seconds
    /// rounded up (envoy's fixed window says the end of its window: the same for a window).
    fn envoy_headers(&self) -> Vec<(String, String)> {
        let mut chosen = None;
        let mut least = u64::from(u32::MAX);
        for (count, status) in self.counts.iter().zip(self.statuses) {
            if status.rule.is_none() {
                continue;
            }
            let remaining = status.decision.remaining().min(u64::from(u32::MAX));
            if remaining < least {
                (chosen, least) = (Some(status), remaining);
            }
            if status.denies() && !count.quota_mode {
                (chosen, least) = (Some(status), 0);
            }
        }
        let Some(status) = chosen else {
            return Vec::new();
        };
        let (per_unit, _) = crate::rls_message::per_unit(status.quota);
        let reset = status.decision.reset_after();
        let reset = reset.as_secs() + u64::from(reset.subsec_nanos() > 0);
        vec![
            ("RateLimit-Limit".to_owned(), per_unit.to_string()),
            (
                "RateLimit-Remaining".to_owned(),
                status.decision.remaining().min(u64::from(u32::MAX)).to_string(),
            ),
            ("RateLimit-Reset".to_owned(), reset.to_string()),
        ]
    }
}

/// Of two limits of one descriptor, the one that answers for it: the first that denies, else
/// the first over its limit (in shadow mode), else the one with fewer units left.
pub(crate) fn tighter<'a, 'g>(
    best: (&'a Count<'g>, &'a Status<'g>),
    next: (&'a Count<'g>, &'a Status<'g>),
) -> (&'a Count<'g>, &'a Status<'g>) {
    let rank = |status: &Status<'_>| (!status.denies(), !status.is_over(), status.decision.remaining());
    if rank(next.1) < rank(best.1) { next } else { best }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
