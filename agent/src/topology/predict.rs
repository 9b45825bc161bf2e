//! Which NIC a GPU's workload will use: UCX's auto-selection, a `UCX_NET_DEVICES` pin, and
//! NCCL's choice and GPUDirect decision (docs/how-railguard-decides.md §1–2).

use railguard_schema::PathClass;

use super::paths::ucx_rank;
use super::rdma::natural_cmp;

/// A `UCX_NET_DEVICES` value: unset/`all` means auto-selection.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NetDevices {
    #[default]
    Auto,
    /// `mlx5_0:1,mlx5_3:1` → [("mlx5_0", Some(1)), ("mlx5_3", Some(1))]. Non-RDMA entries
    /// (`eth0`, `lo`) are kept; they simply match no RDMA NIC.
    Devices(Vec<(String, Option<u32>)>),
}

impl NetDevices {
    pub fn parse(s: &str) -> NetDevices {
        let s = s.trim();
        if s.is_empty() || s == "all" {
            return NetDevices::Auto;
        }
        NetDevices::Devices(
            s.split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(|d| match d.split_once(':') {
                    Some((name, port)) => (name.to_owned(), port.parse().ok()),
                    None => (d.to_owned(), None),
                })
                .collect(),
        )
    }

    pub fn allows(&self, nic: &str) -> bool {
        match self {
            NetDevices::Auto => true,
            NetDevices::Devices(d) => d.iter().any(|(n, _)| n == nic),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            NetDevices::Auto => "unset".to_owned(),
            NetDevices::Devices(d) => d
                .iter()
                .map(|(n, p)| p.map(|p| format!("{n}:{p}")).unwrap_or_else(|| n.clone()))
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

/// An `NCCL_IB_HCA` value: `mlx5_0,mlx5_1`, `^mlx5_0` (exclude), `=mlx5_0` (exact names).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IbHca {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IbHca {
    pub fn parse(s: &str) -> Option<IbHca> {
        let mut s = s.trim();
        if s.is_empty() {
            return None;
        }
        let exclude = s.starts_with('^');
        s = s.trim_start_matches('^');
        let exact = s.starts_with('=');
        s = s.trim_start_matches('=');
        let names = s
            .split(',')
            .filter_map(|d| d.split(':').next())
            .map(|d| d.trim().to_owned())
            .filter(|d| !d.is_empty())
            .collect();
        Some(IbHca { exclude, exact, names })
    }

    pub fn allows(&self, nic: &str) -> bool {
        // Without '=', NCCL matches names by prefix.
        let hit = self.names.iter().any(|n| if self.exact { n == nic } else { nic.starts_with(n.as_str()) });
        hit != self.exclude
    }
}

/// What the workload on a GPU is expected to use.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Prediction {
    /// The closest NIC by path class (what "affine" means).
    pub affine_nic: Option<String>,
    /// The NIC UCX will use: auto-selection, or the closest allowed by the pin.
    pub predicted_nic: Option<String>,
    pub pinned: bool,
    pub predicted_class: Option<PathClass>,
    /// NCCL's NIC and whether it uses GPUDirect RDMA (path ≤ PXB, NCCL_NET_GDR_LEVEL default).
    pub nccl_nic: Option<String>,
    pub nccl_gdr: bool,
}

/// `nics[i]` = (name, class of the path from this GPU).
pub fn predict(nics: &[(&str, PathClass)], ucx: &NetDevices, nccl: Option<&IbHca>) -> Prediction {
    let best = |allowed: &dyn Fn(&str) -> bool, rank: &dyn Fn(PathClass) -> u8| -> Option<(String, PathClass)> {
        nics.iter()
            .filter(|(n, _)| allowed(n))
            .min_by(|a, b| rank(a.1).cmp(&rank(b.1)).then_with(|| natural_cmp(a.0, b.0)))
            .map(|(n, c)| ((*n).to_owned(), *c))
    };
    let affine = best(&|_| true, &|c| c as u8);
    let ucx_pick = best(&|n| ucx.allows(n), &ucx_rank);
    let nccl_pick = best(&|n| nccl.is_none_or(|h| h.allows(n)), &|c| c as u8);
    Prediction {
        affine_nic: affine.map(|a| a.0),
        pinned: ucx != &NetDevices::Auto,
        predicted_class: ucx_pick.as_ref().map(|p| p.1),
        predicted_nic: ucx_pick.map(|p| p.0),
        nccl_gdr: nccl_pick.as_ref().is_some_and(|p| p.1 <= PathClass::Pxb),
        nccl_nic: nccl_pick.map(|p| p.0),
    }
}

/// Reads `UCX_NET_DEVICES` and `NCCL_IB_HCA` from a process environment (`/proc/PID/environ`).
pub fn from_environ(environ: &[u8]) -> (NetDevices, Option<IbHca>) {
    let mut ucx = NetDevices::Auto;
    let mut nccl = None;
    for var in environ.split(|b| *b == 0) {
        let var = String::from_utf8_lossy(var);
        if let Some(v) = var.strip_prefix("UCX_NET_DEVICES=") {
            ucx = NetDevices::parse(v);
        } else if let Some(v) = var.strip_prefix("NCCL_IB_HCA=") {
            nccl = IbHca::parse(v);
        }
    }
    (ucx, nccl)
}

#[cfg(test)]
mod tests {
    use super::*;
    use PathClass::*;

    #[test]
    fn auto_picks_the_switch_neighbour_and_pins_override() {
        let nics = [("mlx5_0", Node), ("mlx5_1", Phb), ("mlx5_3", Pix)];
        let p = predict(&nics, &NetDevices::Auto, None);
        assert_eq!(p.predicted_nic.as_deref(), Some("mlx5_3"));
        assert_eq!(p.affine_nic.as_deref(), Some("mlx5_3"));
        assert!(p.nccl_gdr && !p.pinned);
        let p = predict(&nics, &NetDevices::parse("mlx5_0:1"), None);
        assert_eq!(p.predicted_nic.as_deref(), Some("mlx5_0"));
        assert_eq!(p.predicted_class, Some(Node));
        assert!(p.pinned);
        // UCX ties PIX and PXB: the name decides.
        let p = predict(&[("mlx5_1", Pix), ("mlx5_0", Pxb)], &NetDevices::Auto, None);
        assert_eq!(p.predicted_nic.as_deref(), Some("mlx5_0"));
        assert_eq!(p.affine_nic.as_deref(), Some("mlx5_1"));
        // A pin naming only non-RDMA devices leaves no RDMA NIC.
        assert_eq!(predict(&nics, &NetDevices::parse("eth0,lo"), None).predicted_nic, None);
    }

    #[test]
    fn nccl_hca_filters() {
        let nics = [("mlx5_0", Node), ("mlx5_3", Pix)];
        let excl = IbHca::parse("^mlx5_3").unwrap();
        let p = predict(&nics, &NetDevices::Auto, Some(&excl));
        assert_eq!(p.nccl_nic.as_deref(), Some("mlx5_0"));
        assert!(!p.nccl_gdr);
        assert!(IbHca::parse("=mlx5_1").unwrap().allows("mlx5_1"));
        assert!(!IbHca::parse("=mlx5_1").unwrap().allows("mlx5_10"));
        assert!(IbHca::parse("mlx5_1").unwrap().allows("mlx5_10"));
    }

    #[test]
    fn environ_is_read() {
        let env = b"PATH=/bin\0UCX_NET_DEVICES=mlx5_0:1\0NCCL_IB_HCA=^mlx5_2\0";
        let (u, n) = from_environ(env);
        assert_eq!(u, NetDevices::Devices(vec![("mlx5_0".into(), Some(1))]));
        assert!(!n.unwrap().allows("mlx5_2"));
    }
}
