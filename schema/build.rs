//! Compiles the wire schema with protox (pure Rust: no protoc on the build machine).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/railguard/v1/ingest.proto", "proto/k8s/podresources/v1/api.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(fds)?;
    Ok(())
}
