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
    /// Not assessed: its node's stored inputs could not be assessed (the reason says why).
    /// Nothing is known against it, and nothing for it.
    Unknown,
    /// Structural risk on the path it uses, repeated failures, or critical signals.
    AtRisk,
    /// Silent corruption confirmed on the pair its workload uses.
    Corrupting,
}

impl GpuStatus {
    pub const ALL: [GpuStatus; 5] =
        [GpuStatus::Ok, GpuStatus::Watch, GpuStatus::Unknown, GpuStatus::AtRisk, GpuStatus::Corrupting];

    pub fn as_str(self) -> &'static str {
        match self {
            GpuStatus::Ok => "ok",
            GpuStatus::Watch => "watch",
            GpuStatus::Unknown => "unknown",
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

/// How a GPU's workload pair was verified in the window, by the strongest evidence there
/// (Postgres enum `gpu_verification`, weakest first).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
    sqlx::Type,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "gpu_verification", rename_all = "snake_case")]
pub enum Verification {
    /// No probe of the workload's pair in the window.
    #[default]
    Unprobed,
    /// Only probes that exercised no NIC (tcp, UCX over shared memory or sockets): unproven.
    Unproven,
    /// Probes of the simulated fabric (on a node whose whole fabric is simulated).
    Simulated,
    /// The pair's NIC moved the bytes by DMA, with host-memory buffers.
    HostMemory,
    /// The pair's NIC moved the bytes by DMA, GPU memory to GPU memory: the workload's path.
    GpuMemory,
}

impl Verification {
    /// The snake_case name (as in JSON and SQL).
    pub fn as_str(self) -> &'static str {
        match self {
            Verification::Unprobed => "unprobed",
            Verification::Unproven => "unproven",
            Verification::Simulated => "simulated",
            Verification::HostMemory => "host_memory",
            Verification::GpuMemory => "gpu_memory",
        }
    }

    /// In words, for a reason line.
    pub fn describe(self) -> &'static str {
        match self {
            Verification::Unprobed => "no probe",
            Verification::Unproven => "no NIC of the pair exercised",
            Verification::Simulated => "the simulated fabric, no hardware",
            Verification::HostMemory => "the NIC's DMA, host memory",
            Verification::GpuMemory => "the NIC's DMA, GPU memory to GPU memory",
        }
    }
}
