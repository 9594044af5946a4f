//! Conditions keyed by type, with `lastTransitionTime` kept unless the status changes. Set
//! with a [`ConditionType`] and a typed [`Reason`] of the object's kind.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use sandboxd_crds::v1alpha1::condition::{ConditionType, Reason};

/// Sets the condition of `type_`, keeping its transition time when the status is unchanged.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: ConditionType,
    status: bool,
    reason: impl Reason,
    message: &str,
    generation: Option<i64>,
) {
    set_at(
        conditions,
        type_,
        status,
        reason,
        message,
        generation,
        Timestamp::now(),
    );
}

/// [`set`] at time `now` (a transition is stamped with it).
pub fn set_at(
    conditions: &mut Vec<Condition>,
    type_: ConditionType,
    status: bool,
    reason: impl Reason,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) {
    let status = if status { "True" } else { "False" };
    let (type_, reason) = (type_.as_str(), reason.as_str());
    let now = Time(now);
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now;
            }
            c.status = status.to_owned();
            c.reason = reason.to_owned();
            c.message = message.to_owned();
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            observed_generation: generation,
            last_transition_time: now,
        }),
    }
}

/// Removes the condition of `type_`.
pub fn clear(conditions: &mut Vec<Condition>, type_: ConditionType) {
    conditions.retain(|c| c.type_ != type_.as_str());
}

/// The condition of `type_`, if set.
pub fn get(conditions: &[Condition], type_: ConditionType) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == type_.as_str())
}

/// Whether the condition of `type_` is True.
pub fn is_true(conditions: &[Condition], type_: ConditionType) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Whether the condition of `type_` is set with `reason`.
pub fn has_reason(conditions: &[Condition], type_: ConditionType, reason: impl Reason) -> bool {
    get(conditions, type_).is_some_and(|c| c.reason == reason.as_str())
}

/// Conditions equal apart from transition times (to decide whether a status write is needed).
pub fn same(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len()
        && a.iter().all(|x| {
            b.iter().any(|y| {
                x.type_ == y.type_
                    && x.status == y.status
                    && x.reason == y.reason
                    && x.message == y.message
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandboxd_crds::v1alpha1::condition::SessionReason;

    #[test]
    fn transition_time_moves_only_when_the_status_changes() {
        let ready = ConditionType::Ready;
        let mut c = Vec::new();
        set(
            &mut c,
            ready,
            false,
            SessionReason::Sleeping,
            "asleep",
            Some(1),
        );
        let first = c[0].last_transition_time.clone();
        set(
            &mut c,
            ready,
            false,
            SessionReason::Reclaimed,
            "still",
            Some(2),
        );
        assert_eq!(c[0].last_transition_time, first);
        assert_eq!(
            (
                c[0].type_.as_str(),
                c[0].reason.as_str(),
                c[0].observed_generation
            ),
            ("Ready", "Reclaimed", Some(2))
        );
        assert!(has_reason(&c, ready, SessionReason::Reclaimed));
        set(&mut c, ready, true, SessionReason::Running, "up", Some(2));
        assert!(c[0].last_transition_time.0 >= first.0);
        assert!(is_true(&c, ready));
        assert_eq!(c.len(), 1);
        clear(&mut c, ready);
        assert!(c.is_empty());
    }
}
