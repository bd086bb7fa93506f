//! Child processes that cannot outlive the test process.
//!
//! Three layers make sure no etcd or kube-apiserver is ever orphaned:
//! 1. [`ManagedProcess`] kills its child on drop (normal teardown and unwinding panics);
//! 2. every child is spawned with `PR_SET_PDEATHSIG = SIGKILL`, so the kernel kills it when
//!    the test process dies in any way, even by SIGKILL. PDEATHSIG fires when the *thread*
//!    that forked the child exits, so all children are forked from one spawner thread that
//!    lives as long as the process;
//! 3. the shared environment registers an `atexit` hook (see `shared`).

use std::ffi::OsStr;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::TestEnvError;

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("dwd-testenv-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .map(|_| ())
            .unwrap_or_else(|e| eprintln!("dwd-testenv: cannot start spawner thread: {e}"));
        Mutex::new(tx)
    })
}

/// Makes the child of `cmd` die with us: the kernel SIGKILLs it when its parent goes
/// (PR_SET_PDEATHSIG), also when a test panics or is killed, so no apiserver or watchdog
/// outlives its test. The signal follows the *thread* that spawned the child, which is why
/// [`ManagedProcess`] spawns from one long-lived thread; a caller spawning from a runtime
/// worker relies on that worker living as long as the child. The one place the workspace's
/// tests and tools do this.
// `pre_exec` has no safe form: the closure runs between fork and exec.
#[allow(unsafe_code)]
pub fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl, getppid and _exit are async-signal-safe; the closure calls nothing else.
    unsafe {
        use std::os::unix::process::CommandExt;
        let parent = libc::getpid();
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// The signals tests and tools send to their children.
pub use rustix::process::Signal;

/// Sends `signal` to `child` (not reaped yet: the caller holds it). The one place the
/// workspace's tests and tools signal a child, without `unsafe`.
pub fn signal(child: &Child, signal: Signal) -> std::io::Result<()> {
    rustix::process::kill_process(rustix::process::Pid::from_child(child), signal)
        .map_err(std::io::Error::from)
}

/// How to start a [`ManagedProcess`] (from [`ManagedProcess::builder`]): program, arguments,
/// environment, working directory and where its output goes. Whatever is set here, the child
/// is forked from the spawner thread, dies with the test process and is killed on drop.
///
/// Output: [`log`](Self::log) (a fresh file) or [`append_log`](Self::append_log) take stdout
/// and stderr; [`stdout`](Self::stdout) and [`stderr`](Self::stderr) send one of them
/// elsewhere. Without a log, whatever is not redirected goes to `/dev/null`, as stdin always
/// does. The environment is inherited unless changed with [`env`](Self::env),
/// [`env_remove`](Self::env_remove) or [`env_clear`](Self::env_clear).
#[must_use = "a builder does nothing until spawn()"]
pub struct ProcessBuilder {
    name: String,
    command: Command,
    log: Option<(PathBuf, bool)>,
    stdout: Option<Stdio>,
    stderr: Option<Stdio>,
}

impl ProcessBuilder {
    /// Appends one argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.command.arg(arg);
        self
    }

    /// Appends arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.command.args(args);
        self
    }

    /// Sets one environment variable.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.command.env(key, value);
        self
    }

    /// Sets environment variables.
    pub fn envs<I, K, V>(mut self, vars: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        self.command.envs(vars);
        self
    }

    /// Removes one inherited (or earlier set) environment variable.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Self {
        self.command.env_remove(key);
        self
    }

    /// Starts from an empty environment: only what is set afterwards reaches the child.
    pub fn env_clear(mut self) -> Self {
        self.command.env_clear();
        self
    }

    /// The child's working directory (default: ours).
    pub fn current_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.command.current_dir(dir);
        self
    }

    /// Stdout and stderr to `path`, created or truncated: the file holds this process's
    /// output only.
    pub fn log(mut self, path: impl Into<PathBuf>) -> Self {
        self.log = Some((path.into(), false));
        self
    }

    /// Stdout and stderr appended to `path` (created if missing).
    pub fn append_log(mut self, path: impl Into<PathBuf>) -> Self {
        self.log = Some((path.into(), true));
        self
    }

    /// Stdout elsewhere than the log (e.g. [`Stdio::null`]).
    pub fn stdout(mut self, stdout: impl Into<Stdio>) -> Self {
        self.stdout = Some(stdout.into());
        self
    }

    /// Stderr elsewhere than the log (e.g. [`Stdio::inherit`]: into the test's output).
    pub fn stderr(mut self, stderr: impl Into<Stdio>) -> Self {
        self.stderr = Some(stderr.into());
        self
    }

    /// Runs `f` in the child between fork and exec, after the closures registered before it
    /// and before the parent-death signal is set (which a change of user would clear), e.g. to
    /// enter namespaces, chroot or drop privileges.
    ///
    /// # Safety
    ///
    /// As [`CommandExt::pre_exec`](std::os::unix::process::CommandExt::pre_exec): `f` runs in
    /// a forked copy of a multi-threaded process and may only call async-signal-safe
    /// functions (no allocation, no locks).
    #[allow(unsafe_code)]
    pub unsafe fn pre_exec<F>(mut self, f: F) -> Self
    where
        F: FnMut() -> std::io::Result<()> + Send + Sync + 'static,
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: the caller upholds pre_exec's contract (see above).
        unsafe {
            self.command.pre_exec(f);
        }
        self
    }

    /// Starts the process from the spawner thread.
    pub fn spawn(self) -> Result<ManagedProcess, TestEnvError> {
        let ProcessBuilder {
            name,
            mut command,
            log,
            stdout,
            stderr,
        } = self;
        let (mut out, mut err) = (stdout, stderr);
        if let Some((path, append)) = &log
            && (out.is_none() || err.is_none())
        {
            let file = File::options()
                .create(true)
                .write(true)
                .append(*append)
                .truncate(!*append)
                .open(path)
                .map_err(|e| TestEnvError::Io(format!("open log {}", path.display()), e))?;
            if err.is_none() {
                let clone = file
                    .try_clone()
                    .map_err(|e| TestEnvError::Io(format!("clone log {}", path.display()), e))?;
                err = Some(Stdio::from(clone));
            }
            if out.is_none() {
                out = Some(Stdio::from(file));
            }
        }
        command
            .stdin(Stdio::null())
            .stdout(out.unwrap_or_else(Stdio::null))
            .stderr(err.unwrap_or_else(Stdio::null));
        // Last: after any pre_exec of the caller, so a change of user cannot clear it.
        die_with_parent(&mut command);
        let program = command.get_program().to_string_lossy().into_owned();
        let (reply_tx, reply_rx) = mpsc::channel();
        spawner()
            .lock()
            .map_err(|_| TestEnvError::Spawn(name.clone(), "spawner lock poisoned".into()))?
            .send((command, reply_tx))
            .map_err(|_| TestEnvError::Spawn(name.clone(), "spawner thread is gone".into()))?;
        let child = reply_rx
            .recv()
            .map_err(|_| TestEnvError::Spawn(name.clone(), "spawner thread is gone".into()))?
            .map_err(|e| TestEnvError::Spawn(name.clone(), format!("{program}: {e}")))?;
        Ok(ManagedProcess {
            name,
            state: Mutex::new(State {
                child: Some(child),
                status: None,
            }),
            log_path: log.map(|(path, _)| path),
        })
    }
}

/// A running child process with its log file; killed when dropped.
///
/// The child is the one place the workspace's tests and tools start, signal, wait for and
/// kill a subprocess. Methods that observe or signal it take `&self` (the child sits behind a
/// lock), so a handle can be shared by the checks of a running test.
pub struct ManagedProcess {
    name: String,
    state: Mutex<State>,
    log_path: Option<PathBuf>,
}

/// The child until [`ManagedProcess::kill`] or [`ManagedProcess::stop`] reaps it, and its exit
/// status once known.
struct State {
    child: Option<Child>,
    status: Option<ExitStatus>,
}

impl State {
    /// The exit status, reaping the child if it has ended (it stays ours: the pid is not
    /// reused before it is reaped, and after that we know the status).
    fn poll(&mut self) -> Option<ExitStatus> {
        if self.status.is_none()
            && let Some(child) = self.child.as_mut()
        {
            self.status = child.try_wait().ok().flatten();
        }
        self.status
    }

    /// SIGKILLs the child unless it has ended, reaps it and keeps its status.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take()
            && self.status.is_none()
        {
            let _ = child.kill();
            self.status = child.wait().ok();
        }
    }
}

impl ManagedProcess {
    /// Spawns `program args…` with stdout and stderr appended to `log_path`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log_path: &Path,
    ) -> Result<Self, TestEnvError> {
        Self::builder(name, program)
            .args(args)
            .append_log(log_path)
            .spawn()
    }

    /// A [`ProcessBuilder`] for `program`; `name` is how errors and logs call it.
    pub fn builder(name: &str, program: impl AsRef<OsStr>) -> ProcessBuilder {
        ProcessBuilder {
            name: name.to_string(),
            command: Command::new(program),
            log: None,
            stdout: None,
            stderr: None,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent whatever panicked while holding the lock.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The name it was started with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Process id, until [`kill`](Self::kill) or [`stop`](Self::stop) reaped it.
    pub fn pid(&self) -> Option<u32> {
        self.state().child.as_ref().map(Child::id)
    }

    /// Whether the child has exited (reaping it if so).
    pub fn has_exited(&mut self) -> bool {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        state.child.is_none() || state.poll().is_some()
    }

    /// `Some(status)` once the child has exited (reaping it), `None` while it runs.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.state().poll()
    }

    /// Sends `signal` unless the child has exited (then there is nobody to signal: `Ok`).
    pub fn signal(&self, signal: Signal) -> std::io::Result<()> {
        let mut state = self.state();
        if state.poll().is_some() {
            return Ok(());
        }
        match state.child.as_ref() {
            // Not reaped: poll() saw it running under this lock, and only we reap it.
            Some(child) => self::signal(child, signal),
            None => Ok(()),
        }
    }

    /// Waits at most `timeout` for the child to exit, without blocking the async runtime
    /// (servers the child talks to on its way out may run on it): its status, or `None` if it
    /// still runs.
    pub async fn wait_exit(&self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exit_status() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The log's path, if it has one.
    pub fn log_path(&self) -> Option<&Path> {
        self.log_path.as_deref()
    }

    /// Everything in the log so far (empty without a log or when it cannot be read).
    pub fn log(&self) -> String {
        self.log_path
            .as_deref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    /// The last `max_bytes` of the log, for error messages.
    pub fn log_tail(&self, max_bytes: usize) -> String {
        match &self.log_path {
            Some(path) => log_tail(path, max_bytes),
            None => format!("<{} has no log>", self.name),
        }
    }

    /// Sends SIGTERM, waits up to `grace`, then SIGKILLs and reaps.
    pub fn stop(&mut self, grace: Duration) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if state.child.is_none() {
            return;
        }
        if state.poll().is_none() {
            if let Some(child) = state.child.as_ref() {
                // Not reaped yet: poll() saw it running.
                let _ = signal(child, Signal::TERM);
            }
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline && state.poll().is_none() {
                std::thread::sleep(Duration::from_millis(20));
            }
            if state.status.is_none() {
                tracing::debug!(process = %self.name, "killed after grace period");
            }
        }
        state.kill();
    }

    /// SIGKILLs and reaps at once.
    pub fn kill(&mut self) {
        self.state
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .kill();
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `max_bytes` of a file, lossily decoded.
pub fn log_tail(path: &Path, max_bytes: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let start = bytes.len().saturating_sub(max_bytes);
            String::from_utf8_lossy(&bytes[start..]).into_owned()
        }
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

/// Whether a process with this pid exists (and is not a zombie we could see).
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // Field 3 is the state; a zombie ('Z') has already exited.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X"))
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory and `<name>.log` in it, holding `before` when given.
    fn scratch_log(name: &str, before: Option<&str>) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("dwd-process-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join(format!("{name}.log"));
        if let Some(text) = before {
            std::fs::write(&log, text).unwrap();
        }
        (dir, log)
    }

    fn sh(name: &str, script: &str) -> ProcessBuilder {
        ManagedProcess::builder(name, "/bin/sh").args(["-c", script])
    }

    /// Spawns and waits for the exit; the process, for its status and log.
    async fn finished(builder: ProcessBuilder) -> ManagedProcess {
        let child = builder.spawn().unwrap();
        child.wait_exit(Duration::from_secs(10)).await.unwrap();
        child
    }

    #[tokio::test]
    async fn environment_directory_and_a_fresh_log_reach_the_child() {
        let (dir, log) = scratch_log("env", Some("left over from an earlier run\n"));
        let script = "echo \"$GIVEN ${DROPPED:-unset}\"; pwd; echo err >&2";
        let child = finished(
            sh("env", script)
                .env("GIVEN", "given")
                .env("DROPPED", "inherited")
                .env_remove("DROPPED")
                .current_dir(&dir)
                .log(&log),
        )
        .await;
        assert!(child.exit_status().is_some_and(|s| s.success()));
        let canonical = std::fs::canonicalize(&dir).unwrap();
        assert_eq!(
            child.log(),
            format!("given unset\n{}\nerr\n", canonical.display())
        );
        assert_eq!(child.log_path(), Some(log.as_path()));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn append_log_keeps_what_was_there_and_env_clear_empties_the_environment() {
        let (dir, log) = scratch_log("append", Some("before\n"));
        let script = "echo \"${HOME:-no home}\"";
        let child = finished(sh("append", script).env_clear().append_log(&log)).await;
        assert_eq!(child.log(), "before\nno home\n");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn stdout_can_leave_the_log() {
        let (dir, log) = scratch_log("stdout", None);
        let script = "echo out; echo err >&2";
        let child = finished(sh("stdout", script).log(&log).stdout(Stdio::null())).await;
        assert_eq!(child.log(), "err\n");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn exit_codes_signals_and_deadlines_are_reported() {
        let exits = sh("exit", "exit 3").spawn().unwrap();
        let status = exits.wait_exit(Duration::from_secs(10)).await.unwrap();
        assert_eq!(status.code(), Some(3));
        // Asked again, the status is remembered; signalling an ended process is no error.
        assert_eq!(exits.exit_status(), Some(status));
        exits.signal(Signal::TERM).unwrap();

        let sleeps = sh("sleep", "exec sleep 30").spawn().unwrap();
        assert_eq!(sleeps.wait_exit(Duration::from_millis(50)).await, None);
        assert!(sleeps.pid().is_some_and(pid_alive));
        sleeps.signal(Signal::TERM).unwrap();
        let status = sleeps.wait_exit(Duration::from_secs(10)).await.unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
    }

    #[test]
    fn kill_and_drop_end_the_child() {
        let mut killed = sh("killed", "exec sleep 30").spawn().unwrap();
        let pid = killed.pid().unwrap();
        killed.kill();
        assert!(!pid_alive(pid));
        assert!(killed.has_exited());
        assert_eq!(killed.pid(), None);
        assert!(killed.exit_status().is_some());

        let dropped = sh("dropped", "exec sleep 30").spawn().unwrap();
        let pid = dropped.pid().unwrap();
        drop(dropped);
        assert!(!pid_alive(pid));
    }
}
