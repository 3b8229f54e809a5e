//! A TCP forwarder in front of a real server, whose connections a test can make go silent or
//! slow, or send elsewhere.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// How often a forwarding thread looks up from a blocking read to see whether it should stop.
const CHECK_EVERY: Duration = Duration::from_millis(20);

/// Forwards connections on a free loopback port to `target`, byte for byte, both ways.
///
/// [`ForwardingProxy::silence`] models a host that vanished without a word (powered off, its
/// address gone, a partition): the connections open then stay open but nothing more passes
/// on them, either way, and nothing closes them. Connections made after it are forwarded
/// again, as to a server back at the same address. Everything stops when the proxy is dropped.
///
/// [`ForwardingProxy::with_latency`] models a network between the two: what one side writes
/// reaches the other a fixed time later, in order. Each side's kernel still acknowledges what
/// it receives from the proxy at once, or with the next thing it sends back, as over a network
/// under load, where acknowledgements ride on the answers.
///
/// [`ForwardingProxy::freeze`] models a server that stopped working but not listening (a
/// process stopped with SIGSTOP, or stuck): connections are still accepted, and nothing passes
/// on any of them, either way, until [`ForwardingProxy::thaw`].
///
/// [`ForwardingProxy::retarget`] models a name that moves to another address (a failover
/// behind a DNS name): new connections reach the new target, open ones stay with the old.
pub struct ForwardingProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    /// Where connections accepted from now on are forwarded.
    target: Mutex<SocketAddr>,
    /// How long what is read takes to be written on, each way.
    one_way: Duration,
    /// Connections accepted before the latest `silence` have a lower generation.
    generation: AtomicU64,
    stopped: AtomicBool,
    /// While set, nothing is read from either side of any connection.
    frozen: AtomicBool,
    /// Every connection's two sockets, kept so silenced connections stay open.
    sockets: Mutex<Vec<TcpStream>>,
}

impl ForwardingProxy {
    /// Starts forwarding to `target`.
    pub fn start(target: SocketAddr) -> std::io::Result<ForwardingProxy> {
        ForwardingProxy::with_latency(target, Duration::ZERO)
    }

    /// Starts forwarding to `target`, everything delivered `one_way` after it was read, both
    /// ways: a round trip through the proxy takes twice that.
    pub fn with_latency(target: SocketAddr, one_way: Duration) -> std::io::Result<ForwardingProxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target: Mutex::new(target),
            one_way,
            generation: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            frozen: AtomicBool::new(false),
            sockets: Mutex::new(Vec::new()),
        });
        let accepting = Arc::clone(&shared);
        thread::spawn(move || accept(&listener, &accepting));
        Ok(ForwardingProxy { addr, shared })
    }

    /// The address to connect to instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://` and the proxy's address.
    pub fn redis_url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Makes every connection open now go silent for good; later ones are forwarded.
    pub fn silence(&self) {
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Stops passing anything on every connection, open or yet to come, until
    /// [`ForwardingProxy::thaw`].
    pub fn freeze(&self) {
        self.shared.frozen.store(true, Ordering::SeqCst);
    }

    /// Passes on again what was held since [`ForwardingProxy::freeze`].
    pub fn thaw(&self) {
        self.shared.frozen.store(false, Ordering::SeqCst);
    }

    /// Forwards connections made from now on to `target`, as a name that now resolves to
    /// another address; those open stay with the old one.
    pub fn retarget(&self, target: SocketAddr) {
        *self.shared.target.lock().unwrap_or_else(|e| e.into_inner()) = target;
    }
}

impl Drop for ForwardingProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        let sockets = self
            .shared
            .sockets
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for socket in sockets.iter() {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}

fn accept(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stopped.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                thread::sleep(CHECK_EVERY);
                continue;
            }
            Err(_) => return,
        };
        let target = *shared.target.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(server) = TcpStream::connect(target) else {
            continue;
        };
        let generation = shared.generation.load(Ordering::SeqCst);
        let sockets = [&client, &server].map(|s| {
            s.set_nonblocking(false)?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(CHECK_EVERY))?;
            s.try_clone()
        });
        let [Ok(a), Ok(b)] = sockets else {
            continue;
        };
        let (Ok(a_out), Ok(b_out)) = (a.try_clone(), b.try_clone()) else {
            continue;
        };
        shared
            .sockets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend([client, server]);
        for (from, to) in [(a, b_out), (b, a_out)] {
            let shared = Arc::clone(shared);
            thread::spawn(move || forward(from, to, generation, &shared));
        }
    }
}

/// Where a forwarding thread puts what it read.
enum Outlet {
    /// Written on at once.
    Now(TcpStream),
    /// Handed to a thread that writes each read on `one_way` after it was read.
    Later {
        due: Sender<(Instant, Vec<u8>)>,
        one_way: Duration,
    },
}

impl Outlet {
    fn new(to: TcpStream, one_way: Duration) -> Outlet {
        if one_way.is_zero() {
            return Outlet::Now(to);
        }
        let (sender, due) = channel();
        thread::spawn(move || deliver(&due, to));
        Outlet::Later {
            due: sender,
            one_way,
        }
    }

    /// Whether it could take `bytes`: false once the other side is gone.
    fn put(&mut self, bytes: &[u8]) -> bool {
        match self {
            Outlet::Now(to) => to.write_all(bytes).is_ok(),
            Outlet::Later { due, one_way } => due
                .send((Instant::now() + *one_way, bytes.to_vec()))
                .is_ok(),
        }
    }

    fn close(self) {
        match self {
            Outlet::Now(to) => {
                let _ = to.shutdown(Shutdown::Write);
            }
            // The delivering thread closes its side when it has written all it was given.
            Outlet::Later { due, .. } => drop(due),
        }
    }
}

/// Writes each read on `to` when it is due, in the order read, then closes `to`'s sending side.
fn deliver(due: &Receiver<(Instant, Vec<u8>)>, mut to: TcpStream) {
    for (at, bytes) in due {
        thread::sleep(at.saturating_duration_since(Instant::now()));
        if to.write_all(&bytes).is_err() {
            return;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// Copies `from` to `to` until either closes, the proxy stops, or the connection is silenced
/// (then the thread waits, reading nothing, until the proxy stops).
fn forward(mut from: TcpStream, to: TcpStream, generation: u64, shared: &Shared) {
    let mut outlet = Outlet::new(to, shared.one_way);
    let mut buffer = [0u8; 16 * 1024];
    while !shared.stopped.load(Ordering::SeqCst) {
        if shared.generation.load(Ordering::SeqCst) != generation
            || shared.frozen.load(Ordering::SeqCst)
        {
            thread::sleep(CHECK_EVERY);
            continue;
        }
        match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                // Silenced while this read waited: what it read goes nowhere, as it would on
                // the way to a host gone.
                if shared.generation.load(Ordering::SeqCst) != generation {
                    continue;
                }
                // Frozen while this read waited: held until thawed.
                while shared.frozen.load(Ordering::SeqCst) && !shared.stopped.load(Ordering::SeqCst)
                {
                    thread::sleep(CHECK_EVERY);
                }
                if !outlet.put(&buffer[..n]) {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    outlet.close();
}
