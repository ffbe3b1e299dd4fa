//! `scripts/install-deps --check --root DIR`: the detection itself, on fake machines. The
//! trap it must not fall into: Debian's base images ship `libclang-cpp.so.14` (the C++
//! library), which matches a loose `libclang*.so*` glob but is not the libclang bindgen
//! loads (clang-sys skips names containing `-cpp.`).

use crate::util::TempDir;
use std::path::Path;
use std::process::Command;

/// A fake machine's root, with empty files at `files` (paths relative to the root).
fn machine(name: &str, files: &[&str]) -> TempDir {
    let dir = TempDir::new(name);
    for file in files {
        let path = Path::new(&dir.file("")).join(file);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, b"").expect("write");
    }
    dir
}

/// The exit code and stderr of the check against `root`.
fn check(root: &TempDir) -> (i32, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-deps");
    let out = Command::new("bash")
        .arg(script)
        .args(["--check", "--root", &root.file("")])
        // The host's own settings must not leak into the fake machine.
        .env_remove("LIBCLANG_PATH")
        .output()
        .expect("run scripts/install-deps");
    (
        out.status.code().expect("exit code"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const CPP_ONLY: [&str; 2] = [
    "usr/lib/llvm-14/lib/libclang-cpp.so.14",
    "usr/lib/x86_64-linux-gnu/libclang-cpp.so.14",
];
const HEADERS: &str = "usr/lib/llvm-14/lib/clang/14.0.6/include/stddef.h";
const CXX: &str = "usr/bin/g++";

#[test]
fn libclang_cpp_alone_is_not_libclang() {
    let root = machine("deps-cpp-only", &[CPP_ONLY[0], CPP_ONLY[1], HEADERS, CXX]);
    let (code, stderr) = check(&root);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("missing: libclang"), "{stderr}");
    assert!(stderr.contains("would install: libclang1-14\n"), "{stderr}");
}

#[test]
fn the_names_clang_sys_loads_are_found() {
    // libclang1-14's files: the versioned library and the llvm-14 symlink to it.
    for lib in [
        "usr/lib/llvm-14/lib/libclang.so.1",
        "usr/lib/x86_64-linux-gnu/libclang-14.so.1",
        "usr/lib/x86_64-linux-gnu/libclang-14.so.14.0.6",
        "usr/local/lib/libclang.so",
        "usr/local/llvm17/lib/libclang-17.so",
    ] {
        let root = machine("deps-found", &[CPP_ONLY[0], lib, HEADERS, CXX]);
        let (code, stderr) = check(&root);
        assert_eq!(code, 0, "{lib}: {stderr}");
        assert!(
            stderr.contains(&format!("libclang: {}", root.file(lib))),
            "{lib}: {stderr}"
        );
    }
}

#[test]
fn clang_headers_and_a_cxx_compiler_are_required_too() {
    let lib = "usr/lib/llvm-14/lib/libclang.so.1";
    let root = machine("deps-no-headers", &[lib, CXX]);
    let (code, stderr) = check(&root);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("would install: libclang-common-14-dev\n"),
        "{stderr}"
    );

    let root = machine("deps-no-cxx", &[lib, HEADERS]);
    let (code, stderr) = check(&root);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("would install: g++\n"), "{stderr}");

    let root = machine("deps-empty", &[]);
    let (code, stderr) = check(&root);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("would install: libclang1-14 libclang-common-14-dev g++\n"),
        "{stderr}"
    );
}
