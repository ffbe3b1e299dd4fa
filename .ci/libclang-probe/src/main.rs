//! `libclang-probe [HEADER]`: generates Rust bindings the way librocksdb-sys's build
//! script does, from HEADER (RocksDB's `rocksdb/c.h`) or, without one, from a header that
//! includes what `c.h` includes. Exits non-zero, with bindgen's reason, when libclang or
//! clang's headers cannot be found.

use std::process::ExitCode;

const STANDARD_HEADERS: &str = "#include <stdarg.h>\n#include <stdbool.h>\n#include <stddef.h>\n#include <stdint.h>\nsize_t probe(uint64_t a, bool b, va_list c);\n";

fn main() -> ExitCode {
    let header = std::env::args().nth(1);
    let builder = bindgen::Builder::default().header_contents("probe.h", STANDARD_HEADERS);
    let builder = match &header {
        Some(path) => builder.header(path.as_str()),
        None => builder,
    };
    match builder.generate() {
        Ok(bindings) => {
            let text = bindings.to_string();
            if !text.contains("pub fn probe") {
                eprintln!("libclang-probe: bindings were generated but lack the probe function");
                return ExitCode::FAILURE;
            }
            let version = bindgen::clang_version();
            println!(
                "libclang-probe: ok: {} ({} bytes of bindings{})",
                version.full,
                text.len(),
                header.map(|h| format!(" including {h}")).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("libclang-probe: bindgen failed: {error}");
            ExitCode::FAILURE
        }
    }
}
