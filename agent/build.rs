//! Builds the UCX bridge (agent/ucx/shim.c). With UCX headers present it talks to libucp,
//! loaded at run time; without them it reports that UCX is unavailable.
fn main() {
    println!("cargo:rerun-if-changed=ucx/shim.c");
    println!("cargo:rerun-if-env-changed=UCX_INCLUDE_DIR");
    let include = std::env::var("UCX_INCLUDE_DIR").unwrap_or_else(|_| "/usr/include".to_owned());
    let have_ucx = std::path::Path::new(&include).join("ucp/api/ucp.h").exists();
    let mut build = cc::Build::new();
    build.file("ucx/shim.c").include(&include).warnings(true);
    if have_ucx {
        build.define("RG_HAVE_UCX", None);
        println!("cargo:rustc-cfg=railguard_ucx_headers");
    } else {
        println!(
            "cargo:warning=UCX headers not found under {include}: the ucx transport will report itself unavailable"
        );
    }
    println!("cargo:rustc-check-cfg=cfg(railguard_ucx_headers)");
    build.compile("railguard_ucx_shim");
    println!("cargo:rustc-link-lib=dl");
    build_ebpf();
}

/// Compiles ebpf/railguard.bpf.c with clang (`-target bpf`). Without clang the agent is built
/// without its eBPF programs and says so at run time.
fn build_ebpf() {
    println!("cargo:rerun-if-changed=../ebpf/railguard.bpf.c");
    println!("cargo:rerun-if-changed=../ebpf/railguard_events.h");
    println!("cargo:rustc-check-cfg=cfg(railguard_ebpf)");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("railguard.bpf.o");
    let arch_include = "/usr/include/x86_64-linux-gnu";
    let status = std::process::Command::new(std::env::var("CLANG").unwrap_or_else(|_| "clang".into()))
        .args(["-O2", "-g", "-target", "bpf", "-D__TARGET_ARCH_x86", "-Wall"])
        .arg(format!("-I{arch_include}"))
        .args(["-c", "../ebpf/railguard.bpf.c", "-o"])
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => println!("cargo:rustc-cfg=railguard_ebpf"),
        Ok(s) => println!("cargo:warning=clang failed ({s}) on ebpf/railguard.bpf.c: the agent is built without eBPF"),
        Err(e) => println!(
            "cargo:warning=clang not found ({e}): the agent is built without eBPF (apt-get install clang libbpf-dev)"
        ),
    }
}
