//! Which layer a finding's evidence implicates. A corrupt or failed KV transfer has many
//! possible culprits; railguard names the one its evidence points at, and only the hardware
//! layers of a GPU's own path (the GPU↔NIC fabric path, the NIC, the GPU) mark, pin or
//! quarantine that GPU. Host findings are the node's, engine findings the serving software's,
//! remote findings the other end's.

/// The layer a finding's evidence implicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// This GPU↔NIC DMA path: the PCIe route, IOMMU/ACS/ATS, passthrough.
    Fabric,
    /// The NIC itself (its error completions, its counters).
    Nic,
    /// The GPU itself (Xids, ECC, falling off the bus).
    Gpu,
    /// The node's configuration: driver, peermem/dma-buf, IOMMU mode, a setup that failed.
    Host,
    /// The serving software and its configuration (a block reused before its READ, a layout
    /// the two sides disagree on).
    Engine,
    /// The other end of the transfer (the prefill side's GPU or NIC).
    Remote,
    /// The evidence does not tell which (or proves nothing yet).
    Undetermined,
}

impl Layer {
    pub const ALL: [Layer; 7] =
        [Layer::Fabric, Layer::Nic, Layer::Gpu, Layer::Host, Layer::Engine, Layer::Remote, Layer::Undetermined];

    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Fabric => "fabric",
            Layer::Nic => "nic",
            Layer::Gpu => "gpu",
            Layer::Host => "host",
            Layer::Engine => "engine",
            Layer::Remote => "remote",
            Layer::Undetermined => "undetermined",
        }
    }

    pub fn parse(s: &str) -> Option<Layer> {
        Layer::ALL.into_iter().find(|l| l.as_str() == s)
    }

    /// A hardware layer of the GPU's own path: only these mark, pin or quarantine a GPU.
    pub fn is_hardware(self) -> bool {
        matches!(self, Layer::Fabric | Layer::Nic | Layer::Gpu)
    }

    /// In words, for a reason line.
    pub fn describe(self) -> &'static str {
        match self {
            Layer::Fabric => "the GPU↔NIC DMA path",
            Layer::Nic => "the NIC",
            Layer::Gpu => "the GPU",
            Layer::Host => "the host's configuration",
            Layer::Engine => "the serving engine",
            Layer::Remote => "the other end of the transfer",
            Layer::Undetermined => "undetermined",
        }
    }
}

/// A name that is not a layer's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown layer {0:?}")]
pub struct UnknownLayer(pub String);

impl std::str::FromStr for Layer {
    type Err = UnknownLayer;
    fn from_str(s: &str) -> Result<Self, UnknownLayer> {
        Layer::parse(s).ok_or_else(|| UnknownLayer(s.to_owned()))
    }
}

#[cfg(feature = "sqlx")]
impl sqlx::Type<sqlx::Postgres> for Layer {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <&str as sqlx::Type<sqlx::Postgres>>::type_info()
    }
    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

#[cfg(feature = "sqlx")]
impl<'r> sqlx::Decode<'r, sqlx::Postgres> for Layer {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        Ok(<&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?.parse()?)
    }
}

#[cfg(feature = "sqlx")]
impl sqlx::Encode<'_, sqlx::Postgres> for Layer {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        <&str as sqlx::Encode<sqlx::Postgres>>::encode(self.as_str(), buf)
    }
}

impl std::fmt::Display for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_only_the_gpus_own_path_is_hardware() {
        for l in Layer::ALL {
            assert_eq!(Layer::parse(l.as_str()), Some(l));
            assert_eq!(serde_json::to_value(l).unwrap(), l.as_str());
        }
        let hardware: Vec<Layer> = Layer::ALL.into_iter().filter(|l| l.is_hardware()).collect();
        assert_eq!(hardware, [Layer::Fabric, Layer::Nic, Layer::Gpu]);
    }
}
