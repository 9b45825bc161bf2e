//! NVML evidence when the NVIDIA driver is present: critical Xid and ECC events (an NVML event
//! set), and polled counters — PCIe replays, uncorrected ECC errors, pages retired for double
//! bit errors — whose increases become events. No driver: [`spawn`] says so and nothing runs.
//! (Written against nvml-wrapper 0.13; not yet run on a GPU machine.)

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, RetirementCause};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use railguard_schema::{Bdf, SignalEvent, SignalKind, SignalSource};

use crate::stop::Stop;

fn bdf_of(bus_id: &str) -> Option<Bdf> {
    Bdf::parse_with_domain(&bus_id.to_lowercase().replace("00000000:", "0000:"), 0).ok()
}

fn event(kind: SignalKind, bdf: Option<Bdf>, summary: String, attrs: BTreeMap<String, String>) -> SignalEvent {
    SignalEvent { source: SignalSource::Nvml, kind, bdf, gpu: None, nic: String::new(), summary, attrs }
}

/// Starts the NVML watcher thread; events arrive on the returned channel until `stop`. Fails
/// when NVML cannot be initialised (no driver).
pub fn spawn(stop: Stop) -> Result<Receiver<SignalEvent>, NvmlError> {
    Nvml::init()?;
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        if let Err(e) = watch(&stop, &tx) {
            tracing::warn!(error = %e, "NVML watcher stopped");
        }
    });
    Ok(rx)
}

fn watch(stop: &Stop, tx: &Sender<SignalEvent>) -> Result<(), NvmlError> {
    let nvml = Nvml::init()?;
    let count = nvml.device_count()?;
    let mut set = nvml.create_event_set()?;
    let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR | EventTypes::SINGLE_BIT_ECC_ERROR;
    for i in 0..count {
        let dev = nvml.device_by_index(i)?;
        let types = dev.supported_event_types().map(|t| t & wanted).unwrap_or(EventTypes::empty());
        if !types.is_empty() {
            set = dev.register_events(types, set).map_err(|e| e.error)?;
        }
    }
    let mut last: HashMap<(u32, &'static str), u64> = HashMap::new();
    let mut next_poll = Instant::now();
    while !stop.is_stopped() {
        if let Ok(ev) = set.wait(500) {
            let bdf = ev.device.pci_info().ok().and_then(|p| bdf_of(&p.bus_id));
            if ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                let xid = match ev.event_data {
                    Some(XidError::Value(v)) => v.to_string(),
                    _ => "unknown".into(),
                };
                let _ = tx.send(event(
                    SignalKind::GpuXid,
                    bdf,
                    format!("NVML: critical Xid {xid}"),
                    BTreeMap::from([("xid".to_owned(), xid)]),
                ));
            } else {
                let which =
                    if ev.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) { "double bit" } else { "single bit" };
                let _ = tx.send(event(
                    SignalKind::GpuEcc,
                    bdf,
                    format!("NVML: {which} ECC error"),
                    BTreeMap::from([("ecc".to_owned(), which.to_owned())]),
                ));
            }
        }
        if Instant::now() < next_poll {
            continue;
        }
        next_poll = Instant::now() + Duration::from_secs(5);
        for i in 0..count {
            let Ok(dev) = nvml.device_by_index(i) else { continue };
            let bdf = dev.pci_info().ok().and_then(|p| bdf_of(&p.bus_id));
            let counters: [(&'static str, SignalKind, Option<u64>); 3] = [
                ("pcie_replay", SignalKind::GpuPcieReplay, dev.pcie_replay_counter().ok().map(u64::from)),
                (
                    "ecc_uncorrected_volatile",
                    SignalKind::GpuEcc,
                    dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile).ok(),
                ),
                (
                    "retired_pages_double_bit",
                    SignalKind::GpuRemappedRows,
                    dev.retired_pages(RetirementCause::DoubleBitEccError).ok().map(|p| p.len() as u64),
                ),
            ];
            for (name, kind, value) in counters {
                let Some(v) = value else { continue };
                if let Some(before) = last.insert((i, name), v)
                    && v > before
                {
                    let _ = tx.send(event(
                        kind,
                        bdf,
                        format!("NVML: {name} +{} (now {v})", v - before),
                        BTreeMap::from([
                            ("counter".to_owned(), name.to_owned()),
                            ("delta".to_owned(), (v - before).to_string()),
                        ]),
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_spawn_says_so() {
        if std::path::Path::new("/proc/driver/nvidia").exists() {
            return; // a GPU machine: the watcher runs for real there
        }
        let stop = Stop::new();
        stop.stop();
        let e = spawn(stop).unwrap_err();
        // No driver: the library (or its symbols) could not be loaded.
        assert!(
            matches!(e, NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound | NvmlError::DriverNotLoaded),
            "{e:?}"
        );
        assert_eq!(bdf_of("00000000:91:00.0"), Some(Bdf::new(0, 0x91, 0, 0)));
    }
}
