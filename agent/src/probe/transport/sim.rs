//! The simulated fabric: stands in for GPUs and RDMA NICs this machine does not have. It moves
//! bytes with a memory copy; what goes wrong on which pair comes from the fault file, applied
//! by the engine exactly as for a real transport. Results are labelled `simulated`.

use std::time::Duration;

use railguard_schema::{DataPath, Reported, Transport};

use super::{FailureMode, ProbeTransport, Sabotage, TransferReport};

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
            Sabotage::Truncate | Sabotage::PeerReset => {
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

    /// The simulated fabric's emulations of a failed transfer (simulated, and labelled so).
    fn failure_modes(&self) -> &'static [FailureMode] {
        const MODES: [FailureMode; 2] = [
            FailureMode { name: "short_write", sabotage: Sabotage::Truncate, reported: Reported::Error },
            FailureMode { name: "stall", sabotage: Sabotage::Stall, reported: Reported::Nothing },
        ];
        &MODES
    }
}
