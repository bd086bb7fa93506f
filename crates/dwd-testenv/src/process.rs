//! Child processes that cannot outlive the test process.
//!
//! Three layers make sure no etcd or kube-apiserver is ever orphaned:
//! 1. [`ManagedProcess`] kills its child on drop (normal teardown and unwinding panics);
//! 2. every child is spawned with `PR_SET_PDEATHSIG = SIGKILL`, so the kernel kills it when
//!    the test process dies in any way, even by SIGKILL. PDEATHSIG fires when the *thread*
//!    that forked the child exits, so all children are forked from one spawner thread that
//!    lives as long as the process;
//! 3. the shared environment registers an `atexit` hook (see `shared`).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::TestEnvError;

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

fn spawner() -> &'static std::sync::Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<std::sync::Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
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
        std::sync::Mutex::new(tx)
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

/// A running child process with its log file; killed when dropped.
pub struct ManagedProcess {
    name: String,
    child: Option<Child>,
    log_path: PathBuf,
}

impl ManagedProcess {
    /// Spawns `program args…` with stdout and stderr appended to `log_path`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log_path: &Path,
    ) -> Result<Self, TestEnvError> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(log_path)
            .map_err(|e| TestEnvError::Io(format!("open log {}", log_path.display()), e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| TestEnvError::Io(format!("clone log {}", log_path.display()), e))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        die_with_parent(&mut cmd);
        let (reply_tx, reply_rx) = mpsc::channel();
        spawner()
            .lock()
            .map_err(|_| TestEnvError::Spawn(name.to_string(), "spawner lock poisoned".into()))?
            .send((cmd, reply_tx))
            .map_err(|_| TestEnvError::Spawn(name.to_string(), "spawner thread is gone".into()))?;
        let child = reply_rx
            .recv()
            .map_err(|_| TestEnvError::Spawn(name.to_string(), "spawner thread is gone".into()))?
            .map_err(|e| {
                TestEnvError::Spawn(name.to_string(), format!("{}: {e}", program.display()))
            })?;
        Ok(ManagedProcess {
            name: name.to_string(),
            child: Some(child),
            log_path: log_path.to_path_buf(),
        })
    }

    /// Process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the child has exited (reaping it if so).
    pub fn has_exited(&mut self) -> bool {
        match self.child.as_mut() {
            None => true,
            Some(child) => !matches!(child.try_wait(), Ok(None)),
        }
    }

    /// The last `max_bytes` of the log, for error messages.
    pub fn log_tail(&self, max_bytes: usize) -> String {
        log_tail(&self.log_path, max_bytes)
    }

    /// Sends SIGTERM, waits up to `grace`, then SIGKILLs and reaps.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Not reaped yet: we hold it.
        let _ = signal(&child, Signal::TERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        tracing::debug!(process = %self.name, "killed after grace period");
    }

    /// SIGKILLs and reaps at once.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
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
