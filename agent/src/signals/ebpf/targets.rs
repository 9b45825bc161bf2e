//! Which user-space functions the uprobes watch, and in which files: the target list (data, not
//! code: `watch --uprobe-targets FILE.json`), glob matching of library names (renamed copies in
//! Python wheels included), and finding the matching files mapped by running processes.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::EbpfError;

/// How a uprobe target's arguments or return value are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decoder {
    /// `(iface, struct mlx5_err_cqe *ecqe, txwq, int log_level)`: UCX's error-CQE hook.
    Mlx5ErrCqe,
    /// A function returning a status: a negative return is an error (NIXL calls, say).
    ReturnStatus,
}

impl Decoder {
    /// The kernel program that decodes this way (ebpf/railguard.bpf.c).
    pub fn program(self) -> &'static str {
        match self {
            Decoder::Mlx5ErrCqe => "ucx_completion_with_err",
            Decoder::ReturnStatus => "status_return",
        }
    }
}

/// One completion path to watch: files named like `glob` (`*` wildcards) exporting `symbol`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UprobeTarget {
    pub glob: String,
    pub symbol: String,
    pub decoder: Decoder,
}

/// The targets watched by default (see docs/how-railguard-decides.md, "Signals"): UCX's mlx5
/// transport, and Debian's older UCX, which exports the same function from `libuct_ib.so`.
pub fn default_targets() -> Vec<UprobeTarget> {
    vec![
        UprobeTarget {
            glob: "libuct_ib_mlx5*".into(),
            symbol: "uct_ib_mlx5_completion_with_err".into(),
            decoder: Decoder::Mlx5ErrCqe,
        },
        UprobeTarget {
            glob: "libuct_ib.so*".into(),
            symbol: "uct_ib_mlx5_completion_with_err".into(),
            decoder: Decoder::Mlx5ErrCqe,
        },
    ]
}

/// Reads a target list (JSON array of {glob, symbol, decoder}).
pub fn load_targets(path: &Path) -> Result<Vec<UprobeTarget>, EbpfError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| EbpfError::TargetFile { path: path.to_owned(), source })?;
    serde_json::from_str(&text).map_err(|source| EbpfError::TargetList { path: path.to_owned(), source })
}

/// `*` matches any run of characters; everything else literally.
pub fn glob_match(glob: &str, name: &str) -> bool {
    let parts: Vec<&str> = glob.split('*').collect();
    if parts.len() == 1 {
        return glob == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || !name[first.len()..].ends_with(last) || name.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    true
}

/// Files mapped by the processes under `proc_dir` whose names match a target: (file, index of
/// the target in `targets`).
pub fn mapped_targets(proc_dir: &Path, targets: &[UprobeTarget]) -> HashSet<(PathBuf, usize)> {
    let mut found = HashSet::new();
    for e in std::fs::read_dir(proc_dir).into_iter().flatten().flatten() {
        if !e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        let Ok(maps) = std::fs::read_to_string(e.path().join("maps")) else { continue };
        for l in maps.lines() {
            let Some(path) = l.split_whitespace().nth(5) else { continue };
            let Some(file) = Path::new(path).file_name().and_then(|f| f.to_str()) else { continue };
            for (i, t) in targets.iter().enumerate() {
                if glob_match(&t.glob, file) {
                    found.insert((PathBuf::from(path), i));
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_and_target_files() {
        assert!(glob_match("libuct_ib_mlx5*", "libuct_ib_mlx5.so.0.0.0"));
        assert!(glob_match("libuct_ib_mlx5*", "libuct_ib_mlx5-2fe1a3.so.0"), "renamed copy in a wheel");
        assert!(!glob_match("libuct_ib.so*", "libuct_ib_mlx5.so.0"));
        assert!(glob_match("*nixl*.so", "libnixl_ucx.so"));
        assert!(!glob_match("a*b*c", "acb"));
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.json");
        std::fs::write(&p, r#"[{"glob": "libnixl*", "symbol": "postXferReq", "decoder": "return_status"}]"#).unwrap();
        assert_eq!(load_targets(&p).unwrap()[0].decoder, Decoder::ReturnStatus);
        std::fs::write(&p, r#"[{"glob": "x", "symbol": "y", "decoder": "nope"}]"#).unwrap();
        assert!(matches!(load_targets(&p), Err(EbpfError::TargetList { .. })));
        assert!(matches!(load_targets(&d.path().join("absent.json")), Err(EbpfError::TargetFile { .. })));
    }

    #[test]
    fn mapped_libraries_are_found_by_glob() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("4242")).unwrap();
        std::fs::create_dir_all(d.path().join("self")).unwrap();
        std::fs::write(
            d.path().join("4242/maps"),
            "7f00-7f01 r-xp 00000000 08:01 1 /opt/wheel/nixl_cu12.libs/libuct_ib_mlx5-2fe1a3.so.0.0.0\n\
             7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/libc.so.6\n\
             7f04-7f05 rw-p 00000000 00:00 0\n",
        )
        .unwrap();
        let found = mapped_targets(d.path(), &default_targets());
        let want = PathBuf::from("/opt/wheel/nixl_cu12.libs/libuct_ib_mlx5-2fe1a3.so.0.0.0");
        assert_eq!(found, HashSet::from([(want, 0)]));
    }
}
