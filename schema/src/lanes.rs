//! A transport's own account of what carried a transfer: its lanes, as `transport/device[:port]`
//! (`rc_mlx5/mlx5_0:1`, `rc_verbs/rxe0:1`, `tcp/lo`, `cma/memory`). UCX prints them so (its
//! endpoint's lanes, its protocol tables), and the verbs and NIXL transports report theirs the
//! same way.
//!
//! A probe is evidence for the pair (GPU, NIC) only when its lanes name that NIC
//! ([`names_nic`]): the agent records any other account as [`DataPath::OtherDevice`], and the
//! collector checks the lanes of every record it stores again, whatever the agent claimed.
//!
//! [`DataPath::OtherDevice`]: crate::DataPath::OtherDevice

/// One lane: UCX's transport name and the device it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lane<'a> {
    /// `rc_mlx5`, `rc_verbs`, `dc_mlx5`, `ud_verbs`, `tcp`, `cma`, `posix`, ...
    pub transport: &'a str,
    /// The device without its port: `mlx5_0`, `rxe0`, `lo`, `memory`.
    pub device: &'a str,
}

impl<'a> Lane<'a> {
    /// `transport/device[:port]`; None for anything else.
    pub fn parse(s: &'a str) -> Option<Lane<'a>> {
        let (transport, rest) = s.split_once('/')?;
        let device = rest.split(':').next().unwrap_or(rest);
        (!transport.is_empty() && !device.is_empty()).then_some(Lane { transport, device })
    }

    /// An RDMA transport (UCX's IB transports: RC, DC, UD over verbs or mlx5's own): the NIC
    /// moves the bytes by DMA. Sockets, shared memory, CMA and `self` do not.
    pub fn is_rdma(&self) -> bool {
        let t = self.transport;
        ["rc", "dc", "ud"].iter().any(|p| t == *p || t.starts_with(&format!("{p}_")))
    }
}

/// The lanes name the pair's NIC, and no other device: at least one RDMA lane, and every RDMA
/// lane on `nic`. (A non-RDMA lane beside them, UCX's wire-up over tcp say, carries no data of
/// an RDMA operation.)
pub fn names_nic<S: AsRef<str>>(lanes: &[S], nic: &str) -> bool {
    let mut rdma = lanes.iter().filter_map(|l| Lane::parse(l.as_ref())).filter(Lane::is_rdma).peekable();
    rdma.peek().is_some() && rdma.all(|l| l.device == nic)
}

/// The devices the RDMA lanes name, once each, in order: what carried the bytes when it was
/// not the pair's NIC.
pub fn rdma_devices<S: AsRef<str>>(lanes: &[S]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for l in lanes.iter().filter_map(|l| Lane::parse(l.as_ref())).filter(Lane::is_rdma) {
        if !out.contains(&l.device) {
            out.push(l.device);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_names_its_transport_and_device() {
        assert_eq!(Lane::parse("rc_mlx5/mlx5_0:1"), Some(Lane { transport: "rc_mlx5", device: "mlx5_0" }));
        assert_eq!(Lane::parse("tcp/lo"), Some(Lane { transport: "tcp", device: "lo" }));
        assert_eq!(Lane::parse("rxe0"), None);
        assert_eq!(Lane::parse("/mlx5_0"), None);
        assert!(Lane::parse("rc_verbs/rxe0:1").unwrap().is_rdma());
        assert!(Lane::parse("dc_mlx5/mlx5_2:1").unwrap().is_rdma());
        assert!(Lane::parse("ud/mlx5_2:1").unwrap().is_rdma());
        assert!(!Lane::parse("tcp/lo").unwrap().is_rdma());
        assert!(!Lane::parse("cma/memory").unwrap().is_rdma());
        assert!(!Lane::parse("rdmacm/mlx5_0").unwrap().is_rdma(), "the connection manager carries no data");
    }

    #[test]
    fn only_lanes_on_the_pairs_own_nic_name_it() {
        assert!(names_nic(&["rc_mlx5/mlx5_3:1"], "mlx5_3"));
        assert!(names_nic(&["rc_mlx5/mlx5_3:1", "ud_mlx5/mlx5_3:1", "tcp/lo"], "mlx5_3"), "wire-up beside");
        assert!(!names_nic(&["rc_verbs/rxe0:1"], "mlx5_3"), "another device's DMA");
        assert!(!names_nic(&["rc_mlx5/mlx5_3:1", "rc_mlx5/mlx5_0:1"], "mlx5_3"), "a lane on another NIC");
        assert!(!names_nic::<&str>(&[], "mlx5_3"), "no account at all");
        assert!(!names_nic(&["tcp/lo"], "lo"), "sockets are no NIC's DMA");
        assert!(!names_nic(&["rc_mlx5/mlx5_30:1"], "mlx5_3"), "a prefix is not the device");
        assert_eq!(rdma_devices(&["rc_verbs/rxe0:1", "ud_verbs/rxe0:1", "tcp/lo"]), ["rxe0"]);
    }
}
