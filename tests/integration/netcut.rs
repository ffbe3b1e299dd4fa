//! A TCP link on loopback that a test can cut and heal: a network partition between a
//! process and what it dials, at the socket level, without root.
//!
//! The process dials the link's address instead of its peer's. While the link is whole,
//! bytes pass both ways as they come. Cut, it stops passing them and holds what it read,
//! and it holds new connections unanswered: to both ends the network has gone silent, as
//! when a cable is pulled (not a refusal, not a reset: requests time out). Healed, it
//! passes what it held and goes on, as TCP does when a partition heals within its
//! retransmission time.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// One cuttable link (module docs). Dropping it closes every connection through it.
pub struct Link {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// Whether the link is cut; waited on by the pumps.
    cut: Mutex<bool>,
    changed: Condvar,
    /// Where connections go: set later for a peer that starts after its link.
    target: Mutex<Option<SocketAddr>>,
    /// Every socket through the link, to close them all on drop.
    sockets: Mutex<Vec<TcpStream>>,
    closed: AtomicBool,
}

impl Shared {
    /// Waits while the link is cut or has no target yet; false once it is closed.
    fn wait_open(&self) -> bool {
        let mut cut = self.cut.lock().unwrap();
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return false;
            }
            if !*cut && self.target.lock().unwrap().is_some() {
                return true;
            }
            cut = self
                .changed
                .wait_timeout(cut, Duration::from_millis(100))
                .unwrap()
                .0;
        }
    }
}

impl Link {
    /// A link on a free loopback port to `target` (or to one set later with
    /// [`Link::set_target`]; connections wait until then).
    pub fn to(target: Option<SocketAddr>) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a link");
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let shared = Arc::new(Shared {
            target: Mutex::new(target),
            ..Shared::default()
        });
        let accepting = Arc::clone(&shared);
        std::thread::spawn(move || {
            while !accepting.closed.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((inbound, _)) => {
                        let shared = Arc::clone(&accepting);
                        std::thread::spawn(move || connect(&shared, inbound));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Link { addr, shared }
    }

    /// The address to dial instead of the target's.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where connections go from now on.
    pub fn set_target(&self, target: SocketAddr) {
        *self.shared.target.lock().unwrap() = Some(target);
        self.shared.changed.notify_all();
    }

    /// Cuts the link (`true`) or heals it (`false`).
    pub fn cut(&self, cut: bool) {
        *self.shared.cut.lock().unwrap() = cut;
        self.shared.changed.notify_all();
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.changed.notify_all();
        for socket in self.shared.sockets.lock().unwrap().drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}

/// Connects `inbound` to the target once the link is open, and pumps both ways.
fn connect(shared: &Arc<Shared>, inbound: TcpStream) {
    let _ = inbound.set_nonblocking(false);
    if !shared.wait_open() {
        return;
    }
    let target = shared.target.lock().unwrap().expect("open means a target");
    let Ok(outbound) = TcpStream::connect(target) else {
        return;
    };
    let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
    {
        let mut sockets = shared.sockets.lock().unwrap();
        for s in [&inbound, &outbound] {
            if let Ok(s) = s.try_clone() {
                sockets.push(s);
            }
        }
    }
    let (Ok(in2), Ok(out2)) = (inbound.try_clone(), outbound.try_clone()) else {
        return;
    };
    let back = Arc::clone(shared);
    std::thread::spawn(move || pump(&back, out2, in2));
    pump(shared, inbound, outbound);
}

/// Copies `from` to `to`, holding what it read while the link is cut.
fn pump(shared: &Shared, mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if !shared.wait_open() {
            return;
        }
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => n,
        };
        if !shared.wait_open() || to.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_link_holds_bytes_and_a_healed_one_delivers_them() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let link = Link::to(Some(server.local_addr().unwrap()));
        let mut client = TcpStream::connect(link.addr()).unwrap();
        let (mut accepted, _) = server.accept().unwrap();
        client.write_all(b"one").unwrap();
        let mut got = [0u8; 3];
        accepted.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"one");
        link.cut(true);
        client.write_all(b"two").unwrap();
        accepted
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let e = accepted.read(&mut got).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "a cut link passed bytes: {e}"
        );
        link.cut(false);
        accepted
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        accepted.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"two", "the healed link delivers what it held");
        accepted.write_all(b"back").unwrap();
        let mut back = [0u8; 4];
        client.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"back");
    }
}
