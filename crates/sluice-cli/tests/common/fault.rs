//! A TCP relay the test controls, put between sluice and a peer (Redis, the rules service, a
//! quota service) to fail the way networks fail: slowly, silently, half-way through a reply.
//!
//! Every accepted connection is paired with a new connection to the peer and relayed by two
//! threads, one per direction. Each relayed chunk reads the fault in force when it arrives:
//!
//! - [`Fault::None`]: passed on at once;
//! - [`Fault::Latency`]: passed on after the delay (each direction, so a round trip costs two);
//! - [`Fault::Stall`]: held, with the connection up and nothing read or written (half-open, as
//!   a peer behind a dead route looks), until the fault changes;
//! - [`Fault::ResetMidReply`]: the peer's next chunk is cut in half: the first half reaches the
//!   client, then both connections are reset (RST);
//! - [`Fault::Garbage`]: the peer's answers are replaced by bytes that are no protocol at all;
//! - [`Fault::Refuse`]: new connections are reset as soon as they are accepted (the peer is
//!   down), live ones are reset too.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// What the relay does to the traffic from now on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    Latency(Duration),
    Stall,
    ResetMidReply,
    Garbage,
    Refuse,
}

/// The bytes [`Fault::Garbage`] answers with.
pub const GARBAGE: &[u8] = b"\x00\xffnot a protocol\r\n\x1b[2J";

/// How often a held relay thread looks at the fault again.
const POLL: Duration = Duration::from_millis(5);

struct Shared {
    upstream: Mutex<SocketAddr>,
    fault: Mutex<Fault>,
    /// Every live connection (both ends), to reset them all at once; the relay threads own
    /// them, so a connection both directions are done with is closed, not held here.
    live: Mutex<Vec<Weak<TcpStream>>>,
    accepted: AtomicU64,
    closed: AtomicBool,
}

/// The relay: listens on a free local port until dropped.
pub struct FaultProxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FaultProxy {
    /// Relays to `upstream`, faultless until told otherwise.
    pub fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream),
            fault: Mutex::new(Fault::None),
            live: Mutex::new(Vec::new()),
            accepted: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        });
        let accepting = Arc::clone(&shared);
        std::thread::spawn(move || accept(&listener, &accepting));
        Self { addr, shared }
    }

    /// `redis://` URL of the relay.
    pub fn redis_url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// `http://` URL of the relay.
    pub fn http_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set(&self, fault: Fault) {
        *self.shared.fault.lock().unwrap() = fault;
        if fault == Fault::Refuse {
            self.reset_all();
        }
    }

    /// Relays new connections to `upstream` from now on (a peer restarted on another port).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *self.shared.upstream.lock().unwrap() = upstream;
    }

    /// Resets (RST) every live connection; new ones are relayed as the fault says.
    pub fn reset_all(&self) {
        for stream in std::mem::take(&mut *self.shared.live.lock().unwrap()) {
            if let Some(stream) = stream.upgrade() {
                reset(&stream);
            }
        }
    }

    /// How many connections the relay has accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        self.reset_all();
        // Wake the accept loop so it sees `closed`.
        let _ = TcpStream::connect(self.addr);
    }
}

fn fault(shared: &Shared) -> Fault {
    *shared.fault.lock().unwrap()
}

fn reset(stream: &TcpStream) {
    // Linger 0: close sends RST, not FIN.
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
    let _ = stream.shutdown(Shutdown::Both);
}

fn accept(listener: &TcpListener, shared: &Arc<Shared>) {
    for client in listener.incoming() {
        if shared.closed.load(Ordering::Relaxed) {
            return;
        }
        let Ok(client) = client else { continue };
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        if fault(shared) == Fault::Refuse {
            reset(&client);
            drop(client);
            continue;
        }
        let upstream = *shared.upstream.lock().unwrap();
        let Ok(upstream) = TcpStream::connect(upstream) else {
            reset(&client);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let (client, upstream) = (Arc::new(client), Arc::new(upstream));
        {
            let mut live = shared.live.lock().unwrap();
            live.retain(|stream| stream.strong_count() > 0);
            live.push(Arc::downgrade(&client));
            live.push(Arc::downgrade(&upstream));
        }
        for (from, to, answers) in [
            (Arc::clone(&client), Arc::clone(&upstream), false),
            (upstream, client, true),
        ] {
            let shared = Arc::clone(shared);
            std::thread::spawn(move || relay(&from, &to, answers, &shared));
        }
    }
}

/// Copies `from` to `to` chunk by chunk under the fault of the moment; `answers` is the
/// peer-to-client direction.
fn relay(from: &TcpStream, to: &TcpStream, answers: bool, shared: &Shared) {
    let mut buffer = vec![0u8; 64 * 1024];
    let _ = from.set_read_timeout(Some(POLL));
    loop {
        // A stall reads nothing: the sender's socket buffers fill as on a dead route.
        while matches!(fault(shared), Fault::Stall) {
            if shared.closed.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(POLL);
        }
        let read = match (&*from).read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(_) => break,
        };
        let chunk = &buffer[..read];
        let sent = match fault(shared) {
            Fault::None => (&*to).write_all(chunk),
            Fault::Latency(delay) => {
                std::thread::sleep(delay);
                (&*to).write_all(chunk)
            }
            Fault::Stall => {
                // Read just before the stall began: hold it until the stall ends.
                while matches!(fault(shared), Fault::Stall) && !shared.closed.load(Ordering::Relaxed) {
                    std::thread::sleep(POLL);
                }
                (&*to).write_all(chunk)
            }
            Fault::ResetMidReply if answers => {
                let _ = (&*to).write_all(&chunk[..chunk.len().div_ceil(2)]);
                std::thread::sleep(POLL);
                reset(to);
                reset(from);
                return;
            }
            Fault::ResetMidReply => (&*to).write_all(chunk),
            Fault::Garbage if answers => (&*to).write_all(GARBAGE),
            Fault::Garbage => (&*to).write_all(chunk),
            Fault::Refuse => {
                reset(to);
                reset(from);
                return;
            }
        };
        if sent.is_err() {
            break;
        }
    }
    // One side closed: pass the close on (half-close, as TCP does).
    let _ = to.shutdown(Shutdown::Write);
}
