//! Thin wrappers over libc: sockets, socket options, clocks, signals, CPU pinning.

use std::io;
use std::mem;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};

pub const SOL_UDP: libc::c_int = 17;
pub const UDP_SEGMENT: libc::c_int = 103;
pub const UDP_GRO: libc::c_int = 104;

/// An environment failure: message for stderr, exit code 3.
#[derive(Debug)]
pub struct EnvError(pub String);

/// Tells a driver the socket is bound: a line on stderr ("ready IP PORT") and, if asked, a file
/// written to a temporary name and renamed, so it never appears half-written.
pub fn announce_ready(path: Option<&str>, local: &SocketAddr) -> Result<(), EnvError> {
    let line = format!("ready {} {}\n", local.ip(), local.port());
    if let Some(path) = path {
        let tmp = format!("{}.tmp{}", path, std::process::id());
        if let Err(e) = std::fs::write(&tmp, line.as_bytes()).and_then(|_| std::fs::rename(&tmp, path)) {
            let _ = std::fs::remove_file(&tmp);
            let msg = e.to_string();
            let msg = msg.find(" (os error").map_or(msg.as_str(), |i| &msg[..i]).to_string();
            return Err(EnvError(format!("--ready-file {}: cannot write it: {}", path, msg)));
        }
    }
    eprint!("offlab-engine: {}", line);
    Ok(())
}

pub fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

pub fn errno_name(e: i32) -> String {
    let name = match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EINVAL => "EINVAL",
        libc::EMFILE => "EMFILE",
        libc::ENFILE => "ENFILE",
        libc::EPIPE => "EPIPE",
        libc::EMSGSIZE => "EMSGSIZE",
        libc::ENOPROTOOPT => "ENOPROTOOPT",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::ENETDOWN => "ENETDOWN",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::ENETRESET => "ENETRESET",
        libc::ECONNABORTED => "ECONNABORTED",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENOBUFS => "ENOBUFS",
        libc::EISCONN => "EISCONN",
        libc::ENOTCONN => "ENOTCONN",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::EHOSTDOWN => "EHOSTDOWN",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        libc::EDESTADDRREQ => "EDESTADDRREQ",
        _ => return format!("errno_{}", e),
    };
    name.to_string()
}

/// "Cannot assign requested address (EADDRNOTAVAIL)".
pub fn describe(e: i32) -> String {
    let text = io::Error::from_raw_os_error(e).to_string();
    let text = match text.find(" (os error") {
        Some(i) => text[..i].to_string(),
        None => text,
    };
    format!("{} ({})", text, errno_name(e))
}

pub fn env_err(what: &str, e: i32) -> EnvError {
    EnvError(format!("{}: {}{}", what, describe(e), hint(e)))
}

/// What to look at for the errors a user can fix.
fn hint(e: i32) -> &'static str {
    match e {
        libc::EADDRNOTAVAIL => "; the address is not configured in this network namespace (see: ip addr)",
        libc::EADDRINUSE => "; another socket has this port (see: ss -lunp), or use --port 0",
        libc::EACCES | libc::EPERM => "; not permitted: run as root or with CAP_NET_ADMIN / CAP_NET_BIND_SERVICE",
        libc::ENETUNREACH => "; no route to it in this network namespace (see: ip route)",
        libc::EAFNOSUPPORT => "; IPv6 is disabled here (see: sysctl net.ipv6.conf.all.disable_ipv6)",
        _ => "",
    }
}

#[inline]
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec that lives across the call.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[inline]
pub fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// Sleeps until the CLOCK_MONOTONIC instant `t_ns` (returns early on a signal).
pub fn sleep_until(t_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (t_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (t_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `ts` is a valid timespec for the call; the remainder pointer may be null with TIMER_ABSTIME.
    unsafe {
        libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut());
    }
}

/// Timer slack of 1 ns makes short sleeps end when asked, not 50 us later.
pub fn set_timer_slack_min() {
    // SAFETY: PR_SET_TIMERSLACK takes plain integers and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong);
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// SIGINT/SIGTERM set a flag; without SA_RESTART a blocked recv returns EINTR.
pub fn install_stop_signals() {
    // SAFETY: an all-zero sigaction is valid (no flags, empty mask); the handler only stores to an
    // atomic, which is async-signal-safe; `sa` outlives both sigaction calls.
    unsafe {
        let mut sa: libc::sigaction = mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = 0;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
}

#[inline]
pub fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Pins the calling thread; an invalid CPU is the caller's mistake (exit 2).
pub fn pin_cpu(cpu: usize) -> Result<(), String> {
    // SAFETY: an all-zero cpu_set_t is the empty set; CPU_SET bounds-checks `cpu` against the set's
    // size; the size passed to sched_setaffinity is that of `set`, which outlives the call.
    unsafe {
        let mut set: libc::cpu_set_t = mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            let e = errno();
            let n = libc::sysconf(libc::_SC_NPROCESSORS_ONLN);
            return Err(format!(
                "--cpu {}: cannot pin to it: {} (online CPUs: {}, numbered from 0)",
                cpu,
                describe(e),
                n
            ));
        }
    }
    Ok(())
}

pub struct Socket {
    pub fd: libc::c_int,
}

/// The messages of one sendmmsg/recvmmsg batch: message i points at buffer i through iovec i.
pub struct Batch {
    // Read by the kernel through the messages' pointers: kept here, beside them, for as long as they
    // live. Moving a Vec moves its header, not the heap memory the pointers point at.
    _iovs: Vec<libc::iovec>,
    pub msgs: Vec<libc::mmsghdr>,
}

impl Batch {
    /// One message per buffer. The caller keeps `bufs` alive and unresized while it uses the messages.
    pub fn new<B: AsMut<[u8]>>(bufs: &mut [B]) -> Batch {
        let mut iovs: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| {
                let b = b.as_mut();
                libc::iovec { iov_base: b.as_mut_ptr() as *mut libc::c_void, iov_len: b.len() }
            })
            .collect();
        let msgs = iovs
            .iter_mut()
            .map(|iov| {
                // SAFETY: mmsghdr is plain data; all-zero is valid (null pointers, zero lengths).
                let mut m: libc::mmsghdr = unsafe { mem::zeroed() };
                m.msg_hdr.msg_iov = iov as *mut libc::iovec;
                m.msg_hdr.msg_iovlen = 1;
                m
            })
            .collect();
        Batch { _iovs: iovs, msgs }
    }
}

/// Which socket buffer `Socket::size_buffer` sizes.
#[derive(Clone, Copy, Debug)]
pub enum Buffer {
    Receive,
    Send,
}

impl Drop for Socket {
    fn drop(&mut self) {
        // SAFETY: the Socket owns `fd` (it opened it and never hands it out to be closed), so it is
        // closed exactly once, here.
        unsafe { libc::close(self.fd) };
    }
}

impl Socket {
    pub fn udp(v6: bool) -> Result<Socket, EnvError> {
        let af = if v6 { libc::AF_INET6 } else { libc::AF_INET };
        // SAFETY: socket() takes plain integers; a negative result is handled below.
        let fd = unsafe { libc::socket(af, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(env_err("socket", errno()));
        }
        Ok(Socket { fd })
    }

    pub fn set_int(&self, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> Result<(), i32> {
        // SAFETY: the pointer and length describe `v`, a c_int that lives across the call.
        let r = unsafe {
            libc::setsockopt(
                self.fd,
                level,
                opt,
                &v as *const libc::c_int as *const libc::c_void,
                mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            Err(errno())
        } else {
            Ok(())
        }
    }

    pub fn get_int(&self, level: libc::c_int, opt: libc::c_int) -> Result<libc::c_int, i32> {
        let mut v: libc::c_int = 0;
        let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: the pointer and length describe `v`, a writable c_int; the kernel writes at most `len`.
        let r = unsafe {
            libc::getsockopt(self.fd, level, opt, &mut v as *mut libc::c_int as *mut libc::c_void, &mut len)
        };
        if r != 0 {
            Err(errno())
        } else {
            Ok(v)
        }
    }

    /// Sizes the receive or send buffer (`--rcvbuf` / `--sndbuf`): a request of
    /// 0 keeps the kernel default; otherwise the FORCE variant (root may exceed
    /// rmem_max / wmem_max), falling back to the plain one. Returns what the
    /// kernel reports back (it doubles the request for bookkeeping).
    pub fn size_buffer(&self, which: Buffer, bytes: u64) -> Result<u64, EnvError> {
        let (force, plain, what) = match which {
            Buffer::Receive => (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, "--rcvbuf: SO_RCVBUF"),
            Buffer::Send => (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, "--sndbuf: SO_SNDBUF"),
        };
        if bytes > 0 {
            let v = bytes.min(i32::MAX as u64) as libc::c_int;
            if self.set_int(libc::SOL_SOCKET, force, v).is_err() {
                self.set_int(libc::SOL_SOCKET, plain, v).map_err(|e| env_err(what, e))?;
            }
        }
        Ok(self.get_int(libc::SOL_SOCKET, plain).unwrap_or(0).max(0) as u64)
    }

    pub fn set_timeout(&self, opt: libc::c_int, ns: u64) -> Result<(), i32> {
        let tv = libc::timeval {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_usec: ((ns % 1_000_000_000) / 1000) as libc::suseconds_t,
        };
        // SAFETY: the pointer and length describe `tv`, a timeval that lives across the call.
        let r = unsafe {
            libc::setsockopt(
                self.fd,
                libc::SOL_SOCKET,
                opt,
                &tv as *const libc::timeval as *const libc::c_void,
                mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if r != 0 {
            Err(errno())
        } else {
            Ok(())
        }
    }

    pub fn bind(&self, addr: &SocketAddr) -> Result<(), i32> {
        let (sa, len) = to_sockaddr(addr);
        // SAFETY: `sa` is a sockaddr_storage filled for this family and `len` is the size of that family's
        // sockaddr, which it holds.
        let r = unsafe { libc::bind(self.fd, &sa as *const _ as *const libc::sockaddr, len) };
        if r != 0 {
            Err(errno())
        } else {
            Ok(())
        }
    }

    pub fn connect(&self, addr: &SocketAddr) -> Result<(), i32> {
        let (sa, len) = to_sockaddr(addr);
        // SAFETY: as in bind: `sa` holds a sockaddr of `len` bytes for its family.
        let r = unsafe { libc::connect(self.fd, &sa as *const _ as *const libc::sockaddr, len) };
        if r != 0 {
            Err(errno())
        } else {
            Ok(())
        }
    }

    pub fn local_addr(&self) -> Result<SocketAddr, i32> {
        // SAFETY: sockaddr_storage is plain data; all-zero bytes are a valid (AF_UNSPEC) value.
        let mut sa: libc::sockaddr_storage = unsafe { mem::zeroed() };
        let mut len = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: `sa` is writable and `len` its full size; the kernel writes at most `len` bytes.
        let r = unsafe { libc::getsockname(self.fd, &mut sa as *mut _ as *mut libc::sockaddr, &mut len) };
        if r != 0 {
            return Err(errno());
        }
        from_sockaddr(&sa).ok_or(libc::EAFNOSUPPORT)
    }
}

pub fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero bytes are a valid (AF_UNSPEC) value.
    let mut ss: libc::sockaddr_storage = unsafe { mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr, sockaddr_in included.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            (ss, mem::size_of::<libc::sockaddr_in>() as libc::socklen_t)
        }
        SocketAddr::V6(a) => {
            // SAFETY: sockaddr_in6 is plain data; all-zero bytes are valid, the fields are set below.
            let mut sin6: libc::sockaddr_in6 = unsafe { mem::zeroed() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr = libc::in6_addr { s6_addr: a.ip().octets() };
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr, sockaddr_in6 included.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            (ss, mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t)
        }
    }
}

pub fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: ss_family says AF_INET, so the storage holds a sockaddr_in; storage is large and
            // aligned enough for it, and the reference borrows `ss`.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: ss_family says AF_INET6, so the storage holds a sockaddr_in6 (as for AF_INET above).
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::new(IpAddr::V6(ip), u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

/// A random-enough u32 for run ids: /dev/urandom, else time and pid.
pub fn random_u32() -> u32 {
    use std::io::Read;
    let mut b = [0u8; 4];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        if f.read_exact(&mut b).is_ok() {
            return u32::from_ne_bytes(b);
        }
    }
    let t = realtime_ns();
    (t ^ (t >> 32) ^ (std::process::id() as u64).rotate_left(16)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_names_and_descriptions() {
        assert_eq!(errno_name(libc::ENOBUFS), "ENOBUFS");
        assert_eq!(errno_name(libc::ECONNREFUSED), "ECONNREFUSED");
        assert_eq!(errno_name(9999), "errno_9999");
        assert_eq!(describe(libc::EADDRNOTAVAIL), "Cannot assign requested address (EADDRNOTAVAIL)");
    }

    #[test]
    fn sockaddr_round_trips() {
        for s in ["10.200.1.2:5300", "[fd00:200::2]:9", "0.0.0.0:0"] {
            let a: SocketAddr = s.parse().unwrap();
            let (ss, _) = to_sockaddr(&a);
            assert_eq!(from_sockaddr(&ss), Some(a));
        }
    }

    #[test]
    fn loopback_bind_reports_the_chosen_port() {
        let s = Socket::udp(false).unwrap();
        s.bind(&"127.0.0.1:0".parse().unwrap()).unwrap();
        let a = s.local_addr().unwrap();
        assert_eq!(a.ip(), "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_ne!(a.port(), 0);
    }
}
