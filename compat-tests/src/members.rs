//! What the members of consumer groups ([`crate::group`]) and share groups ([`crate::share`])
//! share, whatever their client: the log their events go to, and a member in a child process
//! that reports its events as JSON lines on stdout.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The events of one kind of member.
pub trait MemberEvent: Clone + Send + 'static {
    /// What a member's line in a log summary counts.
    type Counts: Default;

    /// Reads an event from a child's JSON line.
    fn from_json(v: &Value) -> Result<Self, String>;

    /// The error event a line that cannot be read becomes.
    fn unreadable(message: String) -> Self;

    /// Counts the event in `counts`; returns what the summary lists among a member's last
    /// errors and notes, if anything.
    fn count(&self, counts: &mut Self::Counts) -> Option<String>;

    /// A member's summary line, from its counts.
    fn counts_line(counts: &Self::Counts) -> String;

    /// Whether a line of a child's stderr is noise that every start prints (not shown).
    fn quiet(_stderr_line: &str) -> bool {
        false
    }
}

/// A line per member: its counts and its last five errors and notes (for failure messages).
pub fn summarize<E: MemberEvent>(log: &[Logged<E>]) -> String {
    let mut members: BTreeMap<&str, (E::Counts, Vec<String>)> = BTreeMap::new();
    for l in log {
        let (counts, notes) = members.entry(l.member.as_str()).or_default();
        notes.extend(l.event.count(counts));
    }
    members
        .iter()
        .map(|(name, (counts, notes))| {
            let last: Vec<&String> = notes.iter().rev().take(5).collect();
            format!("  {name}: {}, last errors/notes {last:?}", E::counts_line(counts))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The string `key` of a JSON event.
pub(crate) fn text(v: &Value, key: &str) -> Result<String, String> {
    v.get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| format!("missing {key} in {v}"))
}

/// An event with the member that reported it and when the test process received it.
#[derive(Clone, Debug)]
pub struct Logged<E> {
    /// The member's name.
    pub member: String,
    /// Arrival time.
    pub at: Instant,
    /// The event.
    pub event: E,
}

/// Every member's events, in arrival order (per member: in the member's order); shared by the
/// threads that read the members, and waited on by the test.
pub struct MemberLog<E> {
    inner: Arc<(Mutex<Vec<Logged<E>>>, Condvar)>,
}

impl<E> Clone for MemberLog<E> {
    fn clone(&self) -> Self {
        MemberLog {
            inner: self.inner.clone(),
        }
    }
}

impl<E> Default for MemberLog<E> {
    fn default() -> Self {
        MemberLog {
            inner: Arc::default(),
        }
    }
}

impl<E: MemberEvent> MemberLog<E> {
    /// An empty log.
    pub fn new() -> MemberLog<E> {
        MemberLog::default()
    }

    /// Appends an event of `member` and wakes the waiters.
    pub fn push(&self, member: &str, event: E) {
        let logged = Logged {
            member: member.to_string(),
            at: Instant::now(),
            event,
        };
        let (lock, cv) = &*self.inner;
        lock.lock().unwrap_or_else(|e| e.into_inner()).push(logged);
        cv.notify_all();
    }

    /// A copy of everything so far.
    pub fn snapshot(&self) -> Vec<Logged<E>> {
        self.inner.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until `check` (called on the whole log after each new event, and at least every
    /// 100 ms) returns `Some`; panics after `timeout` with `what` and a summary of the log.
    pub fn wait_for<T>(
        &self,
        timeout: Duration,
        what: &str,
        mut check: impl FnMut(&[Logged<E>]) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.inner;
        let mut v = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(t) = check(&v) {
                return t;
            }
            let now = Instant::now();
            if now >= deadline {
                let summary = summarize(&v);
                drop(v);
                panic!("timed out after {timeout:?} waiting for {what}; members so far:\n{summary}");
            }
            let wait = (deadline - now).min(Duration::from_millis(100));
            v = cv.wait_timeout(v, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// A per-member summary for failure messages.
    pub fn summary(&self) -> String {
        summarize(&self.snapshot())
    }
}

/// A member in a child process: its stdin takes commands (EOF asks it to stop), its stdout's
/// JSON lines are its events, its stderr is printed with its name. Dropping it kills the child.
pub struct ChildMember {
    /// Its name in the log.
    pub name: String,
    child: Child,
    reader: Option<JoinHandle<()>>,
}

impl ChildMember {
    /// Starts `cmd`; its events go to `log` under `name`.
    pub fn spawn<E: MemberEvent>(name: &str, mut cmd: Command, log: &MemberLog<E>) -> ChildMember {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start member {name} ({cmd:?}): {e}"));
        let stdout = child.stdout.take().expect("stdout pipe");
        let stderr = child.stderr.take().expect("stderr pipe");
        let (log, events_of) = (log.clone(), name.to_string());
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.trim().is_empty() {
                    continue;
                }
                let ev = serde_json::from_str::<Value>(&line)
                    .map_err(|e| e.to_string())
                    .and_then(|v| E::from_json(&v))
                    .unwrap_or_else(|e| E::unreadable(format!("unparsable line {line:?}: {e}")));
                log.push(&events_of, ev);
            }
        });
        let prefix = name.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if !E::quiet(&line) {
                    eprintln!("[{prefix}] {line}");
                }
            }
        });
        ChildMember {
            name: name.to_string(),
            child,
            reader: Some(reader),
        }
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child's stdin, for a command; panics once the member was asked to stop.
    pub fn stdin(&mut self) -> &mut ChildStdin {
        let name = &self.name;
        self.child
            .stdin
            .as_mut()
            .unwrap_or_else(|| panic!("member {name} was already stopped"))
    }

    /// SIGKILLs the child and waits for it and for the end of its output. Panics if it had
    /// already exited.
    pub fn kill9(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "member {} exited by itself ({status}) before it was killed",
                self.name
            );
        }
        self.child.kill().expect("SIGKILL the member");
        self.child.wait().expect("wait for the killed member");
        self.join_reader();
    }

    /// Closes its stdin (the member stops as its client does: commit, close, leave) and waits
    /// up to `timeout`. Panics if it does not end in time or fails.
    pub fn stop(&mut self, timeout: Duration) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait on a member") {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("member {} did not stop within {timeout:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.join_reader();
        assert!(status.success(), "member {} exited with {status}", self.name);
    }

    fn join_reader(&mut self) {
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl Drop for ChildMember {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
