//! Packet steering under a Gunicorn master: which UDP socket this worker
//! serves, and the group's BPF program ([`bpf`](super::bpf)).
//!
//! `skirr.RustWorker`, in the master before the first fork, binds K UDP
//! sockets per HTTP/3 address in one `SO_REUSEPORT` group and keeps them
//! open for the master's life, so a socket's index in the group is its
//! bind order and never moves (the kernel renumbers only when a member
//! closes). Every worker inherits them all (`http3_steer`: a lock file's
//! descriptor and the groups' descriptors in bind order). The worker:
//!
//! 1. claims a slot `i` < K: a POSIX write lock on byte `1 + 2i` of the
//!    lock file, which the kernel drops when the process dies, even by
//!    SIGKILL (no pid to go stale or be reused);
//! 2. serves socket `i` of each group and closes the others' descriptors
//!    (the master keeps them open); its connection IDs start with `i`;
//! 3. while it accepts new connections, holds byte `2 + 2i` too ("active");
//!    a draining worker lets it go;
//! 4. whenever its state changes, and every [`TICK`], rebuilds the program
//!    from the locks it sees (under the lock on byte 0) and, if it differs
//!    from the one last attached (recorded in the file at [`RECORD`]),
//!    attaches it to its socket of each group: a dead worker's slot leaves
//!    the program within a [`TICK`] of its death.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg};
use parking_lot::Mutex;

use super::bpf::{self, Slots};

/// How often a worker looks for slots whose owner died.
pub(crate) const TICK: Duration = Duration::from_secs(1);

/// Where in the lock file the slots of the program last attached are
/// recorded: a bitmap of the held slots, then one of the active (32 bytes
/// each).
const RECORD: u64 = 4096;

/// This worker's part, once claimed (process-wide: one per worker, which
/// has one set of inherited sockets).
struct Steering {
    file: std::fs::File,
    slot: u8,
    /// K, the sockets per group.
    k: u8,
    /// The claimed sockets not yet handed to an endpoint, by address.
    unbound: Mutex<HashMap<SocketAddr, OwnedFd>>,
    /// Duplicates of the sockets served, to attach the program through.
    served: Mutex<Vec<OwnedFd>>,
    /// Whether this worker takes new connections; guards [`sync`] against
    /// this process's other threads (POSIX locks do not).
    active: Mutex<bool>,
    ticking: std::sync::Once,
    warned: std::sync::Once,
}

static STEERING: OnceLock<Option<Steering>> = OnceLock::new();

fn flock(kind: libc::c_int, start: u64) -> libc::flock {
    // SAFETY: `libc::flock` is a plain C struct of integers, for which all
    // zeroes is a valid value (the fields that matter are set below).
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l.l_start = start as libc::off_t;
    l.l_len = 1;
    l
}

fn lock(fd: BorrowedFd<'_>, kind: libc::c_int, byte: u64, wait: bool) -> bool {
    let l = flock(kind, byte);
    let arg = if wait {
        FcntlArg::F_SETLKW(&l)
    } else {
        FcntlArg::F_SETLK(&l)
    };
    fcntl(fd, arg).is_ok()
}

fn held_by_other(fd: BorrowedFd<'_>, byte: u64) -> bool {
    let mut l = flock(libc::F_WRLCK, byte);
    match fcntl(fd, FcntlArg::F_GETLK(&mut l)) {
        Ok(_) => l.l_type != libc::F_UNLCK as libc::c_short,
        Err(_) => false,
    }
}

fn owned_byte(slot: u8) -> u64 {
    1 + 2 * u64::from(slot)
}

fn active_byte(slot: u8) -> u64 {
    2 + 2 * u64::from(slot)
}

/// Claims a slot and takes its sockets; `None` (after a warning) when all
/// K slots are held. Closes the other slots' descriptors either way.
fn claim(cfg: &crate::config::http3::Steer) -> io::Result<Option<Steering>> {
    // SAFETY: the descriptors are the master's, inherited, and handed to
    // this worker's Rust core alone (`skirr.RustWorker` detaches them from
    // their Python objects); each is taken once, here.
    let take = |fd: RawFd| unsafe { OwnedFd::from_raw_fd(fd) };
    let file = std::fs::File::from(take(cfg.lock_fd));
    let k = cfg.groups.first().map_or(0, Vec::len).min(255);
    let slot = (0..k as u8).find(|&i| lock(file.as_fd(), libc::F_WRLCK, owned_byte(i), false));
    let mut unbound = HashMap::new();
    for group in &cfg.groups {
        for (i, &fd) in group.iter().enumerate() {
            let fd = take(fd);
            if Some(i) == slot.map(usize::from) {
                let addr = nix::sys::socket::getsockname::<nix::sys::socket::SockaddrStorage>(
                    std::os::fd::AsRawFd::as_raw_fd(&fd),
                )?;
                let addr = match (addr.as_sockaddr_in(), addr.as_sockaddr_in6()) {
                    (Some(a), _) => SocketAddr::from(std::net::SocketAddrV4::from(*a)),
                    (_, Some(a)) => SocketAddr::from(std::net::SocketAddrV6::from(*a)),
                    _ => continue,
                };
                unbound.insert(addr, fd);
            }
        }
    }
    let Some(slot) = slot else {
        tracing::warn!(
            "HTTP/3: all {k} UDP sockets of the master are taken; this worker binds its own, \
             which gets few packets (raise the worker count only with a restart)"
        );
        return Ok(None);
    };
    tracing::info!(
        "HTTP/3: packets steered by connection ID; this worker serves slot {slot} of {k}"
    );
    Ok(Some(Steering {
        file,
        slot,
        k: k as u8,
        unbound: Mutex::new(unbound),
        served: Mutex::new(Vec::new()),
        active: Mutex::new(false),
        ticking: std::sync::Once::new(),
        warned: std::sync::Once::new(),
    }))
}

fn steering(cfg: &crate::config::Config) -> Option<&'static Steering> {
    let steer = cfg.http3.as_ref()?.steer.as_ref()?;
    STEERING
        .get_or_init(|| match claim(steer) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(
                    "HTTP/3: packet steering off, the master's sockets are unusable: {e}"
                );
                None
            }
        })
        .as_ref()
}

/// The UDP socket this worker serves at `addr`: its slot's socket from the
/// master, or `None` without steering (the caller binds its own).
pub(crate) fn socket(
    addr: SocketAddr,
    cfg: &crate::config::Config,
) -> io::Result<Option<std::net::UdpSocket>> {
    let Some(s) = steering(cfg) else {
        return Ok(None);
    };
    let Some(fd) = s.unbound.lock().remove(&addr) else {
        return Ok(None);
    };
    s.served.lock().push(fd.try_clone()?);
    let socket = std::net::UdpSocket::from(fd);
    socket.set_nonblocking(true)?;
    Ok(Some(socket))
}

/// The slot byte of this worker's connection IDs (0 without steering).
pub(crate) fn slot() -> u8 {
    STEERING
        .get()
        .and_then(Option::as_ref)
        .map_or(0, |s| s.slot)
}

/// This worker starts (`true`) or stops (`false`, draining) taking new
/// connections; the group's program follows. Call inside the runtime.
pub(crate) fn serving(on: bool) {
    let Some(Some(s)) = STEERING.get() else {
        return;
    };
    {
        let mut active = s.active.lock();
        *active = on;
        let kind = if on { libc::F_WRLCK } else { libc::F_UNLCK };
        lock(s.file.as_fd(), kind, active_byte(s.slot), false);
        sync(s, *active);
    }
    if on {
        s.ticking.call_once(|| {
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(TICK).await;
                    let active = s.active.lock();
                    sync(s, *active);
                }
            });
        });
    }
}

/// How long a draining worker under a master drops, rather than refuses,
/// the new connections that still reach it while no worker takes new
/// ones: on HUP every old worker drains at once, before the new ones
/// serve (they load the app first), and the program hashes new
/// connections onto the draining slots meanwhile. A dropped Initial costs
/// its client one retransmission (the next one is hashed onto a new
/// worker once one serves); a refused one costs the request. The worker
/// cannot tell a HUP or a recycle from the master's own shutdown (each is
/// a SIGTERM), so after this long with no successor it refuses again.
pub(crate) const HOLD_NEW: Duration = Duration::from_secs(10);

/// Whether a new connection reaching this worker, draining for
/// `draining_for`, is dropped (`true`) rather than refused: under a master,
/// while another worker takes new connections (the program is moving to
/// it) or for [`HOLD_NEW`]; never standalone, where no successor comes.
pub(crate) fn hold_new(draining_for: Duration) -> bool {
    let Some(Some(s)) = STEERING.get() else {
        return false;
    };
    if draining_for < HOLD_NEW {
        return true;
    }
    let active = s.active.lock();
    !current(s, *active).active.is_empty()
}

/// The slots as the locks show them (`active`: this worker's own state,
/// which its own locks do not show to it).
fn current(s: &Steering, active: bool) -> Slots {
    let mut slots = Slots::default();
    for i in 0..s.k {
        let (held, on) = if i == s.slot {
            (true, active)
        } else if held_by_other(s.file.as_fd(), owned_byte(i)) {
            (true, held_by_other(s.file.as_fd(), active_byte(i)))
        } else {
            (false, false)
        };
        if held {
            slots.held.push(i);
        }
        if on {
            slots.active.push(i);
        }
    }
    slots
}

fn bitmap(slots: &[u8]) -> [u8; 32] {
    let mut m = [0u8; 32];
    for &s in slots {
        m[usize::from(s / 8)] |= 1 << (s % 8);
    }
    m
}

/// Rebuilds the program from the locks and attaches it if it differs from
/// the one recorded as attached; under the lock on byte 0, so that the
/// last program attached is always built from the latest state.
fn sync(s: &Steering, active: bool) {
    let fd = s.file.as_fd();
    if !lock(fd, libc::F_WRLCK, 0, true) {
        return;
    }
    let slots = current(s, active);
    let mut record = [0u8; 64];
    record[..32].copy_from_slice(&bitmap(&slots.held));
    record[32..].copy_from_slice(&bitmap(&slots.active));
    let mut was = [0u8; 64];
    let known = s.file.read_exact_at(&mut was, RECORD).is_ok();
    if !known || was != record {
        let prog = bpf::program(&slots);
        let attached = s
            .served
            .lock()
            .iter()
            .map(|sock| bpf::attach(sock.as_fd(), &prog))
            .collect::<io::Result<Vec<()>>>();
        match attached {
            Ok(_) => {
                let _ = s.file.write_all_at(&record, RECORD);
                tracing::debug!(
                    "HTTP/3 steering: slots held {:?}, active {:?}",
                    slots.held,
                    slots.active
                );
            }
            Err(e) => s.warned.call_once(|| {
                tracing::warn!("HTTP/3: cannot attach the packet-steering BPF program: {e}");
            }),
        }
    }
    lock(fd, libc::F_UNLCK, 0, false);
}

/// Attaches the program of an empty table (new connections by the
/// kernel's hash) to the group of the bound socket `fd`: what the master
/// does before forking, to learn whether steering can work here.
///
/// Errors: the kernel's (see [`bpf::attach`]).
pub(crate) fn check(fd: RawFd) -> io::Result<()> {
    // SAFETY: `fd` is a socket the caller keeps open for the call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    bpf::attach(fd, &bpf::program(&Slots::default()))
}
