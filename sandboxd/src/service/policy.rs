//! The policy a running sandboxd can change: caps and lifetimes (`GET`/`PUT /v1/policy`). The
//! allowlist, network mode, OCI runtime, sandbox uid, work dir, persist-containers and the
//! per-sandbox isolation limits are refused (naming the field): choosing an image or an
//! isolation setting is a decision that takes a restart, and the admin token is held by an
//! application, not by whoever runs the host.

use serde_json::{Map, Value};

use crate::service::ServiceError;
pub use sandboxd_api::policy::{Fixed, Policy, PolicyView};

/// The fields that are refused, and the variable a restart would change them with.
pub const FIXED_FIELDS: [(&str, &str); 16] = [
    ("runtimes", "PUT /v1/runtimes or SANDBOXD_RUNTIMES"),
    ("allowlist", "PUT /v1/runtimes or SANDBOXD_RUNTIMES"),
    ("network_mode", "SANDBOXD_NETWORK_MODE"),
    ("runtime_network", "SANDBOXD_RUNTIME_NETWORK"),
    ("oci_runtime", "SANDBOXD_OCI_RUNTIME"),
    ("sandbox_uid", "SANDBOXD_SANDBOX_UID"),
    ("work_dir", "the image (it is always /workspace)"),
    ("workspace_root", "SANDBOXD_WORKSPACE_ROOT"),
    ("persist_containers", "SANDBOXD_PERSIST_CONTAINERS"),
    ("cpus", "SANDBOXD_CPUS"),
    ("memory", "SANDBOXD_MEM_LIMIT"),
    ("pids_limit", "SANDBOXD_PIDS_LIMIT"),
    ("tmpfs_size", "SANDBOXD_TMPFS_SIZE"),
    ("workspace_size", "SANDBOXD_WORKSPACE_SIZE"),
    ("workspace_budget", "SANDBOXD_WORKSPACE_BUDGET"),
    (
        "max_workspaces_per_tenant",
        "SANDBOXD_MAX_WORKSPACES_PER_TENANT",
    ),
];

/// The fields that change live.
pub const LIVE_FIELDS: [&str; 5] = [
    "max_sessions",
    "max_sessions_per_tenant",
    "execute_timeout",
    "max_read_bytes",
    "max_output_bytes",
];

/// The bounds of every live value: field, the variable that sets it at start, the most it may
/// be, and its unit. A value past its bound is refused (naming the field and the bound):
/// an execute timeout near `u64::MAX` would overflow the run's deadline, and a read or output
/// limit is memory sandboxd holds per request.
pub const BOUNDS: [(&str, &str, u64, &str); 5] = [
    ("max_sessions", "SANDBOXD_MAX_SESSIONS", 10_000, "sessions"),
    (
        "max_sessions_per_tenant",
        "SANDBOXD_MAX_SESSIONS_PER_TENANT",
        10_000,
        "sessions",
    ),
    (
        "execute_timeout",
        "SANDBOXD_EXECUTE_TIMEOUT",
        86_400,
        "seconds",
    ),
    (
        "max_read_bytes",
        "SANDBOXD_MAX_READ_BYTES",
        64 * 1024 * 1024,
        "bytes",
    ),
    (
        "max_output_bytes",
        "SANDBOXD_MAX_OUTPUT_BYTES",
        16 * 1024 * 1024,
        "bytes",
    ),
];

/// The most live `field` may be, and its unit (`None` for a field that is not live).
pub fn upper_bound(field: &str) -> Option<(u64, &'static str)> {
    BOUNDS
        .iter()
        .find(|(f, ..)| *f == field)
        .map(|(_, _, max, unit)| (*max, *unit))
}

/// What sandboxd checks of a [`Policy`]: its bounds, and the changes a `PUT /v1/policy` may make.
pub trait PolicyRules: Sized {
    /// The values by field name, in the order of [`BOUNDS`].
    fn values(&self) -> [u64; 5];
    /// Whether every value is within its bounds (1 to the most of [`BOUNDS`]); the error names
    /// the variable that sets it at start.
    fn check(&self) -> Result<(), String>;
    /// `self` with the changes of a `PUT /v1/policy` body applied, or
    /// [`ServiceError::PolicyRefused`] listing every refused field (nothing is applied then).
    fn apply(&self, body: &Value) -> Result<Self, ServiceError>;
}

impl PolicyRules for Policy {
    fn values(&self) -> [u64; 5] {
        [
            u64::from(self.max_sessions),
            u64::from(self.max_sessions_per_tenant),
            self.execute_timeout,
            self.max_read_bytes,
            self.max_output_bytes,
        ]
    }

    /// Whether every value is within its bounds (1 to the most of [`BOUNDS`]); the error names
    /// the variable that sets it at start.
    fn check(&self) -> Result<(), String> {
        for ((_, variable, max, unit), value) in BOUNDS.iter().zip(self.values()) {
            if !(1..=*max).contains(&value) {
                return Err(format!(
                    "{variable} must be between 1 and {max} {unit}, not {value}"
                ));
            }
        }
        Ok(())
    }

    /// `self` with the changes of a `PUT /v1/policy` body applied, or
    /// [`ServiceError::PolicyRefused`] listing every refused field (nothing is applied then).
    fn apply(&self, body: &Value) -> Result<Policy, ServiceError> {
        let Some(map) = body.as_object() else {
            return Err(ServiceError::PolicyRefused(
                "the body must be a JSON object of fields to change".to_owned(),
            ));
        };
        let mut next = *self;
        let mut errors = Vec::new();
        for (key, value) in map {
            if let Some((_, how)) = FIXED_FIELDS.iter().find(|(f, _)| f == key) {
                errors.push(format!(
                    "{key} cannot change at runtime (it is an isolation decision); restart sandboxd with {how}"
                ));
                continue;
            }
            if key == "fixed" {
                continue;
            }
            let number = |min: u64| -> Result<u64, String> {
                let (max, unit) = upper_bound(key).unwrap_or((u64::MAX, ""));
                match value.as_u64() {
                    Some(n) if n > max => Err(format!("{key} must be at most {max} {unit}")),
                    Some(n) if n >= min => Ok(n),
                    // A number past u64 (1e30) is over any bound too.
                    None if value.as_f64().is_some_and(|f| f > max as f64) => {
                        Err(format!("{key} must be at most {max} {unit}"))
                    }
                    _ => Err(format!("{key} must be a whole number of at least {min}")),
                }
            };
            // The bounds keep the sessions caps within u32.
            let small = |n: u64| u32::try_from(n).map_err(|_| format!("{key} is too large"));
            let result = match key.as_str() {
                "max_sessions" => number(1).and_then(small).map(|n| next.max_sessions = n),
                "max_sessions_per_tenant" => number(1)
                    .and_then(small)
                    .map(|n| next.max_sessions_per_tenant = n),
                "execute_timeout" => number(1).map(|n| next.execute_timeout = n),
                "max_read_bytes" => number(1).map(|n| next.max_read_bytes = n),
                "max_output_bytes" => number(1).map(|n| next.max_output_bytes = n),
                _ => Err(format!(
                    "{key} is not a policy field; the live fields are {}",
                    LIVE_FIELDS.join(", ")
                )),
            };
            if let Err(e) = result {
                errors.push(e);
            }
        }
        if errors.is_empty() {
            Ok(next)
        } else {
            Err(ServiceError::PolicyRefused(errors.join("; ")))
        }
    }
}

/// Parses a body into a JSON object map, for callers that build one.
pub fn fields(body: &[u8]) -> Result<Value, ServiceError> {
    serde_json::from_slice::<Map<String, Value>>(body)
        .map(Value::Object)
        .map_err(|e| ServiceError::invalid(format!("invalid policy: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const P: Policy = Policy {
        max_sessions: 20,
        max_sessions_per_tenant: 10,
        execute_timeout: 300,
        max_read_bytes: 8 << 20,
        max_output_bytes: 1 << 20,
    };

    #[test]
    fn caps_and_lifetimes_change() {
        let next = P
            .apply(&json!({"max_sessions": 5, "execute_timeout": 30}))
            .expect("applied");
        assert_eq!(
            (
                next.max_sessions,
                next.execute_timeout,
                next.max_sessions_per_tenant
            ),
            (5, 30, 10)
        );
    }

    #[test]
    fn every_live_value_has_an_upper_bound_named_when_passed() {
        for (field, _, max, unit) in BOUNDS {
            let at = P
                .apply(&json!({ field: max }))
                .expect("the bound itself is fine");
            let i = BOUNDS.iter().position(|b| b.0 == field).expect("in BOUNDS");
            assert_eq!(at.values()[i], max);
            for over in [json!(max + 1), json!(u64::MAX), json!(1e30)] {
                let e = P
                    .apply(&json!({ field: over }))
                    .expect_err("over the bound");
                assert!(matches!(e, ServiceError::PolicyRefused(_)), "{field}");
                assert_eq!(
                    e.to_string(),
                    format!("The policy was not changed: {field} must be at most {max} {unit}")
                );
            }
        }
        let e = P
            .apply(&json!({"execute_timeout": u64::MAX, "max_read_bytes": u64::MAX, "max_sessions": 5}))
            .expect_err("over the bounds");
        assert_eq!(
            e.to_string(),
            "The policy was not changed: execute_timeout must be at most 86400 seconds; max_read_bytes must be at most 67108864 bytes"
        );
    }

    #[test]
    fn the_starting_policy_is_checked_against_the_same_bounds() {
        assert_eq!(P.check(), Ok(()));
        let over = Policy {
            execute_timeout: u64::MAX,
            ..P
        };
        assert_eq!(
            over.check(),
            Err(format!(
                "SANDBOXD_EXECUTE_TIMEOUT must be between 1 and 86400 seconds, not {}",
                u64::MAX
            ))
        );
        let zero = Policy {
            max_output_bytes: 0,
            ..P
        };
        assert_eq!(
            zero.check(),
            Err("SANDBOXD_MAX_OUTPUT_BYTES must be between 1 and 16777216 bytes, not 0".into())
        );
    }

    #[test]
    fn isolation_fields_are_refused_each_named_and_nothing_applies() {
        let e = P
            .apply(&json!({"max_sessions": 5, "network_mode": "bridge", "sandbox_uid": 0, "colour": 1, "max_read_bytes": 0}))
            .expect_err("refused");
        assert!(matches!(e, ServiceError::PolicyRefused(_)));
        assert_eq!(
            e.to_string(),
            "The policy was not changed: colour is not a policy field; the live fields are max_sessions, max_sessions_per_tenant, execute_timeout, max_read_bytes, max_output_bytes; max_read_bytes must be a whole number of at least 1; network_mode cannot change at runtime (it is an isolation decision); restart sandboxd with SANDBOXD_NETWORK_MODE; sandbox_uid cannot change at runtime (it is an isolation decision); restart sandboxd with SANDBOXD_SANDBOX_UID"
        );
    }
}
