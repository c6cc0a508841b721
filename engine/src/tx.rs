//! `offlab-engine tx`: send numbered, timestamped datagrams; report one JSON object.

use std::collections::BTreeMap;
use std::mem;
use std::net::SocketAddr;

use crate::args::{SendPath, TxOpts};
use crate::header::{self, Header, FLAG_END, HEADER_LEN};
use crate::json::{self, Obj, Value};
use crate::pacing::{self, Pacer};
use crate::series::{self, Deltas};
use crate::sys::{self, Buffer, Socket, SOL_UDP, UDP_SEGMENT};
use crate::uring;
use crate::Failure;

/// If every send fails with a non-transient error for this long, the
/// destination is unusable: exit 3 instead of spinning for the whole run.
const GIVE_UP_NS: u64 = 1_000_000_000;
/// END markers go out at these offsets after the run (ms), so one survives a
/// queue on the path that is still full at the end. A receiver's own socket can
/// stay full for longer (a receiver without the CPU): the receiver's --end-port
/// takes them on a socket of their own.
const END_OFFSETS_MS: [u64; 3] = [0, 10, 30];

/// SO_ZEROCOPY (asm-generic/socket.h) and the zero-copy completion's origin and "copied" code
/// (linux/errqueue.h).
const SO_ZEROCOPY: libc::c_int = 60;
const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;
/// At most this many buffers a zero-copy sender cycles through: one may be rewritten only once the
/// kernel has reported the send that used it complete.
const ZC_POOL: usize = 256;

/// MSG_ZEROCOPY's completions cost a recvmsg (one covers a range of sends): at least this many
/// buffers, so that one is read per 32 sends, not per 8 (2 MiB of 64 KiB sends still stamp in cache).
const ZC_MIN_MSG: usize = 32;

/// The buffers a zero-copy sender needs: the kernel holds at most what the send buffer admits (a
/// zero-copy skb is charged its pinned bytes), so twice that many sends, at least two batches and at
/// most ZC_POOL, a power of two. Fewer buffers than needed would only make the sender wait
/// (`buffer_waits`); more would only spread its writes over more cache (256 x 64 KiB is 16 MiB).
fn zc_pool(sndbuf: u64, msg_len: usize, batch: usize) -> usize {
    let held = (sndbuf as usize / msg_len.max(1)).max(1);
    (2 * held).clamp(2 * batch, ZC_POOL.max(2 * batch)).next_power_of_two()
}
/// How long the end of a zero-copy run waits for the kernel's last completions.
const ZC_DRAIN_NS: u64 = 2_000_000_000;

/// What the kernel reported about zero-copy sends (MSG_ZEROCOPY or io_uring SEND_ZC): which buffers it
/// still holds, how many sends completed, and how many of those it copied after all
/// (SO_EE_CODE_ZEROCOPY_COPIED, IORING_NOTIF_USAGE_ZC_COPIED).
struct ZeroCopy {
    /// Buffer i may be rewritten only once this is false again.
    busy: Vec<bool>,
    /// The pool's size less one: slot arithmetic is `& mask` (a power of two), not a division per send.
    mask: usize,
    /// io_uring-zc: whether the send that holds buffer i succeeded (only then its notification counts).
    ok: Vec<bool>,
    /// The buffer the next send uses. MSG_ZEROCOPY: the kernel numbers successful sends 0, 1, ... (u32)
    /// and the pool's size is a power of two, so this is always that number modulo the pool.
    next_slot: usize,
    sends: u64,
    in_flight: usize,
    completed: u64,
    copied: u64,
    notifications: u64,
}

impl ZeroCopy {
    /// `pool` buffers, a power of two.
    fn new(pool: usize) -> ZeroCopy {
        assert!(pool.is_power_of_two(), "MSG_ZEROCOPY ids wrap at 2^32: the pool must divide it");
        ZeroCopy {
            busy: vec![false; pool],
            mask: pool - 1,
            ok: vec![false; pool],
            next_slot: 0,
            sends: 0,
            in_flight: 0,
            completed: 0,
            copied: 0,
            notifications: 0,
        }
    }

    fn pool(&self) -> usize {
        self.busy.len()
    }

    /// The first of the `n` buffers the next sends use, if the kernel is done with all of them.
    fn free_run(&self, n: usize) -> Option<usize> {
        if (0..n).all(|i| !self.busy[(self.next_slot + i) & self.mask]) {
            Some(self.next_slot)
        } else {
            None
        }
    }

    /// A send with MSG_ZEROCOPY succeeded: the kernel numbered it and holds its buffer.
    fn sent(&mut self) {
        self.busy[self.next_slot] = true;
        self.next_slot = (self.next_slot + 1) & self.mask;
        self.sends += 1;
        self.in_flight += 1;
    }

    /// MSG_ZEROCOPY sends lo..=hi completed (ids wrap at 2^32).
    fn complete(&mut self, lo: u32, hi: u32, copied: bool) {
        let n = hi.wrapping_sub(lo) as u64 + 1;
        let mut id = lo;
        for _ in 0..n.min(self.pool() as u64) {
            let slot = id as usize & self.mask;
            if self.busy[slot] {
                self.busy[slot] = false;
                self.in_flight -= 1;
            }
            id = id.wrapping_add(1);
        }
        self.notifications += 1;
        self.completed += n;
        if copied {
            self.copied += n;
        }
    }

    /// io_uring-zc: `n` SQEs were queued on the buffers from next_slot on; each stays busy until its
    /// completion says no notification follows, or its notification arrives.
    fn claim(&mut self, n: usize) {
        for i in 0..n {
            let slot = (self.next_slot + i) & self.mask;
            self.busy[slot] = true;
            self.ok[slot] = false;
        }
        self.next_slot = (self.next_slot + n) & self.mask;
        self.in_flight += n;
    }

    /// io_uring-zc: one CQE about buffer `slot`.
    fn on_cqe(&mut self, slot: usize, c: &uring::Cqe) {
        if slot >= self.pool() || !self.busy[slot] {
            return;
        }
        let notif = c.flags & uring::IORING_CQE_F_NOTIF != 0;
        if !notif {
            self.ok[slot] = c.res >= 0;
            if c.res >= 0 {
                self.sends += 1;
            }
            if c.flags & uring::IORING_CQE_F_MORE != 0 {
                return; // its notification follows: the kernel may still read the buffer
            }
        } else {
            self.notifications += 1;
            // A failed send's notification reports "copied" too (nothing was sent from the buffer):
            // only successful sends are counted.
            if self.ok[slot] {
                self.completed += 1;
                if c.res & uring::IORING_NOTIF_USAGE_ZC_COPIED != 0 {
                    self.copied += 1;
                }
            }
        }
        self.busy[slot] = false;
        self.in_flight -= 1;
    }
}

/// Reads the completions already in the ring (no syscall): outside a batch only notifications.
fn reap_notifications(ring: &mut uring::Ring, z: &mut ZeroCopy) {
    while let Some(c) = ring.pop() {
        z.on_cqe(c.user_data as usize, &c);
    }
}

/// One io_uring batch: `n` linked SEND (or SEND_ZC) SQEs, on the buffers from `first` on (modulo their
/// number), submitted with one io_uring_enter that waits for their completions. Linked, so that the
/// kernel sends them in order and a failure cancels the rest (-ECANCELED), as sendmmsg stops at its
/// first failure: the datagrams sent are always a prefix of the numbers stamped.
/// Returns (sends that succeeded, errno of the first failure or 0); Err: io_uring_enter failed.
fn uring_batch(
    ring: &mut uring::Ring,
    fd: libc::c_int,
    bufs: &[&mut [u8]],
    first: usize,
    n: usize,
    len: usize,
    mut zc: Option<&mut ZeroCopy>,
) -> Result<(usize, i32), i32> {
    let (opcode, ioprio) = match zc {
        Some(_) => (uring::IORING_OP_SEND_ZC, uring::IORING_SEND_ZC_REPORT_USAGE),
        None => (uring::IORING_OP_SEND, 0),
    };
    for i in 0..n {
        // first < bufs.len() and n <= bufs.len(): the buffers wrap around at most once.
        let slot = if first + i < bufs.len() { first + i } else { first + i - bufs.len() };
        ring.push(&uring::Sqe {
            opcode,
            flags: if i + 1 < n { uring::IOSQE_IO_LINK } else { 0 },
            ioprio,
            fd,
            addr: bufs[slot].as_ptr() as u64,
            len: len as u32,
            user_data: slot as u64,
            ..uring::Sqe::default()
        });
    }
    if let Some(z) = zc.as_mut() {
        z.claim(n);
    }
    let (mut done, mut sent, mut err) = (0, 0, 0);
    while done < n {
        match ring.submit_and_wait((n - done) as u32, None) {
            Ok(_) => {}
            Err(e) if e == libc::EINTR || e == libc::EAGAIN || e == libc::EBUSY => {}
            Err(e) => return Err(e),
        }
        while let Some(c) = ring.pop() {
            if let Some(z) = zc.as_mut() {
                z.on_cqe(c.user_data as usize, &c);
            }
            if c.flags & uring::IORING_CQE_F_NOTIF != 0 {
                continue;
            }
            done += 1;
            if c.res >= 0 {
                sent += 1;
            } else if err == 0 && c.res != -libc::ECANCELED {
                err = -c.res;
            }
        }
    }
    Ok((sent, err))
}

/// Waits up to `ms` for something on the socket's error queue (POLLERR is reported whatever is asked).
fn wait_error_queue(sock: &Socket, ms: libc::c_int) {
    let mut p = libc::pollfd { fd: sock.fd, events: 0, revents: 0 };
    // SAFETY: `p` is one valid pollfd, alive for the call.
    unsafe {
        libc::poll(&mut p, 1, ms);
    }
}

/// The kernel says the destination cannot be reached (an ICMP or neighbour
/// failure): fatal while the run is young, counted later.
fn unreachable(e: i32) -> bool {
    e == libc::EHOSTUNREACH || e == libc::ENETUNREACH || e == libc::EHOSTDOWN || e == libc::ENETDOWN
}

/// Unreachable errors this early mean the destination never worked: ARP/ND
/// give up after 3 s with the kernel's defaults.
const STARTUP_NS: u64 = 5_000_000_000;

/// Errors that can pass by themselves: a full queue, a signal, or an ICMP
/// error from an earlier datagram reported on this one (receiver not yet up).
fn transient(e: i32) -> bool {
    e == libc::ENOBUFS || e == libc::EAGAIN || e == libc::EINTR || e == libc::ECONNREFUSED
}

/// Largest UDP payload one segment can carry without IP fragmentation.
fn max_segment_payload(sock: &Socket, v6: bool) -> Option<usize> {
    let (level, opt, overhead) = if v6 {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU, 48)
    } else {
        (libc::IPPROTO_IP, libc::IP_MTU, 28)
    };
    match sock.get_int(level, opt) {
        Ok(mtu) if mtu as usize > overhead => Some(mtu as usize - overhead),
        _ => None,
    }
}

pub fn run(o: &TxOpts) -> Result<Value, Failure> {
    if let Some(cpu) = o.cpu {
        sys::pin_cpu(cpu).map_err(Failure::Arg)?;
    }
    sys::install_stop_signals();
    sys::set_timer_slack_min();
    let v6 = o.dest.is_ipv6();
    let dest = SocketAddr::new(o.dest, o.port);
    let sock = Socket::udp(v6).map_err(|e| Failure::Env(e.0))?;
    let sndbuf = sock.size_buffer(Buffer::Send, o.sndbuf).map_err(|e| Failure::Env(e.0))?;
    // With RECVERR the kernel reports what it would otherwise hide from a UDP
    // sender: local drops (ENOBUFS, so a dropped send is retried, not counted
    // as sent) and ICMP/neighbour errors such as an address nobody answers.
    let _ = if v6 {
        sock.set_int(libc::IPPROTO_IPV6, libc::IPV6_RECVERR, 1)
    } else {
        sock.set_int(libc::IPPROTO_IP, libc::IP_RECVERR, 1)
    };
    if let Err(e) = sock.connect(&dest) {
        return Err(Failure::Env(sys::env_err(&format!("--dest {} --port {}: connect", o.dest, o.port), e).0));
    }
    let end_sock = match o.end_port {
        Some(port) if !o.no_end => {
            let end_sock = Socket::udp(v6).map_err(|e| Failure::Env(e.0))?;
            if let Err(e) = end_sock.connect(&SocketAddr::new(o.dest, port)) {
                return Err(Failure::Env(sys::env_err(&format!("--dest {} --end-port {}: connect", o.dest, port), e).0));
            }
            Some(end_sock)
        }
        _ => None,
    };
    let path_payload = max_segment_payload(&sock, v6);
    if o.gso {
        if let Some(max) = path_payload {
            if o.size > max {
                return Err(Failure::Arg(format!(
                    "--size {} with --gso: every segment must fit the path MTU to {} \
                     (at most {} bytes of UDP payload); use --size 24..{} or raise the MTU",
                    o.size, o.dest, max, max
                )));
            }
        }
        if let Err(e) = sock.set_int(SOL_UDP, UDP_SEGMENT, o.size as libc::c_int) {
            return Err(Failure::Env(format!(
                "--gso: setsockopt UDP_SEGMENT: {} (needs Linux 4.18 or later)",
                sys::describe(e)
            )));
        }
    }
    let mut zc = if o.send == SendPath::Zerocopy {
        if let Err(e) = sock.set_int(libc::SOL_SOCKET, SO_ZEROCOPY, 1) {
            return Err(Failure::Env(format!(
                "--send zerocopy: setsockopt SO_ZEROCOPY: {} (UDP needs Linux 5.0 or later)",
                sys::describe(e)
            )));
        }
        Some(ZeroCopy::new(zc_pool(sndbuf, o.size * o.gso_segments, 1).max(ZC_MIN_MSG)))
    } else if o.send == SendPath::IoUringZc {
        Some(ZeroCopy::new(zc_pool(sndbuf, o.size * o.gso_segments, o.batch)))
    } else {
        None
    };
    let mut ring = match o.send {
        SendPath::IoUring | SendPath::IoUringZc => Some(open_ring(o, zc.as_ref().map_or(0, |z| z.pool()))?),
        _ => None,
    };
    let local = sock.local_addr().ok();
    let run_id = o.run_id.unwrap_or_else(sys::random_u32);

    let segs = o.gso_segments;
    let msg_len = o.size * segs;
    let batch = o.batch;
    let n_bufs = zc.as_ref().map_or(batch, |z| z.pool());
    // The buffers lie end to end in one cache-line aligned region (as ref_tx's one malloc): with a
    // segment size that is a multiple of 64 (1472 is), every segment's header then sits in one cache
    // line; separate allocations put a quarter of the buffers' headers across two.
    let mut region = vec![0u8; n_bufs * msg_len + 64];
    let aligned = region.as_ptr().align_offset(64);
    let mut bufs: Vec<&mut [u8]> = region[aligned..aligned + n_bufs * msg_len].chunks_exact_mut(msg_len).collect();
    for b in bufs.iter_mut() {
        for s in 0..segs {
            header::encode(&Header { flags: 0, run_id, seq: 0, tx_ns: 0 }, &mut b[s * o.size..]);
        }
    }
    let mut messages = sys::Batch::new(&mut bufs);
    let msgs = &mut messages.msgs;

    let target_pps = o.rate.pps(o.size);
    let start = sys::mono_ns();
    let start_wall = sys::realtime_ns();
    let end = start + (o.duration * 1e9) as u64;
    let mut pacer = target_pps.map(|p| Pacer::new(start, p));
    // Counters per interval: datagrams accepted, failed calls.
    let mut intervals = if o.interval_ms > 0 { Some(Deltas::new(o.interval_ms * 1_000_000, 2)) } else { None };
    if let Some(d) = intervals.as_mut() {
        d.start(start);
    }

    let mut seq: u64 = 0; // next seq = datagrams sent so far
    let mut calls: u64 = 0;
    let mut failed_calls: u64 = 0;
    let mut partial_calls: u64 = 0;
    let mut errors: BTreeMap<i32, u64> = BTreeMap::new();
    let mut failing_since: Option<u64> = None;
    let mut hard_error: i32 = 0;
    let mut zc_waits: u64 = 0;
    let stop_reason;
    loop {
        let mut now = sys::mono_ns();
        if sys::stop_requested() {
            stop_reason = "signal";
            break;
        }
        if now >= end {
            stop_reason = "duration";
            break;
        }
        let mut n_msgs = batch;
        if let Some(p) = pacer.as_mut() {
            let due = p.due(seq);
            if due >= end {
                // The schedule covers the whole duration: end there, so the
                // achieved rate is counted over the same span as the target.
                pacing::wait_until(end);
                stop_reason = "duration";
                break;
            }
            if due > now {
                now = pacing::wait_until(due);
                if sys::stop_requested() {
                    stop_reason = "signal";
                    break;
                }
            }
            p.note_lag(now, seq);
            let due_msgs = (p.due_count(now, seq) + segs as u64 - 1) / segs as u64;
            n_msgs = (due_msgs as usize).min(batch);
        }
        if let Some(d) = intervals.as_mut() {
            d.tick(now, &[seq, failed_calls]);
        }
        // The buffer of this call: a zero-copy send waits until the kernel is done with the one it reuses.
        let first_buf = match (zc.as_mut(), ring.as_mut()) {
            (Some(z), Some(r)) => {
                // io_uring-zc: notifications already in the ring cost no syscall to read.
                reap_notifications(r, z);
                match z.free_run(n_msgs) {
                    Some(slot) => slot,
                    None => {
                        zc_waits += 1;
                        let _ = r.submit_and_wait(1, Some(1_000_000));
                        continue;
                    }
                }
            }
            (Some(z), None) => {
                // Completions are read in bulk (one recvmsg returns a range), when the next buffer is still
                // held or ZC_POOL / 2 sends are out, not before every send: a recvmsg per send would double
                // the syscalls. (With 64 KiB GSO sends, 8 buffers: reading at half of them, a recvmsg per 4
                // sends, cost 12 % more CPU per byte than the C reference; 256 buffers, 16 MiB, made
                // stamping the headers miss the cache: 33 % more.)
                if z.in_flight >= ZC_POOL / 2 || z.free_run(1).is_none() {
                    read_error_queue(&sock, Some(&mut *z));
                }
                match z.free_run(1) {
                    Some(slot) => slot,
                    None => {
                        zc_waits += 1;
                        wait_error_queue(&sock, 1);
                        continue;
                    }
                }
            }
            _ => 0,
        };
        // A failed send did not use its seqs: they are stamped again next time. (first_buf < n_bufs and
        // n_msgs <= batch <= n_bufs: the buffers wrap around at most once.)
        for m in 0..n_msgs {
            let i = first_buf + m;
            let b = &mut bufs[if i < n_bufs { i } else { i - n_bufs }];
            header::stamp_segments(b, o.size, segs, seq + (m * segs) as u64, now);
        }
        let (sent_msgs, err) = if let Some(r) = ring.as_mut() {
            match uring_batch(r, sock.fd, &bufs, first_buf, n_msgs, msg_len, zc.as_mut()) {
                Ok((k, e)) => (if k > 0 { k as isize } else { -1 }, e),
                Err(e) => {
                    return Err(Failure::Env(format!("--send {}: io_uring_enter: {}", o.send.name(), sys::describe(e))))
                }
            }
        } else {
            // SAFETY: bufs[first_buf] holds msg_len bytes (first_buf < bufs.len()); each msgs[i] points
            // (through its iovec) at bufs[i], a part of `region`, which is not resized or dropped while
            // msgs is in use, and n_msgs ≤ batch ≤ msgs.len(). A zero-copy buffer is not written again until its
            // completion is read (ZeroCopy::free_run).
            let r = unsafe {
                match o.send {
                    SendPath::Send | SendPath::Zerocopy => {
                        let flags = if o.send == SendPath::Zerocopy { libc::MSG_ZEROCOPY } else { 0 };
                        let r = libc::send(sock.fd, bufs[first_buf].as_ptr() as *const libc::c_void, msg_len, flags);
                        if r >= 0 {
                            1
                        } else {
                            -1
                        }
                    }
                    _ => libc::sendmmsg(sock.fd, msgs.as_mut_ptr(), n_msgs as libc::c_uint, 0) as isize,
                }
            };
            (r, if r > 0 { 0 } else { sys::errno() })
        };
        calls += 1;
        if sent_msgs > 0 {
            if let (Some(z), None) = (zc.as_mut(), ring.as_ref()) {
                z.sent();
            }
            let k = sent_msgs as usize;
            if k < n_msgs {
                partial_calls += 1;
            }
            seq += (k * segs) as u64;
            failing_since = None;
        } else {
            let e = err;
            failed_calls += 1;
            *errors.entry(e).or_insert(0) += 1;
            if ring.is_some() {
                if seq == 0 && (e == libc::EINVAL || e == libc::EOPNOTSUPP) {
                    // The opcode or IORING_SEND_ZC_REPORT_USAGE (Linux 6.2) is refused by this kernel.
                    return Err(Failure::Env(format!(
                        "--send {}: the kernel refuses the request ({}): cannot test here",
                        o.send.name(),
                        sys::describe(e)
                    )));
                }
                read_error_queue(&sock, None);
            } else if e != libc::ENOBUFS && e != libc::EAGAIN {
                read_error_queue(&sock, zc.as_mut());
            } else if zc.is_some() {
                // Out of option memory for pinned pages: let completions come back first.
                wait_error_queue(&sock, 1);
            }
            if unreachable(e) && now.saturating_sub(start) < STARTUP_NS {
                hard_error = e;
                stop_reason = "unreachable";
                break;
            }
            if transient(e) {
                continue;
            }
            match failing_since {
                None => failing_since = Some(now),
                Some(t) if now.saturating_sub(t) >= GIVE_UP_NS => {
                    hard_error = e;
                    stop_reason = "unreachable";
                    break;
                }
                Some(_) => {}
            }
        }
    }
    let stop = sys::mono_ns();
    // A zero-copy send is reported only once the kernel is done with its buffer: wait for the rest.
    if let Some(z) = zc.as_mut() {
        let deadline = sys::mono_ns() + ZC_DRAIN_NS;
        match ring.as_mut() {
            Some(r) => {
                reap_notifications(r, z);
                while z.in_flight > 0 && sys::mono_ns() < deadline {
                    let _ = r.submit_and_wait(1, Some(10_000_000));
                    reap_notifications(r, z);
                }
            }
            None => {
                read_error_queue(&sock, Some(&mut *z));
                while z.in_flight > 0 && sys::mono_ns() < deadline {
                    wait_error_queue(&sock, 10);
                    read_error_queue(&sock, Some(&mut *z));
                }
            }
        }
    }
    if hard_error != 0 {
        let why = if unreachable(hard_error) {
            format!("{} after {:.1} s", sys::describe(hard_error), (stop - start) as f64 / 1e9)
        } else {
            format!("every send failed for {:.1} s, last with {}", GIVE_UP_NS as f64 / 1e9, sys::describe(hard_error))
        };
        let hint = if o.gso && hard_error == libc::EIO {
            " (UDP_SEGMENT needs checksum offload on the outgoing device: ethtool -K DEV tx on)"
        } else {
            ""
        };
        return Err(Failure::Env(format!(
            "tx to {}: destination unusable: {}; {} datagrams sent before{}",
            dest, why, seq, hint
        )));
    }
    if let Some(d) = intervals.as_mut() {
        d.finish(stop, &[seq, failed_calls]);
    }
    let end_markers = if o.no_end { 0 } else { send_end_markers(&sock, end_sock.as_ref(), run_id, seq, stop) };

    let elapsed_s = (stop - start) as f64 / 1e9;
    let mut opts = Obj::new();
    opts.s("dest", &o.dest.to_string())
        .u("port", o.port as u64)
        .u("size", o.size as u64)
        .b("gso", o.gso)
        .u("gso_segments", segs as u64)
        .u("batch", batch as u64)
        .s("send", o.send.name())
        .s("rate", &o.rate_text)
        .f("duration_s", o.duration)
        .opt_u("cpu", o.cpu.map(|c| c as u64))
        .u("sndbuf_bytes", o.sndbuf)
        .opt_u("run_id", o.run_id.map(|r| r as u64))
        .b("no_end", o.no_end)
        .opt_u("end_port", o.end_port.map(|p| p as u64))
        .u("interval_ms", o.interval_ms);
    let mut errs = Obj::new();
    let mut by_name: BTreeMap<String, u64> = BTreeMap::new();
    for (e, n) in &errors {
        *by_name.entry(sys::errno_name(*e)).or_insert(0) += n;
    }
    for (k, n) in &by_name {
        errs.u(k, *n);
    }
    let mut pace = Obj::new();
    match (target_pps, &pacer) {
        (Some(pps), Some(p)) => {
            pace.f("target_pps", pps)
                .f("target_bps", pps * o.size as f64 * 8.0)
                .f("max_lag_us", p.max_lag_ns as f64 / 1e3)
                .u("schedule_resets", p.resets);
        }
        _ => {
            pace.null("target_pps").null("target_bps").null("max_lag_us").u("schedule_resets", 0);
        }
    }
    let bytes = seq * o.size as u64;
    let mut out = json::envelope("tx", opts);
    out.opt_s("local", local.map(|l| l.to_string()).as_deref())
        .s("remote", &dest.to_string())
        .u("run_id", run_id as u64)
        .u("sndbuf_bytes", sndbuf)
        .opt_u("path_max_payload_bytes", path_payload.map(|p| p as u64))
        .s("stop_reason", stop_reason)
        .s("clock", "CLOCK_MONOTONIC")
        .u("start_unix_ns", start_wall)
        .u("start_mono_ns", start)
        .f("duration_s", elapsed_s)
        .u("datagrams", seq)
        .opt_u("sent_seq_max", if seq > 0 { Some(seq - 1) } else { None })
        .u("bytes", bytes)
        .u("calls", calls)
        .u("failed_calls", failed_calls)
        .u("partial_calls", partial_calls)
        .opt_f(
            "datagrams_per_call",
            if calls > failed_calls { Some(seq as f64 / (calls - failed_calls) as f64) } else { None },
        )
        .f("pps", if elapsed_s > 0.0 { seq as f64 / elapsed_s } else { 0.0 })
        .f("bps", if elapsed_s > 0.0 { bytes as f64 * 8.0 / elapsed_s } else { 0.0 })
        .obj("pacing", pace)
        .obj("errors", errs)
        .u("errors_total", failed_calls)
        .u("end_markers_sent", end_markers)
        .set("series", intervals.map_or(Value::Null, |d| series_json(&d, o.size as u64)))
        .s("send_path", o.send.name())
        .set("zerocopy", zc.map_or(Value::Null, |z| zerocopy_json(&z, zc_waits, o.send)));
    Ok(out.into_value())
}

/// The io_uring of `--send io_uring[-zc]`: room for a batch of SQEs and, with zero-copy, for the
/// notifications of every buffer of the pool. Where io_uring is unavailable (kernel.io_uring_disabled,
/// a kernel without it or without the opcode), one line ending "cannot test here", exit 3.
fn open_ring(o: &TxOpts, pool: usize) -> Result<uring::Ring, Failure> {
    let name = o.send.name();
    let cq = (2 * o.batch + 2 * pool).next_power_of_two() as u32;
    let ring = uring::Ring::new(o.batch as u32, cq).map_err(|e| {
        Failure::Env(format!(
            "--send {}: io_uring_setup: {}{}: cannot test here",
            name,
            sys::describe(e),
            uring::unavailable_hint()
        ))
    })?;
    let (op, op_name, since) = if o.send == SendPath::IoUringZc {
        (uring::IORING_OP_SEND_ZC, "IORING_OP_SEND_ZC", "6.0")
    } else {
        (uring::IORING_OP_SEND, "IORING_OP_SEND", "5.6")
    };
    if !ring.supports(op) {
        return Err(Failure::Env(format!(
            "--send {}: this kernel's io_uring lacks {} (Linux {}): cannot test here",
            name, op_name, since
        )));
    }
    if (ring.capacity() as usize) < o.batch {
        return Err(Failure::Env(format!(
            "--send {}: the kernel gave an io_uring of {} SQEs for --batch {}: use --batch 1..{}",
            name,
            ring.capacity(),
            o.batch,
            ring.capacity()
        )));
    }
    Ok(ring)
}

/// The kernel's own account of the zero-copy sends: completed, copied after all, still held at the end.
fn zerocopy_json(z: &ZeroCopy, waits: u64, send: SendPath) -> Value {
    let (via, flag) = if send == SendPath::IoUringZc {
        ("IORING_OP_SEND_ZC", "IORING_NOTIF_USAGE_ZC_COPIED")
    } else {
        ("MSG_ZEROCOPY", "SO_EE_CODE_ZEROCOPY_COPIED")
    };
    let mut o = Obj::new();
    o.s("via", via)
        .s("copied_flag", flag)
        .u("sends", z.sends)
        .u("completed", z.completed)
        .u("copied", z.copied)
        .u("pending_at_end", z.in_flight as u64)
        .u("notifications", z.notifications)
        .u("buffer_waits", waits)
        .u("buffers", z.pool() as u64)
        .b("all_copied", z.completed > 0 && z.copied == z.completed);
    o.into_value()
}

/// The sender's rows: what the kernel accepted per interval, from the start of sending.
fn series_json(d: &Deltas, size: u64) -> Value {
    let rows = d
        .rows()
        .map(|(t, len, c)| {
            let (dg, failed) = (c[0], c[1]);
            Value::Arr(vec![
                Value::F64(t as f64 / 1e9),
                Value::F64(len as f64 / 1e9),
                Value::U64(dg as u64),
                Value::U64(dg as u64 * size),
                series::per_s((dg as u64 * size * 8) as f64, len),
                series::per_s(dg as f64, len),
                Value::U64(failed as u64),
            ])
        })
        .collect();
    let cols = ["t_s", "dur_s", "datagrams", "bytes", "bps", "pps", "failed_calls"];
    series::to_json(d.iv_ns(), "start", d.origin(), d.dropped, &cols, rows)
}

/// Reads the socket's error queue (RECVERR keeps ICMP errors there until read, and MSG_ZEROCOPY
/// completions always arrive there): completions go to `zc`, ICMP errors are dropped (the error
/// itself was already counted from the failed send).
fn read_error_queue(sock: &Socket, mut zc: Option<&mut ZeroCopy>) {
    let mut buf = [0u8; 256];
    let mut ctrl = [0u64; 64];
    for _ in 0..64 {
        if zc.as_ref().map_or(false, |z| z.in_flight == 0) {
            return; // every zero-copy send is accounted for: no recvmsg that can only say EAGAIN
        }
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: msghdr is plain data; all-zero is valid (null pointers, zero lengths).
        let mut msg: libc::msghdr = unsafe { mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = mem::size_of_val(&ctrl) as _;
        // SAFETY: msg points at `iov` (→ `buf`) and `ctrl`, all alive for the call, with their real sizes.
        let r = unsafe { libc::recvmsg(sock.fd, &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
        if r < 0 {
            return;
        }
        let z = match zc.as_mut() {
            Some(z) => z,
            None => continue,
        };
        // SAFETY: `msg` was filled by recvmsg; CMSG_FIRSTHDR/NXTHDR only walk its control buffer
        // (`ctrl`, alive here) within msg_controllen, returning null at its end.
        let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        while !c.is_null() {
            // SAFETY: `c` is a non-null header inside `ctrl` (above).
            let (level, kind) = unsafe { ((*c).cmsg_level, (*c).cmsg_type) };
            let recverr = (level == libc::SOL_IP && kind == libc::IP_RECVERR)
                || (level == libc::SOL_IPV6 && kind == libc::IPV6_RECVERR);
            if recverr {
                // SAFETY: an IP(V6)_RECVERR message carries a sock_extended_err (linux/errqueue.h) as its
                // data; CMSG_DATA points at it inside `ctrl`; read_unaligned makes no alignment assumption.
                let ee: libc::sock_extended_err =
                    unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::sock_extended_err) };
                if ee.ee_origin == SO_EE_ORIGIN_ZEROCOPY {
                    z.complete(ee.ee_info, ee.ee_data, ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED != 0);
                }
            }
            // SAFETY: as for CMSG_FIRSTHDR above; `c` is a header of this message.
            c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
        }
    }
}

/// After the run, tells the receiver how many datagrams were sent (seq field
/// of a header-only datagram with the END flag), at each of END_OFFSETS_MS
/// after `stop`: to the END port (`end_sock`, if any), then to the data port;
/// returns how many sends the kernel accepted.
///
/// The END port's marker goes first so it arrives while the receiver still
/// listens there (one that stops on the data port's marker closes both after
/// it): only later markers can meet a closed port (UdpNoPorts).
fn send_end_markers(sock: &Socket, end_sock: Option<&Socket>, run_id: u32, sent: u64, stop: u64) -> u64 {
    let mut buf = [0u8; HEADER_LEN];
    let mut ok = 0;
    for off in END_OFFSETS_MS.iter() {
        let t = stop + off * 1_000_000;
        pacing::wait_until(t);
        header::encode(&Header { flags: FLAG_END, run_id, seq: sent, tx_ns: sys::mono_ns() }, &mut buf);
        for s in end_sock.into_iter().chain(std::iter::once(sock)) {
            // SAFETY: the pointer and length describe `buf`, alive for the call.
            let r = unsafe { libc::send(s.fd, buf.as_ptr() as *const libc::c_void, buf.len(), 0) };
            if r >= 0 {
                ok += 1;
            }
        }
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_copy_pool_covers_what_the_send_buffer_admits() {
        // Linux's default send buffer (212992) holds 144 datagrams of 1472 B but 3 GSO sends of 44 x 1472 B.
        assert_eq!(zc_pool(212_992, 1472, 1), 256);
        assert_eq!(zc_pool(212_992, 44 * 1472, 1), 8);
        assert_eq!(zc_pool(212_992, 44 * 1472, 8), 16);
        assert_eq!(zc_pool(212_992, 1472, 512), 1024);
        assert_eq!(zc_pool(0, 1472, 1), 2);
    }
}
