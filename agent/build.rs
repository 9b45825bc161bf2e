//! Builds the UCX bridge (agent/ucx/shim.c), the eBPF object (ebpf/railguard.bpf.c) for the
//! target architecture, and the probe pattern's GPU kernels (agent/cuda/pattern.cu) as PTX.
//!
//! Without UCX headers or clang the agent still builds (a developer's laptop), and says at run
//! time what it lacks. `RAILGUARD_REQUIRE_NATIVE=1` (set by scripts/test.sh and the agent image)
//! turns either gap into a build error, so no image ships without its eBPF or its UCX transport.

#[path = "build/bpf_object.rs"]
mod bpf_object;

fn main() {
    println!("cargo:rerun-if-env-changed=RAILGUARD_REQUIRE_NATIVE");
    let required = std::env::var("RAILGUARD_REQUIRE_NATIVE").is_ok_and(|v| v == "1");
    let gap = |what: String| {
        if required {
            // A build script reports a hard failure by exiting non-zero with its reason.
            eprintln!("error: {what} (RAILGUARD_REQUIRE_NATIVE=1 makes this a build error)");
            std::process::exit(1);
        }
        println!("cargo:warning={what}");
    };
    build_ucx_shim(&gap);
    build_ebpf(&gap);
    build_ptx(&gap);
}

/// The pattern kernels as PTX (clang's NVPTX back end; no CUDA toolkit needed), which the
/// driver compiles for the GPU at load time. Without them probes in GPU memory are checked on
/// the host (every probe downloaded). The same source compiled for the host (agent/cuda/host.c)
/// lets the tests check the kernels' arithmetic on machines without a GPU.
fn build_ptx(gap: &dyn Fn(String)) {
    println!("cargo:rerun-if-changed=cuda/pattern.cu");
    println!("cargo:rerun-if-changed=cuda/host.c");
    println!("cargo:rustc-check-cfg=cfg(railguard_ptx)");
    cc::Build::new().file("cuda/host.c").warnings(true).compile("railguard_pattern_host");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("pattern.ptx");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    // sm_60 (Pascal) and later: 64-bit atomic min on global memory; the driver JIT-compiles the
    // PTX for newer GPUs (Hopper included).
    let run = std::process::Command::new(&clang)
        .args(["-x", "cuda", "--cuda-gpu-arch=sm_60", "--cuda-device-only", "-nocudainc", "-nocudalib", "-O3", "-S"])
        .arg("-o")
        .arg(&out)
        .arg("cuda/pattern.cu")
        .output();
    match run {
        Ok(o) if o.status.success() => println!("cargo:rustc-cfg=railguard_ptx"),
        Ok(o) => gap(format!(
            "the agent is built without its GPU pattern kernels ({clang} -x cuda failed: {}): probes in GPU memory are checked on the host",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => gap(format!(
            "the agent is built without its GPU pattern kernels ({clang} not found: {e}): probes in GPU memory are checked on the host"
        )),
    }
}

/// With UCX headers the shim talks to libucp (loaded at run time); without them the ucx
/// transport reports itself unavailable.
fn build_ucx_shim(gap: &dyn Fn(String)) {
    println!("cargo:rerun-if-changed=ucx/shim.c");
    println!("cargo:rerun-if-env-changed=UCX_INCLUDE_DIR");
    println!("cargo:rustc-check-cfg=cfg(railguard_ucx_headers)");
    let include = std::env::var("UCX_INCLUDE_DIR").unwrap_or_else(|_| "/usr/include".to_owned());
    let have_ucx = std::path::Path::new(&include).join("ucp/api/ucp.h").exists();
    let mut build = cc::Build::new();
    build.file("ucx/shim.c").include(&include).warnings(true);
    if have_ucx {
        build.define("RG_HAVE_UCX", None);
        println!("cargo:rustc-cfg=railguard_ucx_headers");
    } else {
        gap(format!(
            "UCX headers not found under {include} (apt-get install libucx-dev): the ucx transport will report itself unavailable"
        ));
    }
    build.compile("railguard_ucx_shim");
    println!("cargo:rustc-link-lib=dl");
}

/// Compiles the eBPF programs for CARGO_CFG_TARGET_ARCH; without them the agent runs on the
/// kernel log, NIC counters and NVML only, and says so at start.
fn build_ebpf(gap: &dyn Fn(String)) {
    println!("cargo:rerun-if-changed=../ebpf/railguard.bpf.c");
    println!("cargo:rerun-if-changed=../ebpf/railguard_events.h");
    println!("cargo:rerun-if-changed=build/bpf_object.rs");
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rustc-check-cfg=cfg(railguard_ebpf)");
    let target_arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("railguard.bpf.o");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let built = bpf_object::arch(&target_arch)
        .and_then(|arch| bpf_object::compile(&clang, std::path::Path::new("../ebpf/railguard.bpf.c"), arch, &out));
    match built {
        Ok(()) => println!("cargo:rustc-cfg=railguard_ebpf"),
        Err(e) => gap(format!("the agent is built without eBPF: {e}")),
    }
}
