//! The PostgreSQL connection path of a network-fault run: a userspace TCP forwarder in the root
//! namespace, listening on the root end of the ledgers' veth link and relaying each connection
//! to the real server (which listens on the root namespace's loopback). Its accepted sockets get
//! the liveness a PostgreSQL server gets from the ledger's `tcp_keepalives_*` and
//! `tcp_user_timeout` options, so a ledger that vanished is noticed here as the server would
//! notice it, and the server's session (and its locks) ends with the relay. `kill` closes every
//! relayed connection at once: with the path blackholed, the ledgers' sockets stay half-open, as
//! with a database host that died.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use liveness::TcpLiveness;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running forwarder; stops (and closes every relayed connection) when dropped.
pub struct Forwarder {
    pub addr: SocketAddr,
    generation: watch::Sender<u64>,
    accept: JoinHandle<()>,
}

impl Forwarder {
    /// Listens on `listen` (port 0: any) and relays every connection to `upstream`.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr) -> anyhow::Result<Forwarder> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let (generation, watch) = watch::channel(0u64);
        let accept = tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let _ = down.set_nodelay(true);
                let _ = TcpLiveness::DEFAULT.apply(&down);
                tokio::spawn(relay(down, upstream, watch.clone()));
            }
        });
        Ok(Forwarder {
            addr,
            generation,
            accept,
        })
    }

    /// Closes every connection relayed so far, on both sides (new ones are still accepted).
    pub fn kill(&self) {
        self.generation.send_modify(|g| *g += 1);
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.accept.abort();
        self.kill();
    }
}

/// Relays one connection until either side ends it or [`Forwarder::kill`] is called.
async fn relay(mut down: TcpStream, upstream: SocketAddr, mut killed: watch::Receiver<u64>) {
    killed.borrow_and_update();
    let Ok(mut up) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = up.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
        _ = killed.changed() => {
            // A dead host says nothing more: no FIN to retransmit after the path heals; its
            // successor answers the ledger's next segment with a reset.
            let _ = rustix::net::sockopt::set_socket_linger(&down, Some(Duration::ZERO));
        }
    }
}

/// The forwarder's shared handle, as the chaos run's fault injector holds it.
pub type SharedForwarder = Arc<Forwarder>;
