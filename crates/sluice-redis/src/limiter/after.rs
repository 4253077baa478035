//! What a [`RedisLimiter`] does beyond one check: a group of keys decided all or nothing in one
//! call (`lua/group.lua`), and charges after the fact (the token bucket script's charge mode).

use std::sync::atomic::Ordering;

use sluice::{Charge, Decision, Quota, QuotaSource};

use super::{Prepared, RedisLimiter, ScriptTime};
use crate::script::Plan;
use crate::store::CallError;
use crate::{Error, RedisAlgorithm};

impl<A: RedisAlgorithm, S: QuotaSource<String>> RedisLimiter<A, S> {
    /// Consumes `cost` for `key` whatever is left, down to its quota's debt, as
    /// [`sluice::KeyedLimiter::charge_n`] does, on the state shared through Redis: for costs
    /// known only once a request was served.
    ///
    /// # Errors
    /// [`Error::ChargeUnsupported`] under a window algorithm (only the token bucket's script
    /// takes debt); [`Error::QuotaTooLarge`] if the
    /// key's quota cannot be held exactly; [`Error::NotCharged`] if Redis did not answer (a
    /// charge is not answered by the failure policy: it has nothing to decide).
    pub async fn charge_n(&self, key: &str, cost: u64) -> Result<Charge, Error> {
        let quota = self.inner.book.resolve_quota(key);
        if quota.is_deny_all() {
            return Ok(Charge::new(0, 0, Decision::denied(0, 0, 0, u64::MAX)));
        }
        let plan = Plan::new(self.inner.kind, &quota)?;
        let Some(deepest) = plan.charge_limit(&quota) else {
            return Err(Error::ChargeUnsupported {
                script: plan.kind.name(),
            });
        };
        let keys = plan.kind.keys(&self.redis_key(key));
        let to_arg = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let [a, b, c] = plan.args().map(to_arg);
        let args = [to_arg(cost), 2, -1, a, b, c, to_arg(deepest)];
        let reply = (self.inner.store.eval(plan.kind.script(), &keys, &args).await)
            .map_err(|e| Error::NotCharged(e.to_string()))?;
        self.inner.counters.redis_checks.fetch_add(1, Ordering::Relaxed);
        plan.charge(&reply).ok_or_else(|| {
            tracing::error!(key, ?reply, "unexpected script reply to a charge");
            Error::NotCharged(format!("unexpected reply {reply:?}"))
        })
    }

    /// Checks `cost` for each of `keys` all or nothing, in one atomic call: either every key
    /// takes its cost, or none takes anything. Each answer says whether the cost was taken;
    /// when it was not, the answer of a key with room is a look (what remains, before the
    /// cost), and that of a key without room its denial with the exact retry-after. The keys
    /// must be distinct and share a Redis Cluster slot ([`RedisLimiterBuilder::hash_tag`]). An
    /// unreachable Redis is answered by the failure policy for each key, as a take (so with
    /// the local share, keys whose share admits take from it while another's may deny).
    ///
    /// # Errors
    /// Each answer as [`RedisLimiter::check_n`]'s.
    pub async fn check_all(&self, keys: &[&str], cost: u64) -> Vec<(Result<Decision, Error>, bool)> {
        if keys.is_empty() {
            return Vec::new();
        }
        let prepared: Vec<Prepared> = keys.iter().map(|key| self.prepare(key, cost)).collect();
        let plans: Vec<(Quota, Plan)> = (prepared.iter())
            .filter_map(|p| match p {
                Prepared::Plan(quota, plan) => Some((*quota, *plan)),
                Prepared::Done(_) => None,
            })
            .collect();
        if plans.len() < keys.len() {
            // A key answered without Redis (a cost beyond its quota, a quota that denies
            // everything, the failsafe pool spent): nothing is taken; the others are looked at.
            let mut answers = Vec::with_capacity(keys.len());
            for (key, prepared) in keys.iter().zip(prepared) {
                answers.push(match prepared {
                    Prepared::Done(answer) => (answer, false),
                    Prepared::Plan(..) => (self.check_with(key, 0, ScriptTime::Redis).await, false),
                });
            }
            return answers;
        }
        let kind = self.inner.kind;
        let mut redis_keys = Vec::new();
        let mut args: Vec<i64> = Vec::new();
        let to_arg = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let per_keys = kind.keys("").len();
        args.extend([
            to_arg(keys.len() as u64),
            per_keys as i64,
            6,
            i64::from(kind.scaled_room()),
        ]);
        for (key, (_, plan)) in keys.iter().zip(&plans) {
            redis_keys.extend(kind.keys(&self.redis_key(key)));
            let [a, b, c] = plan.args().map(to_arg);
            args.extend([to_arg(cost), 0, -1, a, b, c]);
        }
        let reply = self
            .inner
            .store
            .eval(kind.group_script(), &redis_keys, &args)
            .await;
        let answers = reply.map_err(|e| e.to_string()).and_then(|reply| {
            group_answers(&reply, &plans).ok_or_else(|| format!("unexpected reply {reply:?}"))
        });
        match answers {
            Ok(answers) => {
                let checks = u64::try_from(keys.len()).unwrap_or(u64::MAX);
                self.inner
                    .counters
                    .redis_checks
                    .fetch_add(checks, Ordering::Relaxed);
                answers
            }
            Err(error) => {
                // Each key as the policy answers a take of it (fail open or closed decides
                // for all alike; the local share takes from each key's own share).
                tracing::debug!(%error, "a group check was not answered; the failure policy answers");
                let error = CallError::BadReply(Vec::new());
                (keys.iter().zip(&plans))
                    .map(|(key, (quota, _))| (self.by_policy(key, quota, cost, &error), true))
                    .collect()
            }
        }
    }
}

/// Each limit's answer in a group script's flat reply: taken or not, then its reply.
fn group_answers(reply: &[i64], plans: &[(Quota, Plan)]) -> Option<Vec<(Result<Decision, Error>, bool)>> {
    let mut answers = Vec::with_capacity(plans.len());
    let mut rest = reply;
    for (_, plan) in plans {
        let [taken, len, tail @ ..] = rest else {
            return None;
        };
        let len = usize::try_from(*len).ok()?;
        let one = tail.get(..len)?;
        answers.push((Ok(plan.decision(one)?), *taken == 1));
        rest = &tail[len..];
    }
    rest.is_empty().then_some(answers)
}
