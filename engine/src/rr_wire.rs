//! The rr message header and the socket steps both rr sides share: TCP
//! sockets, waiting on a descriptor with a deadline, whole-message I/O.

use std::mem;
use std::net::SocketAddr;

use crate::sys::{self, Socket};

/// Every request and response starts with 24 bytes, big endian:
/// magic "oR", version 1, flags, response size (u32), seq (u64),
/// request size (u32), flow (u32). A response echoes the request's header.
pub const HEADER_LEN: usize = 24;
pub const MAGIC: [u8; 2] = [0x6F, 0x52];
pub const VERSION: u8 = 1;
/// Request flag: the server closes the TCP connection after answering (tcp-crr).
pub const FLAG_CLOSE: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RrHeader {
    pub flags: u8,
    pub response_size: u32,
    pub seq: u64,
    pub request_size: u32,
    pub flow: u32,
}

pub fn encode(h: &RrHeader, buf: &mut [u8]) {
    buf[0..2].copy_from_slice(&MAGIC);
    buf[2] = VERSION;
    buf[3] = h.flags;
    buf[4..8].copy_from_slice(&h.response_size.to_be_bytes());
    buf[8..16].copy_from_slice(&h.seq.to_be_bytes());
    buf[16..20].copy_from_slice(&h.request_size.to_be_bytes());
    buf[20..24].copy_from_slice(&h.flow.to_be_bytes());
}

pub fn decode(buf: &[u8]) -> Option<RrHeader> {
    if buf.len() < HEADER_LEN || buf[0..2] != MAGIC || buf[2] != VERSION {
        return None;
    }
    let u32_at = |i: usize| u32::from_be_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&buf[8..16]);
    Some(RrHeader {
        flags: buf[3],
        response_size: u32_at(4),
        seq: u64::from_be_bytes(seq),
        request_size: u32_at(16),
        flow: u32_at(20),
    })
}

pub fn tcp_socket(v6: bool) -> Result<Socket, i32> {
    let af = if v6 { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: socket(2) takes no pointers; the fd it returns is owned by the Socket.
    let fd = unsafe { libc::socket(af, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(sys::errno());
    }
    Ok(Socket { fd })
}

pub fn set_nonblocking(s: &Socket) {
    // SAFETY: fcntl(2) on an fd we own, integer arguments only.
    unsafe {
        let fl = libc::fcntl(s.fd, libc::F_GETFL);
        libc::fcntl(s.fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

/// Waits until `fd` has `events` or CLOCK_MONOTONIC reaches `deadline_ns`.
/// Returns the revents (0 on timeout; EINTR also returns 0, the caller loops).
pub fn wait_fd(fd: libc::c_int, events: libc::c_short, deadline_ns: u64) -> libc::c_short {
    let now = sys::mono_ns();
    if now >= deadline_ns {
        return 0;
    }
    let left = deadline_ns - now;
    let ts = libc::timespec {
        tv_sec: (left / 1_000_000_000) as libc::time_t,
        tv_nsec: (left % 1_000_000_000) as libc::c_long,
    };
    let mut pfd = libc::pollfd { fd, events, revents: 0 };
    // SAFETY: one valid pollfd and a timespec that outlive the call; no signal mask.
    let r = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
    if r > 0 {
        pfd.revents
    } else {
        0
    }
}

/// How a whole-message read or write on a TCP socket ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Io {
    Done,
    Timeout,
    /// The peer closed the connection.
    Eof,
    Err(i32),
}

/// Writes all of `buf` to a non-blocking socket before `deadline_ns`.
pub fn write_all(s: &Socket, buf: &[u8], deadline_ns: u64) -> Io {
    let mut off = 0;
    while off < buf.len() {
        // SAFETY: the pointer and length stay within `buf`, borrowed for the call.
        let r = unsafe {
            libc::send(s.fd, buf[off..].as_ptr() as *const libc::c_void, buf.len() - off, libc::MSG_NOSIGNAL)
        };
        if r > 0 {
            off += r as usize;
            continue;
        }
        let e = sys::errno();
        if r < 0 && e != libc::EAGAIN && e != libc::EINTR {
            return Io::Err(e);
        }
        if sys::mono_ns() >= deadline_ns {
            return Io::Timeout;
        }
        wait_fd(s.fd, libc::POLLOUT, deadline_ns);
    }
    Io::Done
}

/// Reads exactly `buf.len()` bytes from a non-blocking socket before `deadline_ns`.
pub fn read_exact(s: &Socket, buf: &mut [u8], deadline_ns: u64) -> Io {
    let mut off = 0;
    while off < buf.len() {
        // SAFETY: the pointer and length stay within `buf`, borrowed mutably for the call.
        let r = unsafe {
            libc::recv(s.fd, buf[off..].as_mut_ptr() as *mut libc::c_void, buf.len() - off, 0)
        };
        if r > 0 {
            off += r as usize;
            continue;
        }
        if r == 0 {
            return Io::Eof;
        }
        let e = sys::errno();
        if e != libc::EAGAIN && e != libc::EINTR {
            return Io::Err(e);
        }
        if sys::mono_ns() >= deadline_ns {
            return Io::Timeout;
        }
        wait_fd(s.fd, libc::POLLIN, deadline_ns);
    }
    Io::Done
}

/// Non-blocking TCP connect finished before `deadline_ns`, with TCP_NODELAY.
pub fn connect_tcp(dest: &SocketAddr, deadline_ns: u64) -> Result<Socket, Io> {
    let s = tcp_socket(dest.is_ipv6()).map_err(Io::Err)?;
    set_nonblocking(&s);
    let _ = s.set_int(libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
    match s.connect(dest) {
        Ok(()) => return Ok(s),
        Err(e) if e == libc::EINPROGRESS || e == libc::EINTR => {}
        Err(e) => return Err(Io::Err(e)),
    }
    loop {
        let ev = wait_fd(s.fd, libc::POLLOUT, deadline_ns);
        if ev != 0 {
            break;
        }
        if sys::mono_ns() >= deadline_ns {
            return Err(Io::Timeout);
        }
    }
    match s.get_int(libc::SOL_SOCKET, libc::SO_ERROR) {
        Ok(0) => Ok(s),
        Ok(e) => Err(Io::Err(e)),
        Err(e) => Err(Io::Err(e)),
    }
}

/// A zeroed sockaddr_storage and its size, for recvfrom.
pub fn storage() -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let ss: libc::sockaddr_storage = unsafe { mem::zeroed() };
    (ss, mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = RrHeader { flags: FLAG_CLOSE, response_size: 65507, seq: 1 << 40, request_size: 64, flow: 7 };
        let mut buf = [0u8; 64];
        encode(&h, &mut buf);
        assert_eq!(&buf[0..3], &[0x6F, 0x52, 1]);
        assert_eq!(decode(&buf), Some(h));
        assert_eq!(decode(&buf[..23]), None);
        buf[2] = 2;
        assert_eq!(decode(&buf), None);
    }
}
