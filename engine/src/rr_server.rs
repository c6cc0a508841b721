//! `offlab-engine rr-server`: answers rr requests on one port, UDP and TCP.
//! One thread answers UDP; TCP connections are each served to their end by
//! an acceptor thread, and a new acceptor starts whenever none is idle, so N
//! persistent flows and a stream of short tcp-crr connections are both served.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::json::{self, Obj, Value};
use crate::rr_args::{RrServerOpts, MAX_TCP_MESSAGE};
use crate::rr_wire::{self, decode, encode, RrHeader, FLAG_CLOSE, HEADER_LEN};
use crate::sys::{self, Socket};
use crate::Failure;

/// Blocking calls wake this often to see whether the server should stop.
const WAKE_NS: u64 = 100_000_000;
/// At most this many TCP connections are served at once.
const MAX_ACCEPTORS: usize = 1024;

#[derive(Default)]
struct Counters {
    udp_requests: AtomicU64,
    udp_foreign: AtomicU64,
    udp_send_errors: AtomicU64,
    tcp_connections: AtomicU64,
    tcp_requests: AtomicU64,
    tcp_foreign: AtomicU64,
    tcp_errors: AtomicU64,
    max_concurrent: AtomicU64,
}

struct Shared {
    done: AtomicBool,
    idle: AtomicUsize,
    acceptors: AtomicUsize,
    busy: AtomicU64,
    c: Counters,
    listener: Socket,
    max_udp: usize,
    threads: Mutex<Vec<JoinHandle<()>>>,
    cpu: Option<usize>,
}

fn env(what: &str, e: i32) -> Failure {
    Failure::Env(sys::env_err(what, e).0)
}

/// UDP and TCP sockets bound to the same port (any free one with --port 0).
fn bind_both(o: &RrServerOpts) -> Result<(Socket, Socket, SocketAddr), Failure> {
    let v6 = o.bind.is_ipv6();
    let mut tries = 0;
    loop {
        let udp = Socket::udp(v6).map_err(|e| Failure::Env(e.0))?;
        let what = format!("--bind {} --port {}: bind", o.bind, o.port);
        udp.bind(&SocketAddr::new(o.bind, o.port)).map_err(|e| env(&what, e))?;
        let local = udp.local_addr().map_err(|e| env("getsockname", e))?;
        let tcp = rr_wire::tcp_socket(v6).map_err(|e| env("socket", e))?;
        let _ = tcp.set_int(libc::SOL_SOCKET, libc::SO_REUSEADDR, 1);
        match tcp.bind(&local) {
            Ok(()) => {}
            Err(e) if e == libc::EADDRINUSE && o.port == 0 && tries < 20 => {
                tries += 1;
                continue;
            }
            Err(e) => return Err(env(&format!("--bind {} --port {}: bind (TCP)", o.bind, local.port()), e)),
        }
        // SAFETY: listen(2) on a socket we own; integer arguments only.
        if unsafe { libc::listen(tcp.fd, 1024) } != 0 {
            return Err(env("listen", sys::errno()));
        }
        return Ok((udp, tcp, local));
    }
}

pub fn run(o: &RrServerOpts) -> Result<Value, Failure> {
    if let Some(cpu) = o.cpu {
        sys::pin_cpu(cpu).map_err(Failure::Arg)?;
    }
    sys::install_stop_signals();
    let (udp, listener, local) = bind_both(o)?;
    let _ = udp.set_timeout(libc::SO_RCVTIMEO, WAKE_NS);
    let _ = listener.set_timeout(libc::SO_RCVTIMEO, WAKE_NS);
    let _ = udp.size_buffer(sys::Buffer::Receive, 4 << 20);
    let max_udp = if o.bind.is_ipv6() { crate::argv::MAX_PAYLOAD_V6 } else { crate::argv::MAX_PAYLOAD_V4 };
    let shared = Arc::new(Shared {
        done: AtomicBool::new(false),
        idle: AtomicUsize::new(0),
        acceptors: AtomicUsize::new(0),
        busy: AtomicU64::new(0),
        c: Counters::default(),
        listener,
        max_udp,
        threads: Mutex::new(Vec::new()),
        cpu: o.cpu,
    });
    let start = sys::mono_ns();
    let start_wall = sys::realtime_ns();
    let udp_thread = {
        let sh = shared.clone();
        std::thread::spawn(move || serve_udp(&sh, &udp))
    };
    spawn_acceptor(&shared);
    sys::announce_ready(o.ready_file.as_deref(), &local).map_err(|e| Failure::Env(e.0))?;
    let end = if o.duration > 0.0 { Some(start + (o.duration * 1e9) as u64) } else { None };
    let stop_reason = loop {
        if sys::stop_requested() {
            break "signal";
        }
        let now = sys::mono_ns();
        if let Some(e) = end {
            if now >= e {
                break "duration";
            }
        }
        sys::sleep_until(now + 20_000_000);
    };
    shared.done.store(true, Ordering::Relaxed);
    let _ = udp_thread.join();
    loop {
        let h = shared.threads.lock().map(|mut v| v.pop()).unwrap_or(None);
        match h {
            Some(h) => {
                let _ = h.join();
            }
            None => break,
        }
    }
    let c = &shared.c;
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut opts = Obj::new();
    opts.s("bind", &o.bind.to_string())
        .u("port", o.port as u64)
        .opt_s("ready_file", o.ready_file.as_deref())
        .f("duration_s", o.duration)
        .opt_u("cpu", o.cpu.map(|c| c as u64));
    let mut out = json::envelope("rr-server", opts);
    out.s("local", &local.to_string())
        .s("stop_reason", stop_reason)
        .u("start_unix_ns", start_wall)
        .f("elapsed_s", (sys::mono_ns() - start) as f64 / 1e9)
        .u("udp_requests", g(&c.udp_requests))
        .u("udp_foreign", g(&c.udp_foreign))
        .u("udp_send_errors", g(&c.udp_send_errors))
        .u("tcp_connections", g(&c.tcp_connections))
        .u("tcp_requests", g(&c.tcp_requests))
        .u("tcp_foreign", g(&c.tcp_foreign))
        .u("tcp_errors", g(&c.tcp_errors))
        .u("tcp_max_concurrent", g(&c.max_concurrent));
    Ok(out.into_value())
}

fn valid(h: &RrHeader, max_response: usize) -> bool {
    (h.response_size as usize) >= HEADER_LEN && (h.response_size as usize) <= max_response
}

fn serve_udp(sh: &Shared, sock: &Socket) {
    let mut buf = vec![0u8; 65536];
    let mut resp = vec![0u8; sh.max_udp];
    while !sh.done.load(Ordering::Relaxed) {
        let (mut ss, mut len) = rr_wire::storage();
        // SAFETY: `buf` and the sockaddr storage outlive the call; lengths match them.
        let r = unsafe {
            libc::recvfrom(
                sock.fd,
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                0,
                &mut ss as *mut _ as *mut libc::sockaddr,
                &mut len,
            )
        };
        if r < 0 {
            continue; // the periodic wake-up (EAGAIN) or a signal
        }
        let n = r as usize;
        let h = match decode(&buf[..n]) {
            Some(h) if h.request_size as usize == n && valid(&h, sh.max_udp) => h,
            _ => {
                sh.c.udp_foreign.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        sh.c.udp_requests.fetch_add(1, Ordering::Relaxed);
        let size = h.response_size as usize;
        resp[..HEADER_LEN].copy_from_slice(&buf[..HEADER_LEN]);
        // SAFETY: `resp` holds at least `size` bytes (checked by `valid`); the
        // peer's address is the one recvfrom filled in, with its length.
        let s = unsafe {
            libc::sendto(
                sock.fd,
                resp.as_ptr() as *const libc::c_void,
                size,
                0,
                &ss as *const _ as *const libc::sockaddr,
                len,
            )
        };
        if s < 0 {
            sh.c.udp_send_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn spawn_acceptor(sh: &Arc<Shared>) {
    if sh.acceptors.fetch_add(1, Ordering::SeqCst) >= MAX_ACCEPTORS {
        sh.acceptors.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    sh.idle.fetch_add(1, Ordering::SeqCst);
    let s2 = sh.clone();
    let h = std::thread::spawn(move || accept_loop(&s2));
    if let Ok(mut v) = sh.threads.lock() {
        v.push(h);
    }
}

fn accept_loop(sh: &Arc<Shared>) {
    if let Some(cpu) = sh.cpu {
        let _ = sys::pin_cpu(cpu);
    }
    while !sh.done.load(Ordering::Relaxed) {
        // SAFETY: accept4(2) without an address buffer; the new fd is owned by a Socket.
        let fd = unsafe { libc::accept4(sh.listener.fd, std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC) };
        if fd < 0 {
            continue; // the periodic wake-up
        }
        let conn = Socket { fd };
        if sh.idle.fetch_sub(1, Ordering::SeqCst) == 1 {
            spawn_acceptor(sh); // keep one acceptor waiting
        }
        let busy = sh.busy.fetch_add(1, Ordering::SeqCst) + 1;
        sh.c.max_concurrent.fetch_max(busy, Ordering::Relaxed);
        sh.c.tcp_connections.fetch_add(1, Ordering::Relaxed);
        serve_tcp(sh, &conn);
        drop(conn);
        sh.busy.fetch_sub(1, Ordering::SeqCst);
        sh.idle.fetch_add(1, Ordering::SeqCst);
    }
}

/// Serves one connection until the peer closes it, a request asks to close,
/// or the server stops.
fn serve_tcp(sh: &Shared, conn: &Socket) {
    rr_wire::set_nonblocking(conn);
    let _ = conn.set_int(libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
    let mut hdr = [0u8; HEADER_LEN];
    let mut body = vec![0u8; 0];
    let mut resp = vec![0u8; 0];
    loop {
        // Wait for a request, waking to see whether the server stops.
        match read_waking(sh, conn, &mut hdr) {
            Some(rr_wire::Io::Done) => {}
            Some(rr_wire::Io::Eof) | None => return,
            Some(_) => {
                sh.c.tcp_errors.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let h = match decode(&hdr) {
            Some(h) if (h.request_size as usize) >= HEADER_LEN
                && (h.request_size as usize) <= MAX_TCP_MESSAGE
                && valid(&h, MAX_TCP_MESSAGE) => h,
            _ => {
                sh.c.tcp_foreign.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let rest = h.request_size as usize - HEADER_LEN;
        if body.len() < rest {
            body.resize(rest, 0);
        }
        let deadline = sys::mono_ns() + 10 * WAKE_NS;
        if rest > 0 && rr_wire::read_exact(conn, &mut body[..rest], deadline) != rr_wire::Io::Done {
            sh.c.tcp_errors.fetch_add(1, Ordering::Relaxed);
            return;
        }
        sh.c.tcp_requests.fetch_add(1, Ordering::Relaxed);
        let size = h.response_size as usize;
        if resp.len() < size {
            resp.resize(size, 0);
        }
        encode(&h, &mut resp);
        if rr_wire::write_all(conn, &resp[..size], sys::mono_ns() + 10 * WAKE_NS) != rr_wire::Io::Done {
            sh.c.tcp_errors.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if h.flags & FLAG_CLOSE != 0 {
            return; // tcp-crr: the server closes first, so TIME_WAIT stays on its side
        }
    }
}

/// Reads a whole header, waiting as long as needed but returning None once
/// the server stops (between messages only).
fn read_waking(sh: &Shared, conn: &Socket, buf: &mut [u8]) -> Option<rr_wire::Io> {
    loop {
        if sh.done.load(Ordering::Relaxed) {
            return None;
        }
        let ev = rr_wire::wait_fd(conn.fd, libc::POLLIN, sys::mono_ns() + WAKE_NS);
        if ev != 0 {
            return Some(rr_wire::read_exact(conn, buf, sys::mono_ns() + 10 * WAKE_NS));
        }
    }
}
