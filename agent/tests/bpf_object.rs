//! The eBPF object builds for every architecture GPU nodes come in (x86_64, arm64/Grace), with
//! the same code and flags as build.rs, and each is really built for its own register layout.

#[path = "../build/bpf_object.rs"]
mod bpf_object;

/// ELF e_machine of a BPF object (EM_BPF).
const EM_BPF: u16 = 247;

#[test]
fn the_bpf_object_builds_for_x86_64_and_arm64() {
    let dir = tempfile::tempdir().unwrap();
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ebpf/railguard.bpf.c");
    let mut objects = Vec::new();
    for arch in bpf_object::SUPPORTED {
        let out = dir.path().join(format!("railguard-{}.bpf.o", arch.rust));
        bpf_object::compile("clang", &source, arch, &out).unwrap_or_else(|e| panic!("{}: {e}", arch.rust));
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(&bytes[..4], b"\x7fELF", "{}: not an ELF file", arch.rust);
        assert_eq!(u16::from_le_bytes([bytes[18], bytes[19]]), EM_BPF, "{}: not a BPF object", arch.rust);
        objects.push(bytes);
    }
    // The uprobe reads its arguments from registers whose offsets differ between the
    // architectures (x86 rsi vs arm64 regs[1]): the same bytes would mean the flag did nothing.
    assert_ne!(objects[0], objects[1], "x86_64 and arm64 objects are identical");
}

#[test]
fn an_unsupported_architecture_or_missing_headers_say_what_is_missing() {
    let e = bpf_object::arch("riscv64").unwrap_err();
    assert!(matches!(e, bpf_object::BpfBuildError::UnsupportedArch(ref a) if a == "riscv64"));
    assert!(e.to_string().contains("x86_64, aarch64"));
    let fake = bpf_object::BpfArch { rust: "x", bpf: "x", triple: "nowhere-linux-gnu" };
    let e = bpf_object::arch_include(fake).unwrap_err();
    assert!(
        matches!(e, bpf_object::BpfBuildError::NoArchHeaders { triple: "nowhere-linux-gnu", ref tried } if tried.len() == 2)
    );
    let dir = tempfile::tempdir().unwrap();
    let e = bpf_object::compile(
        "/nonexistent/clang",
        std::path::Path::new("x.c"),
        bpf_object::SUPPORTED[0],
        &dir.path().join("o"),
    )
    .unwrap_err();
    assert!(matches!(e, bpf_object::BpfBuildError::ClangMissing { .. }), "{e}");
}
