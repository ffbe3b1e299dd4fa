//! Helpers for running the real `hourglass` binary.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// What a finished command left behind.
pub struct Run {
    pub status: std::process::ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Run {
    /// The exit was zero; panics with stderr otherwise.
    pub fn ok(self) -> Run {
        assert!(self.status.success(), "command failed: {}", self.stderr);
        self
    }

    /// stdout as UTF-8 text.
    pub fn text(&self) -> String {
        String::from_utf8(self.stdout.clone()).expect("stdout is UTF-8")
    }

    /// stdout parsed as one JSON value.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.stdout)
            )
        })
    }
}

/// Runs `hourglass ARGS` with `stdin` as its standard input.
pub fn hourglass(args: &[&str], stdin: &[u8]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hourglass");
    let mut input = child.stdin.take().expect("stdin is piped");
    let stdin = stdin.to_vec();
    // Written from a thread so a large input cannot deadlock against a full stdout pipe.
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&stdin);
    });
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().expect("wait for hourglass");
    writer.join().expect("stdin writer");
    Run {
        status,
        stdout,
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// A fresh temporary directory, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "hourglass-test-{name}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970")
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    /// A path inside the directory, as a string for command lines.
    pub fn file(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `n` lines `prefix0`, `prefix1`, … as stdin bytes.
pub fn lines(prefix: &str, range: std::ops::Range<u64>) -> Vec<u8> {
    let mut out = Vec::new();
    for i in range {
        writeln!(out, "{prefix}{i}").expect("write to Vec");
    }
    out
}
