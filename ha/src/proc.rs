//! What every child process of a cell shares: a free loopback port, a child that is killed and
//! reaped when its handle is dropped, and waiting for a port to answer.

use std::net::TcpStream;
use std::process::Child;
use std::time::{Duration, Instant};

/// A free loopback port (bound, read, released: another process may take it meanwhile, which
/// the starts below notice as a failed start).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// True when this process runs as root (PostgreSQL's tools then run as `postgres`).
pub fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A child process killed (SIGKILL) and reaped when dropped.
#[derive(Debug)]
pub struct Kid {
    pub name: String,
    child: Option<Child>,
}

impl Kid {
    pub fn new(name: impl Into<String>, child: Child) -> Kid {
        Kid {
            name: name.into(),
            child: Some(child),
        }
    }

    /// The child's PID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// True while the child has not exited.
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL and reap (a machine lost at once, as the tests inject it).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Replace the (dead) child with a new one.
    pub fn replace(&mut self, child: Child) {
        self.kill();
        self.child = Some(child);
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until `addr` accepts a TCP connection, up to `timeout`.
pub fn wait_port(addr: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if TcpStream::connect(addr).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!("nothing answered on {addr} within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
