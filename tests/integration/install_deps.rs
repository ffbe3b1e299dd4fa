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
    check_with(root, None)
}

/// The same with LIBCLANG_PATH set to `libclang_path` (a path inside `root`).
fn check_with(root: &TempDir, libclang_path: Option<&str>) -> (i32, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-deps");
    let mut command = Command::new("bash");
    command
        .arg(script)
        .args(["--check", "--root", &root.file("")])
        // The host's own settings must not leak into the fake machine.
        .env_remove("LIBCLANG_PATH");
    if let Some(path) = libclang_path {
        command.env("LIBCLANG_PATH", root.file(path));
    }
    let out = command.output().expect("run scripts/install-deps");
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
        let headers_17 = "usr/lib/llvm-17/lib/clang/17/include/stddef.h";
        let root = machine("deps-found", &[CPP_ONLY[0], lib, HEADERS, headers_17, CXX]);
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

/// Only the fake machine's directories count: directories this host lacks (another
/// LLVM, another architecture) are searched too, and this host's libraries are not.
#[test]
fn only_the_fake_machines_directories_count() {
    for (lib, headers) in [
        (
            "usr/lib/llvm-99/lib/libclang.so.1",
            "usr/lib/llvm-99/lib/clang/99.0.1/include/stddef.h",
        ),
        ("usr/lib/aarch64-linux-gnu/libclang-14.so.1", HEADERS),
    ] {
        let root = machine("deps-fake-dirs", &[lib, headers, CXX]);
        let (code, stderr) = check(&root);
        assert_eq!(code, 0, "{lib}: {stderr}");
    }
    let root = machine(
        "deps-fake-cpp",
        &["usr/lib/llvm-99/lib/libclang-cpp.so.99", HEADERS, CXX],
    );
    assert_eq!(check(&root).0, 1);
    // A root whose path holds a space.
    let root = machine(
        "deps space",
        &["usr/lib/llvm-14/lib/libclang.so.1", HEADERS, CXX],
    );
    let (code, stderr) = check(&root);
    assert_eq!(code, 0, "{stderr}");
}

/// The headers must be those of the libclang bindgen loads (the highest version found).
#[test]
fn headers_of_another_llvm_do_not_count() {
    let root = machine(
        "deps-headers-version",
        &[
            "usr/lib/x86_64-linux-gnu/libclang-14.so.1",
            "usr/lib/x86_64-linux-gnu/libclang-16.so.1",
            HEADERS,
            CXX,
        ],
    );
    let (code, stderr) = check(&root);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("libclang-16.so.1 (LLVM 16)"), "{stderr}");
    assert!(
        stderr.contains("would install: libclang-common-16-dev\n"),
        "{stderr}"
    );
}

/// With LIBCLANG_PATH set, bindgen looks there alone, and never takes libclang-cpp.
#[test]
fn libclang_path_is_the_only_place_when_set() {
    let files = [
        "usr/lib/llvm-14/lib/libclang.so.1",
        "opt/cpp/libclang-cpp.so.14",
        "opt/good/libclang-14.so.1",
        HEADERS,
        CXX,
    ];
    let root = machine("deps-libclang-path", &files);
    let (code, stderr) = check_with(&root, Some("opt/empty"));
    assert_eq!(code, 1, "an empty LIBCLANG_PATH directory: {stderr}");
    assert!(stderr.contains("LIBCLANG_PATH="), "{stderr}");
    let (code, stderr) = check_with(&root, Some("opt/cpp/libclang-cpp.so.14"));
    assert_eq!(code, 1, "LIBCLANG_PATH naming libclang-cpp: {stderr}");
    let (code, stderr) = check_with(&root, Some("opt/cpp"));
    assert_eq!(code, 1, "a directory with only libclang-cpp: {stderr}");
    let (code, stderr) = check_with(&root, Some("opt/good"));
    assert_eq!(code, 0, "{stderr}");
    let (code, stderr) = check_with(&root, Some("opt/good/libclang-14.so.1"));
    assert_eq!(code, 0, "{stderr}");
}
