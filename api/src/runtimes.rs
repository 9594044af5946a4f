//! The runtimes of a host as `GET /v1/runtimes` shows them, with the state of their images.

use serde::{Deserialize, Serialize};

/// Where a runtime's image is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BuildState {
    /// Not there yet; a build (or pull) is queued or waits for its next attempt.
    Pending,
    /// Being built (or pulled) now.
    Building,
    /// The image is on this host; sessions open on it.
    Ready,
    /// Every attempt failed; opens answer with the build's error.
    Failed,
}

/// How an entry gets its image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeKind {
    /// A ready image, used as is.
    Image,
    /// Built from `base_image`.
    Build,
}

/// One runtime as `GET /v1/runtimes` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RuntimeStatus {
    /// The alias a session names.
    pub alias: String,
    /// What it is for.
    pub description: String,
    /// Whether it is the default (the allowlist's first entry).
    pub default: bool,
    /// `image` (used as is) or `build` (built from a base image).
    pub kind: RuntimeKind,
    /// The entry's `image` or `base_image`.
    pub source_image: String,
    /// The image sessions run: the entry's image, or the tag derived from the definition.
    pub tag: String,
    /// pending, building, ready or failed.
    pub state: BuildState,
    /// Build (or pull) attempts since the definition was last set.
    pub attempts: u32,
    /// The last attempt's error, if it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The last lines of the failed attempt's build log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_tail: Option<String>,
    /// Whether its sessions get a network.
    pub needs_network: bool,
    /// What stands between its sandboxes and the node's kernel (runc or gvisor).
    #[serde(default, skip_serializing_if = "sandboxd_catalog::Isolation::is_runc")]
    pub isolation: sandboxd_catalog::Isolation,
    /// Its egress policy as it is enforced (its `egress`, or what `needs_network` means).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<sandboxd_catalog::egress::Egress>,
    /// Its memory limit, if it names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_limit: Option<String>,
    /// Its warm pool on this host.
    #[serde(default)]
    pub warm_pool: WarmPool,
    /// The model briefing; only for an allowlist given in the catalog format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub briefing: Option<String>,
}

/// A runtime's warm pool on one host: started containers an open takes instead of starting one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WarmPool {
    /// How many it keeps ready (the entry's `warm_pool`; 0: none).
    pub size: u32,
    /// How many are ready now.
    pub ready: u32,
}

/// The body of `GET /v1/runtimes` and the answer of `PUT /v1/runtimes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RuntimeList {
    /// Whether the allowlist came in the catalog format (then it has briefings).
    pub catalog: bool,
    /// The runtimes, in allowlist order; the first is the default.
    pub runtimes: Vec<RuntimeStatus>,
    /// The isolation levels this host's dockerd offers (runc always; gvisor when it has the
    /// OCI runtime SANDBOXD_GVISOR_RUNTIME names).
    #[serde(default)]
    pub isolation: Vec<sandboxd_catalog::Isolation>,
}
