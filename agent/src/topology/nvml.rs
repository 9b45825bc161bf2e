//! NVML enrichment (names, UUIDs, NVLink, a cross-check of NVML's topology level), when the
//! NVIDIA driver is present. No driver: nothing happens and no error is raised.

use railguard_schema::PathClass;

use super::Topology;

/// Fills in what NVML knows. Returns NVML's error if it could not start (no driver).
pub fn enrich(topo: &mut Topology) -> Result<usize, nvml_wrapper::error::NvmlError> {
    use nvml_wrapper::Nvml;
    use nvml_wrapper::enum_wrappers::device::TopologyLevel;
    let nvml = Nvml::init()?;
    let count = nvml.device_count()?;
    let mut by_index = Vec::new();
    for i in 0..count {
        let Ok(dev) = nvml.device_by_index(i) else {
            continue;
        };
        let Ok(pci) = dev.pci_info() else { continue };
        let Ok(bdf) =
            railguard_schema::Bdf::parse_with_domain(&pci.bus_id.to_lowercase().replace("00000000:", "0000:"), 0)
        else {
            continue;
        };
        let Some(g) = topo.gpus.iter().position(|g| g.gpu.bdf == bdf) else {
            topo.warnings.push(format!("NVML reports GPU {bdf}, which sysfs does not show"));
            continue;
        };
        topo.gpus[g].gpu.name = dev.name().unwrap_or_default();
        topo.gpus[g].gpu.uuid = dev.uuid().unwrap_or_default();
        by_index.push((g, i, dev));
    }
    let mut switch_links = vec![0u32; topo.gpus.len()];
    for (a, _, da) in &by_index {
        for (b, nvml_b, _) in &by_index {
            if a >= b {
                continue;
            }
            let Ok(db) = nvml.device_by_index(*nvml_b) else {
                continue;
            };
            if let Ok(level) = da.topology_common_ancestor(db) {
                // NVML levels (docs/how-railguard-decides.md §2): SINGLE=10 PIX, MULTIPLE=20 PXB, HOSTBRIDGE=30 PHB, NODE=40, SYSTEM=50.
                let nvml_class = match level {
                    TopologyLevel::Internal => PathClass::X,
                    TopologyLevel::Single => PathClass::Pix,
                    TopologyLevel::Multiple => PathClass::Pxb,
                    TopologyLevel::HostBridge => PathClass::Phb,
                    TopologyLevel::Node => PathClass::Node,
                    TopologyLevel::System => PathClass::Sys,
                };
                if nvml_class != topo.gpu_gpu[*a][*b] {
                    topo.warnings.push(format!(
                        "NVML says the GPUs at {} and {} are {}, sysfs says {}",
                        topo.gpus[*a].gpu.bdf,
                        topo.gpus[*b].gpu.bdf,
                        nvml_class.label(),
                        topo.gpu_gpu[*a][*b].label()
                    ));
                }
            }
        }
        // NVLink: links straight to another GPU count for that pair; links to anything else are
        // NVSwitch ports, which join every GPU that has them (as nvidia-smi's NV# shows).
        for link in 0..18u32 {
            let l = da.link_wrapper_for(link);
            if !l.is_active().unwrap_or(false) {
                continue;
            }
            let Ok(remote) = l.remote_pci_info() else {
                continue;
            };
            let Ok(rb) = railguard_schema::Bdf::parse_with_domain(
                &remote.bus_id.to_lowercase().replace("00000000:", "0000:"),
                0,
            ) else {
                continue;
            };
            match topo.gpus.iter().position(|g| g.gpu.bdf == rb) {
                Some(b) if *a < b => *topo.nvlinks.entry((*a as u32, b as u32)).or_default() += 1,
                Some(_) => {}
                None => switch_links[*a] += 1,
            }
        }
    }
    for a in 0..switch_links.len() {
        for b in a + 1..switch_links.len() {
            let via_switch = switch_links[a].min(switch_links[b]);
            if via_switch > 0 {
                *topo.nvlinks.entry((a as u32, b as u32)).or_default() += via_switch;
            }
        }
    }
    Ok(by_index.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_means_no_enrichment_and_no_panic() {
        let mut t = Topology::discover(&super::super::SysRoot::new("/sys"), &super::super::SysRoot::new("/proc"));
        if std::path::Path::new("/proc/driver/nvidia").exists() {
            return; // a machine with the driver: enrichment is exercised for real there
        }
        let e = enrich(&mut t).unwrap_err();
        // No driver: the library (or its symbols) could not be loaded.
        assert!(
            matches!(
                e,
                nvml_wrapper::error::NvmlError::LibloadingError(_)
                    | nvml_wrapper::error::NvmlError::LibraryNotFound
                    | nvml_wrapper::error::NvmlError::DriverNotLoaded
            ),
            "{e:?}"
        );
    }
}
