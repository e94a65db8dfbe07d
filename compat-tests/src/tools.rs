//! Finding the external tools the tests drive.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::repo_root;

/// `kcat` on `PATH`; fails the test with install instructions when missing.
pub fn kcat() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join("kcat");
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!("kcat not found: run tools/run-tests, which installs it with `apt-get install -y kcat`");
}

/// A `kcat` command (see [`kcat`]) that runs as a user would run it: with the system's
/// librdkafka. `cargo test` puts the bundled librdkafka of `rdkafka-sys` on
/// `LD_LIBRARY_PATH`, which Debian's dynamically linked kcat would otherwise pick up.
pub fn kcat_command() -> Command {
    let mut c = Command::new(kcat());
    c.env_remove("LD_LIBRARY_PATH");
    c
}

/// The Python interpreter with `confluent-kafka` and `kafka-python`: `$STRAND_PYTHON` or
/// `<repo>/.venv/bin/python`. Checked once per process; fails the test with install
/// instructions when missing.
pub fn python() -> PathBuf {
    static PY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let hint = "run tools/run-tests, which creates .venv with confluent-kafka==2.16.1 and \
                kafka-python==3.0.12 (pip install -r compat-tests/python/requirements.txt)";
    let py = PY.get_or_init(|| {
        let py = match std::env::var_os("STRAND_PYTHON") {
            Some(p) => PathBuf::from(p),
            None => repo_root().join(".venv").join("bin").join("python"),
        };
        if !py.exists() {
            return Err(format!("Python venv not found at {}: {hint}", py.display()));
        }
        let out = Command::new(&py)
            .args(["-c", "import confluent_kafka, kafka"])
            .output()
            .map_err(|e| format!("cannot run {}: {e}: {hint}", py.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} cannot import confluent_kafka and kafka ({}): {hint}",
                py.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(py)
    });
    match py {
        Ok(p) => p.clone(),
        Err(e) => panic!("{e}"),
    }
}

/// Directory of the Python client scripts.
pub fn python_scripts_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python")
}

/// Runs `cmd` feeding `stdin`, with a time limit; returns (status, stdout, stderr).
/// Panics if the command cannot be started or exceeds `timeout` (it is killed then).
pub fn run_with_input(mut cmd: Command, stdin: &[u8], timeout: Duration) -> (ExitStatus, Vec<u8>, Vec<u8>) {
    let desc = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {desc}: {e}"));
    let mut child_stdin = child.stdin.take().expect("stdin pipe");
    let input = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let r = child_stdin.write_all(&input);
        drop(child_stdin);
        r
    });
    let mut out_pipe = child.stdout.take().expect("stdout pipe");
    let mut err_pipe = child.stderr.take().expect("stderr pipe");
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out_pipe.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err_pipe.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let err = err_reader.join().unwrap_or_default();
            let err = String::from_utf8_lossy(&err);
            let lines: Vec<&str> = err.lines().collect();
            panic!(
                "{desc} did not finish within {timeout:?}; the end of its stderr:\n{}",
                lines[lines.len().saturating_sub(30)..].join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let write_result = writer.join().expect("stdin writer thread");
    let out = out_reader.join().expect("stdout reader thread");
    let err = err_reader.join().expect("stderr reader thread");
    if let Err(e) = write_result {
        if status.success() {
            panic!("{desc}: writing its stdin failed although it succeeded: {e}");
        }
    }
    (status, out, err)
}
