//! Conditions keyed by type, with `lastTransitionTime` kept unless the status changes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Sets the condition of `type_`, keeping its transition time when the status is unchanged.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
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
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) {
    let status = if status { "True" } else { "False" };
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
pub fn clear(conditions: &mut Vec<Condition>, type_: &str) {
    conditions.retain(|c| c.type_ != type_);
}

/// The condition of `type_`, if set.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of `type_` is True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == "True")
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

    #[test]
    fn transition_time_moves_only_when_the_status_changes() {
        let mut c = Vec::new();
        set(&mut c, "Ready", false, "Opening", "opening", Some(1));
        let first = c[0].last_transition_time.clone();
        set(&mut c, "Ready", false, "Preparing", "still", Some(2));
        assert_eq!(c[0].last_transition_time, first);
        assert_eq!(
            (c[0].reason.as_str(), c[0].observed_generation),
            ("Preparing", Some(2))
        );
        set(&mut c, "Ready", true, "Running", "up", Some(2));
        assert!(c[0].last_transition_time.0 >= first.0);
        assert!(is_true(&c, "Ready"));
        assert_eq!(c.len(), 1);
        clear(&mut c, "Ready");
        assert!(c.is_empty());
    }
}
