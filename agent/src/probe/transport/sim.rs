//! The simulated fabric: stands in for GPUs and RDMA NICs this machine does not have. It moves
//! bytes with a memory copy; what goes wrong on which pair comes from the fault file, applied
//! by the engine exactly as for a real transport. Results are labelled `simulated`.

use std::time::Duration;

use railguard_schema::{DataPath, Transport};

use super::{ProbeTransport, Sabotage, TransferReport};

#[derive(Debug, Default)]
pub struct SimFabric;

impl ProbeTransport for SimFabric {
    fn kind(&self) -> Transport {
        Transport::Sim
    }

    fn data_path(&self) -> DataPath {
        DataPath::Simulated
    }

    fn transfer(
        &mut self,
        _nic: &str,
        src: &[u8],
        dst: &mut [u8],
        timeout: Duration,
        sabotage: Sabotage,
    ) -> TransferReport {
        match sabotage {
            Sabotage::None => {
                dst.copy_from_slice(src);
                TransferReport::success()
            }
            Sabotage::Truncate => {
                let half = src.len() / 2;
                dst[..half].copy_from_slice(&src[..half]);
                TransferReport::error("simulated: work completion with error after a partial transfer")
            }
            Sabotage::Stall => {
                std::thread::sleep(timeout.min(Duration::from_millis(50)));
                TransferReport::nothing("simulated: no completion before the deadline")
            }
        }
    }

    fn supports_sabotage(&self) -> bool {
        true
    }
}
