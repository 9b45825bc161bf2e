//! Where the node's NIXL is: `--nixl-lib` (the library, or a directory holding it: a prefix, a
//! site-packages, a virtualenv), `NIXL_PREFIX` (an install from source), or the
//! `nixl-cu12`/`nixl-cu13` wheel in a Python site-packages (`PYTHONPATH`, the active virtualenv,
//! the system's, the user's, the virtualenv scripts/setup.sh makes under
//! `~/.cache/railguard/nixl`, the node's `python3`'s). The first found wins; when none is, the
//! error lists every place looked at.

use std::path::{Path, PathBuf};

use super::error::NixlError;

pub const LIB: &str = "libnixl_capi.so";

/// Where a NIXL install under `dir` keeps the C API: the directory itself, a prefix's lib
/// directories, or a wheel's libraries inside a site-packages.
fn under(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.join(LIB)];
    for lib in ["lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "lib64", "lib"] {
        out.push(dir.join(lib).join(LIB));
    }
    // The wheels (meson-python) keep their own libraries in a hidden directory beside the
    // package: `.nixl_cu12.mesonpy.libs/libnixl_capi.so`.
    let mut wheels: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".nixl") && n.ends_with(".mesonpy.libs"))
        .map(|n| dir.join(n).join(LIB))
        .collect();
    wheels.sort(); // cu12 before cu13: stable, whatever order the directory lists
    out.extend(wheels);
    out
}

/// `lib/python3.*/site-packages` (and `dist-packages`) under `prefix`.
fn site_packages(prefix: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        let mut pys: Vec<PathBuf> = std::fs::read_dir(prefix.join(lib))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        pys.sort();
        for py in pys {
            out.push(py.join("site-packages"));
            out.push(py.join("dist-packages"));
        }
    }
    out
}

/// The site-packages of the `python3` on PATH, if there is one.
fn python_site_packages() -> Vec<PathBuf> {
    let out = std::process::Command::new("python3")
        .args(["-I", "-c", "import site; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => {
            String::from_utf8_lossy(&o.stdout).lines().filter(|l| l.starts_with('/')).map(PathBuf::from).collect()
        }
        _ => Vec::new(),
    }
}

/// The directories to search, in order, for this environment (`env` reads a variable).
fn roots(explicit: Option<&Path>, env: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(p) = explicit.filter(|p| p.is_dir()) {
        // The directory itself (a site-packages, a prefix), or a virtualenv holding the wheel.
        dirs.push(p.to_owned());
        dirs.extend(site_packages(p));
    }
    if let Some(prefix) = env("NIXL_PREFIX").filter(|s| !s.is_empty()) {
        dirs.push(PathBuf::from(prefix));
    }
    if let Some(pp) = env("PYTHONPATH") {
        dirs.extend(pp.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    if let Some(venv) = env("VIRTUAL_ENV").filter(|s| !s.is_empty()) {
        dirs.extend(site_packages(Path::new(&venv)));
    }
    for prefix in ["/usr/local", "/usr"] {
        dirs.extend(site_packages(Path::new(prefix)));
    }
    dirs.push(PathBuf::from("/usr/lib/python3/dist-packages"));
    if let Some(home) = env("HOME").filter(|s| !s.is_empty()) {
        dirs.extend(site_packages(&Path::new(&home).join(".local")));
    }
    // The virtualenv scripts/setup.sh installs the wheel into (a developer's machine, CI).
    if let Some(venv) = setup_venv(env) {
        dirs.extend(site_packages(&venv));
    }
    // Last, wherever the node's python3 says its packages are (pyenv, conda, distro layouts).
    if explicit.is_none() {
        dirs.extend(python_site_packages());
    }
    let mut seen: Vec<PathBuf> = Vec::new();
    dirs.retain(|d| {
        let new = !seen.contains(d);
        seen.push(d.clone());
        new
    });
    dirs
}

/// The files that may be the library, in order.
pub fn candidates(explicit: Option<&Path>, env: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    if let Some(p) = explicit.filter(|p| !p.is_dir()) {
        return vec![p.to_owned()];
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for d in roots(explicit, env) {
        for c in under(&d) {
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

/// The NIXL C API library to load, or why there is none.
/// The virtualenv scripts/setup.sh installs NIXL (and numpy) into:
/// `${XDG_CACHE_HOME:-$HOME/.cache}/railguard/nixl`.
pub fn setup_venv(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    env("XDG_CACHE_HOME")
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .or_else(|| env("HOME").filter(|s| !s.is_empty()).map(|h| Path::new(&h).join(".cache")))
        .map(|cache| cache.join("railguard/nixl"))
}

/// The Python of that virtualenv (railguard's NIXL library and its tests), or
/// `RAILGUARD_NIXL_PYTHON`; None when neither exists.
pub fn setup_python(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(p) = env("RAILGUARD_NIXL_PYTHON").filter(|s| !s.is_empty()) {
        return Some(PathBuf::from(p));
    }
    setup_venv(env).map(|v| v.join("bin/python")).filter(|p| p.exists())
}

pub fn locate(explicit: Option<&Path>, env: &dyn Fn(&str) -> Option<String>) -> Result<PathBuf, NixlError> {
    let all = candidates(explicit, env);
    if let Some(found) = all.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    if let Some(p) = explicit.filter(|p| !p.is_dir()) {
        return Err(NixlError::NoSuchLibrary(p.to_owned()));
    }
    let dirs: Vec<String> = roots(explicit, env).iter().map(|p| p.display().to_string()).collect();
    Err(NixlError::NotFound { lib: LIB, looked: dirs })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"").unwrap();
    }

    #[test]
    fn finds_the_wheel_in_a_virtualenv_a_pythonpath_or_a_prefix() {
        let tmp = tempfile::tempdir().unwrap();
        let venv = tmp.path().join("venv");
        let wheel = venv.join("lib/python3.11/site-packages/.nixl_cu12.mesonpy.libs").join(LIB);
        touch(&wheel);
        let env_of = |vars: Vec<(&'static str, String)>| {
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
        };

        let venv_env = env_of(vec![("VIRTUAL_ENV", venv.display().to_string())]);
        assert_eq!(locate(None, &venv_env).unwrap(), wheel);

        let pp = env_of(vec![(
            "PYTHONPATH",
            format!("/nonexistent:{}", venv.join("lib/python3.11/site-packages").display()),
        )]);
        assert_eq!(locate(None, &pp).unwrap(), wheel);

        // A source install under NIXL_PREFIX is preferred to a wheel further down the list.
        let prefix = tmp.path().join("opt/nixl");
        let built = prefix.join("lib/x86_64-linux-gnu").join(LIB);
        touch(&built);
        let both =
            env_of(vec![("NIXL_PREFIX", prefix.display().to_string()), ("VIRTUAL_ENV", venv.display().to_string())]);
        assert_eq!(locate(None, &both).unwrap(), built);

        // --nixl-lib wins over everything: a file, or a directory searched the same way (a
        // site-packages, or the virtualenv itself).
        assert_eq!(locate(Some(&wheel), &both).unwrap(), wheel);
        assert_eq!(locate(Some(&venv.join("lib/python3.11/site-packages")), &both).unwrap(), wheel);
        assert_eq!(locate(Some(&venv), &env_of(vec![])).unwrap(), wheel);

        // scripts/setup.sh's virtualenv, under the cache directory.
        let cache = tmp.path().join("cache");
        let setup = cache.join("railguard/nixl/lib/python3.11/site-packages/.nixl_cu12.mesonpy.libs").join(LIB);
        touch(&setup);
        let xdg = env_of(vec![("XDG_CACHE_HOME", cache.display().to_string())]);
        assert_eq!(locate(None, &xdg).unwrap(), setup);
    }

    #[test]
    fn says_where_it_looked_when_there_is_none() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().display().to_string();
        let env = move |k: &str| (k == "HOME").then(|| home.clone());
        let e = locate(None, &env).unwrap_err().to_string();
        assert!(e.contains("pip install nixl-cu12") && e.contains("/usr/lib/python3/dist-packages"), "{e}");
        let missing = tmp.path().join("nope.so");
        let e = locate(Some(&missing), &env).unwrap_err().to_string();
        assert!(e.contains("--nixl-lib") && e.contains("nope.so"), "{e}");
    }
}
