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

/// One finding: the layer its evidence implicates, the status that evidence calls for on its
/// layer, and the evidence in words.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Finding {
    pub layer: railguard_schema::Layer,
    /// What the evidence calls for. A GPU takes it only from the hardware layers of its own
    /// path (an undetermined finding at most `watch`; host, engine and remote ones not at all).
    pub calls_for: GpuStatus,
    pub reason: String,
}

/// The status a finding gives the GPU it was found on.
pub fn effect(layer: railguard_schema::Layer, calls_for: GpuStatus) -> GpuStatus {
    match layer {
        l if l.is_hardware() => calls_for,
        railguard_schema::Layer::Undetermined => calls_for.min(GpuStatus::Watch),
        _ => GpuStatus::Ok,
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
    /// The GPU has no RDMA NIC in use: no KV transfer path of it to verify.
    NoRdma,
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
            Verification::NoRdma => "no_rdma",
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
            Verification::NoRdma => "no RDMA NIC in use",
            Verification::Unprobed => "no probe",
            Verification::Unproven => "no NIC of the pair exercised",
            Verification::Simulated => "the simulated fabric, no hardware",
            Verification::HostMemory => "the NIC's DMA, host memory",
            Verification::GpuMemory => "the NIC's DMA, GPU memory to GPU memory",
        }
    }
}

/// What a record of probe evidence stands for, weakest first. The rule that decides it is
/// [`crate::evidence::trust`]; the value lives here so the read layer can decode it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Standing {
    /// Proves nothing of the pair: the probe engine and the host, at most.
    Unproven,
    /// The simulated fabric, standing in for hardware: no hardware was exercised.
    Simulated,
    /// The pair's NIC, by DMA in host memory.
    NicHostMemory,
    /// The pair's NIC, by DMA in GPU memory at both ends.
    NicGpuMemory,
}

impl Standing {
    pub const ALL: [Standing; 4] =
        [Standing::Unproven, Standing::Simulated, Standing::NicHostMemory, Standing::NicGpuMemory];

    /// The stable name used in JSON, SQL and labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Standing::Unproven => "unproven",
            Standing::Simulated => "simulated",
            Standing::NicHostMemory => "nic_host_memory",
            Standing::NicGpuMemory => "nic_gpu_memory",
        }
    }

    /// Evidence about the pair at all (a failure of it counts against the pair).
    pub fn is_trusted(self) -> bool {
        self != Standing::Unproven
    }

    /// Evidence of this standing can make a GPU whose KV cache moves in `kv` `ok`: the pair's
    /// NIC in that memory, or the simulated fabric standing in for it (marked so everywhere).
    pub fn proves(self, kv: railguard_schema::KvMemory) -> bool {
        match self {
            Standing::NicGpuMemory | Standing::Simulated => true,
            Standing::NicHostMemory => kv == railguard_schema::KvMemory::Host,
            Standing::Unproven => false,
        }
    }
}

impl std::str::FromStr for Standing {
    type Err = UnknownStanding;
    fn from_str(s: &str) -> Result<Standing, UnknownStanding> {
        Standing::ALL.into_iter().find(|x| x.as_str() == s).ok_or_else(|| UnknownStanding(s.to_owned()))
    }
}

/// Text that names no [`Standing`].
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a standing of evidence")]
pub struct UnknownStanding(String);

// Read from SQL as the text `railguard_standing` returns; unknown text is an error, never a default.
impl sqlx::Type<sqlx::Postgres> for Standing {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <&str as sqlx::Type<sqlx::Postgres>>::type_info()
    }
    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for Standing {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        Ok(<&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?.parse()?)
    }
}

impl std::fmt::Display for Standing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a pinned NIC's good verdicts were proven in (stored as `gpu_status.pin_evidence`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PinEvidence {
    /// Verified probes in GPU memory: the workload's own path.
    GpuMemory,
    /// Verified in host memory only: its GPU-memory path is unproven.
    HostMemory,
    /// Verified only on the simulated fabric.
    Simulated,
    /// No verdict yet: the NIC is structurally safe (through the root complex), nothing more.
    Unprobed,
}

impl PinEvidence {
    /// The metric label value and the stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            PinEvidence::GpuMemory => "gpu_memory",
            PinEvidence::HostMemory => "host_memory",
            PinEvidence::Simulated => "simulated",
            PinEvidence::Unprobed => "unprobed",
        }
    }
}
