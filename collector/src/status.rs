//! A GPU's status, worst last. Stored as the Postgres enum `gpu_status_kind` (migration 0005),
//! declared in this same order, so the database sorts and aggregates (`max`) by severity.

/// Per-GPU status.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    sqlx::Type,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "gpu_status_kind", rename_all = "snake_case")]
pub enum GpuStatus {
    /// Its workload pair was verified and nothing else is known against it.
    Ok,
    /// Something to look at: unverified, a transient failure, a failing pair it does not use.
    Watch,
    /// Structural risk on the path it uses, repeated failures, or critical signals.
    AtRisk,
    /// Silent corruption confirmed on the pair its workload uses.
    Corrupting,
}

impl GpuStatus {
    pub const ALL: [GpuStatus; 4] = [GpuStatus::Ok, GpuStatus::Watch, GpuStatus::AtRisk, GpuStatus::Corrupting];

    pub fn as_str(self) -> &'static str {
        match self {
            GpuStatus::Ok => "ok",
            GpuStatus::Watch => "watch",
            GpuStatus::AtRisk => "at_risk",
            GpuStatus::Corrupting => "corrupting",
        }
    }

    pub fn parse(s: &str) -> Option<GpuStatus> {
        GpuStatus::ALL.into_iter().find(|g| g.as_str() == s)
    }
}

impl std::fmt::Display for GpuStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}
