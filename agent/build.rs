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
}
