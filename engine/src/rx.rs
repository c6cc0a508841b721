//! `offlab-engine rx`: receive, account every datagram, report one JSON object.

use std::collections::BTreeMap;
use std::mem;
use std::net::SocketAddr;

use crate::args::RxOpts;
use crate::gro;
use crate::header::{self, Decoded, FLAG_END};
use crate::json::{self, Obj, Value};
use crate::histogram::Histogram;
use crate::series::{self, Deltas};
use crate::stats::{Jitter, SeqKind, SeqTracker};
use crate::sys::{self, Buffer, Socket, SOL_UDP, UDP_GRO};

use crate::Failure;

/// One-way latencies are kept over the histogram's whole range: a skewed clock must not overflow.
const LATENCY_HIGHEST_NS: u64 = 1 << 62;

/// Room for any UDP datagram and for a UDP_GRO buffer (at most 64 KiB).
const BUF_LEN: usize = 65536;
/// Room for the UDP_GRO cmsg (24 bytes on 64-bit) and then some.
const CTRL_WORDS: usize = 16;
/// How often a blocked receive wakes to check timeouts and signals.
const POLL_NS: u64 = 20_000_000;
/// After the sender's END marker, wait this long for stragglers.
const END_GRACE_NS: u64 = 50_000_000;
/// Sequence numbers remembered below the highest one, for duplicates.
const SEQ_WINDOW: u64 = 1 << 22;

/// Everything counted while receiving; `record` is the per-datagram path.
struct Counters {
    run_id: Option<u32>,
    datagrams: u64,
    bytes: u64,
    foreign: u64,
    foreign_bytes: u64,
    truncated: u64,
    messages: u64,
    /// Datagrams of any kind (ours, END markers, foreign) in the messages.
    segments: u64,
    gro_buffers: u64,
    calls: u64,
    socket_drops: Option<u64>,
    first_rx: u64,
    last_rx: u64,
    latency_negative: u64,
    tx_datagrams: Option<u64>,
    end_seen_at: u64,
    seq: SeqTracker,
    jitter: Jitter,
    latency: Histogram,
    /// A run of equal latencies not yet in `latency`: a GSO send's segments
    /// share tx and rx times, so they are recorded at once.
    lat_run: u64,
    lat_run_n: u64,
    recv_errors: BTreeMap<String, u64>,
}

impl Counters {
    fn new(run_id: Option<u32>) -> Counters {
        Counters {
            run_id,
            datagrams: 0,
            bytes: 0,
            foreign: 0,
            foreign_bytes: 0,
            truncated: 0,
            messages: 0,
            segments: 0,
            gro_buffers: 0,
            calls: 0,
            socket_drops: None,
            first_rx: 0,
            last_rx: 0,
            latency_negative: 0,
            tx_datagrams: None,
            end_seen_at: 0,
            seq: SeqTracker::new(SEQ_WINDOW),
            jitter: Jitter::default(),
            latency: Histogram::new(LATENCY_HIGHEST_NS),
            lat_run: 0,
            lat_run_n: 0,
            recv_errors: BTreeMap::new(),
        }
    }

    #[inline(always)]
    fn record(&mut self, seg: &[u8], rx_ns: u64) {
        let h = match header::decode(seg) {
            Decoded::Ok(h) => h,
            Decoded::Foreign => {
                self.foreign += 1;
                self.foreign_bytes += seg.len() as u64;
                return;
            }
        };
        let run = match self.run_id {
            Some(r) => r,
            None => {
                self.run_id = Some(h.run_id);
                h.run_id
            }
        };
        if h.run_id != run {
            self.foreign += 1;
            self.foreign_bytes += seg.len() as u64;
            return;
        }
        if h.flags & FLAG_END != 0 {
            if self.tx_datagrams.is_none() {
                self.end_seen_at = rx_ns;
            }
            self.tx_datagrams = Some(h.seq);
            return;
        }
        self.datagrams += 1;
        self.bytes += seg.len() as u64;
        if self.first_rx == 0 {
            self.first_rx = rx_ns;
        }
        self.last_rx = rx_ns;
        if self.seq.record(h.seq) == SeqKind::Duplicate {
            return;
        }
        self.jitter.record(h.tx_ns, rx_ns);
        if rx_ns >= h.tx_ns {
            let lat = rx_ns - h.tx_ns;
            if lat == self.lat_run && self.lat_run_n > 0 {
                self.lat_run_n += 1;
            } else {
                self.latency.record_n(self.lat_run, self.lat_run_n);
                self.lat_run = lat;
                self.lat_run_n = 1;
            }
        } else {
            self.latency_negative += 1;
        }
    }

    /// What the per-interval rows count, cumulative: datagrams, bytes, lost, reordered, duplicates.
    #[inline]
    fn cumulative(&self) -> [u64; 5] {
        [self.datagrams, self.bytes, self.seq.lost(), self.seq.reordered, self.seq.duplicates]
    }

    /// Puts the pending run of equal latencies into the histogram.
    fn flush(&mut self) {
        self.latency.record_n(self.lat_run, self.lat_run_n);
        self.lat_run_n = 0;
    }
}

/// Reads the gso_size from the UDP_GRO cmsg (0 if there is none).
fn read_gso_size(hdr: &libc::msghdr) -> usize {
    let mut gso = 0usize;
    // SAFETY: `hdr` is the msghdr recvmsg/recvmmsg just filled: msg_control points at our control
    // buffer and msg_controllen says how much of it the kernel wrote, so CMSG_FIRSTHDR/NXTHDR stay
    // inside it or return null; the cmsg data may be unaligned, hence read_unaligned.
    unsafe {
        let mut cm = libc::CMSG_FIRSTHDR(hdr);
        while !cm.is_null() {
            let c = &*cm;
            if c.cmsg_level == SOL_UDP && c.cmsg_type == UDP_GRO {
                gso = std::ptr::read_unaligned(libc::CMSG_DATA(cm) as *const libc::c_int).max(0) as usize;
            }
            cm = libc::CMSG_NXTHDR(hdr, cm);
        }
    }
    gso
}

/// Records what waits on the END port (the sender's END markers), without waiting.
fn read_end_port(sock: &Socket, c: &mut Counters, buf: &mut [u8], now: u64) {
    loop {
        // SAFETY: the pointer and length describe `buf`, a writable buffer alive for the call.
        let r = unsafe { libc::recv(sock.fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), libc::MSG_DONTWAIT) };
        if r < 0 {
            return;
        }
        c.record(&buf[..r as usize], now);
    }
}

/// Datagrams the kernel dropped for this socket (full receive buffer), read
/// once at the end with SO_MEMINFO so the receive path pays nothing for it.
fn socket_drops(sock: &Socket) -> Option<u64> {
    const SK_MEMINFO_DROPS: usize = 8;
    let mut info = [0u32; 16];
    let mut len = mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: the pointer and length describe `info`, a writable array; the kernel writes at most `len`.
    let r = unsafe {
        libc::getsockopt(
            sock.fd,
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            info.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 || (len as usize) < (SK_MEMINFO_DROPS + 1) * 4 {
        return None;
    }
    Some(info[SK_MEMINFO_DROPS] as u64)
}

pub fn run(o: &RxOpts) -> Result<Value, Failure> {
    if let Some(cpu) = o.cpu {
        sys::pin_cpu(cpu).map_err(Failure::Arg)?;
    }
    sys::install_stop_signals();
    let sock = Socket::udp(o.bind.is_ipv6()).map_err(|e| Failure::Env(e.0))?;
    let rcvbuf = sock.size_buffer(Buffer::Receive, o.rcvbuf).map_err(|e| Failure::Env(e.0))?;
    if o.gro {
        if let Err(e) = sock.set_int(SOL_UDP, UDP_GRO, 1) {
            return Err(Failure::Env(format!(
                "--gro: setsockopt UDP_GRO: {} (needs Linux 5.0 or later)",
                sys::describe(e)
            )));
        }
    }
    let _ = sock.set_timeout(libc::SO_RCVTIMEO, POLL_NS);
    let want = SocketAddr::new(o.bind, o.port);
    if let Err(e) = sock.bind(&want) {
        return Err(Failure::Env(sys::env_err(&format!("--bind {} --port {}: bind", o.bind, o.port), e).0));
    }
    let local = sock.local_addr().unwrap_or(want);
    // A receiver that falls behind (one sharing its CPU with a switch that busy-polls: docs/dpdk.md) can
    // still have a full socket when the sender's END markers come, tens of ms after the run, and the kernel
    // drops them with the data: the END port holds them until the data port has gone quiet.
    let end_sock = match o.end_port {
        Some(port) => {
            let end_sock = Socket::udp(o.bind.is_ipv6()).map_err(|e| Failure::Env(e.0))?;
            if let Err(e) = end_sock.bind(&SocketAddr::new(o.bind, port)) {
                return Err(Failure::Env(sys::env_err(&format!("--bind {} --end-port {}: bind", o.bind, port), e).0));
            }
            Some(end_sock)
        }
        None => None,
    };
    let mut end_buf = vec![0u8; if end_sock.is_some() { BUF_LEN } else { 0 }];
    sys::announce_ready(o.ready_file.as_deref(), &local).map_err(|e| Failure::Env(e.0))?;

    let batch = o.batch;
    let mut bufs: Vec<Vec<u8>> = (0..batch).map(|_| vec![0u8; BUF_LEN]).collect();
    let mut ctrls: Vec<[u64; CTRL_WORDS]> = vec![[0u64; CTRL_WORDS]; batch];
    let mut messages = sys::Batch::new(&mut bufs);
    let msgs = &mut messages.msgs;
    if o.gro {
        for (m, ctrl) in msgs.iter_mut().zip(ctrls.iter_mut()) {
            m.msg_hdr.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
        }
    }

    let mut c = Counters::new(o.run_id);
    let start = sys::mono_ns();
    let start_wall = sys::realtime_ns();
    let deadline = if o.duration > 0.0 {
        start + (o.duration * 1e9) as u64
    } else {
        u64::MAX
    };
    let idle_ns = (o.idle_timeout * 1e9) as u64;
    // Rows from the first data datagram; a call's datagrams count in the interval of its return.
    let mut intervals = if o.interval_ms > 0 { Some(Deltas::new(o.interval_ms * 1_000_000, 5)) } else { None };
    let stop_reason;
    loop {
        if sys::stop_requested() {
            stop_reason = "signal";
            break;
        }
        if o.gro {
            for m in msgs.iter_mut() {
                m.msg_hdr.msg_controllen = (CTRL_WORDS * 8) as _;
            }
        }
        // SAFETY: each msgs[i] points (through its iovec) at bufs[i] and, with --gro, at ctrls[i];
        // none of these vectors is resized or dropped while msgs is in use, the lengths given are
        // their real sizes (BUF_LEN, CTRL_WORDS * 8) and at most `batch` = msgs.len() entries are passed.
        let n = unsafe {
            if batch == 1 && !o.gro {
                // Plain recv: no msghdr to copy in and out, the cheapest call.
                let r = libc::recv(sock.fd, bufs[0].as_mut_ptr() as *mut libc::c_void, BUF_LEN, 0);
                if r >= 0 {
                    msgs[0].msg_len = r as libc::c_uint;
                    msgs[0].msg_hdr.msg_flags = 0;
                    1
                } else {
                    -1
                }
            } else if batch == 1 {
                let r = libc::recvmsg(sock.fd, &mut msgs[0].msg_hdr, 0);
                if r >= 0 {
                    msgs[0].msg_len = r as libc::c_uint;
                    1
                } else {
                    -1
                }
            } else {
                libc::recvmmsg(
                    sock.fd,
                    msgs.as_mut_ptr(),
                    batch as libc::c_uint,
                    libc::MSG_WAITFORONE as _,
                    std::ptr::null_mut(),
                ) as isize
            }
        };
        let now = sys::mono_ns();
        if n < 0 {
            let e = sys::errno();
            if e == libc::EAGAIN {
                // POLL_NS without a datagram: whatever was queued has been read, so an END marker is not early
                if let Some(end_sock) = &end_sock {
                    read_end_port(end_sock, &mut c, &mut end_buf, now);
                }
            } else if e != libc::EINTR {
                *c.recv_errors.entry(sys::errno_name(e)).or_insert(0) += 1;
            }
        } else {
            c.calls += 1;
            let before = if intervals.is_some() { c.cumulative() } else { [0; 5] };
            for (i, m) in msgs.iter().enumerate().take(n as usize) {
                let len = m.msg_len as usize;
                if m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                    c.truncated += 1;
                }
                let gso = if o.gro { read_gso_size(&m.msg_hdr) } else { 0 };
                c.messages += 1;
                let count = gro::count(len, gso) as u64;
                c.segments += count;
                if count > 1 {
                    c.gro_buffers += 1;
                }
                let buf = &bufs[i][..len.min(BUF_LEN)];
                let mut off = 0usize;
                for seg_len in gro::segments(buf.len(), gso) {
                    c.record(&buf[off..off + seg_len], now);
                    off += seg_len;
                }
            }
            // Only calls that brought data move the rows on: no empty rows after the last datagram.
            if let Some(d) = intervals.as_mut() {
                if c.datagrams > before[0] {
                    if d.started() {
                        d.tick(now, &before);
                    } else {
                        d.start(c.first_rx);
                    }
                }
            }
        }
        if now >= deadline {
            stop_reason = "duration";
            break;
        }
        if idle_ns > 0 && c.last_rx > 0 && now.saturating_sub(c.last_rx.max(c.end_seen_at)) >= idle_ns {
            stop_reason = "idle";
            break;
        }
        if !o.ignore_end {
            if let Some(sent) = c.tx_datagrams {
                if c.seq.unique >= sent || now.saturating_sub(c.end_seen_at) >= END_GRACE_NS {
                    stop_reason = "end";
                    break;
                }
            }
        }
    }
    let end = sys::mono_ns();
    c.socket_drops = socket_drops(&sock);
    c.flush();
    if let Some(d) = intervals.as_mut() {
        d.finish(c.last_rx, &c.cumulative());
    }
    let mut out = report(o, &local, rcvbuf, &c, start, start_wall, end, stop_reason);
    if let Value::Obj(fields) = &mut out {
        fields.push(("series".to_string(), intervals.map_or(Value::Null, |d| series_json(&d))));
    }
    Ok(out)
}

/// The receiver's rows, from the first data datagram: `lost` is the change of `lost` (missing
/// below the highest seq), negative when late datagrams fill older gaps; the rows sum to the totals.
fn series_json(d: &Deltas) -> Value {
    let rows = d
        .rows()
        .map(|(t, len, c)| {
            Value::Arr(vec![
                Value::F64(t as f64 / 1e9),
                Value::F64(len as f64 / 1e9),
                Value::U64(c[0] as u64),
                Value::U64(c[1] as u64),
                series::per_s((c[1] * 8) as f64, len),
                series::per_s(c[0] as f64, len),
                Value::F64(c[2] as f64),
                Value::U64(c[3] as u64),
                Value::U64(c[4] as u64),
            ])
        })
        .collect();
    let cols = ["t_s", "dur_s", "datagrams", "bytes", "bps", "pps", "lost", "reordered", "duplicates"];
    series::to_json(d.iv_ns(), "first_rx", d.origin(), d.dropped, &cols, rows)
}

#[allow(clippy::too_many_arguments)]
fn report(
    o: &RxOpts,
    local: &SocketAddr,
    rcvbuf: u64,
    c: &Counters,
    start: u64,
    start_wall: u64,
    end: u64,
    stop_reason: &str,
) -> Value {
    let mut opts = Obj::new();
    opts.s("bind", &o.bind.to_string())
        .u("port", o.port as u64)
        .b("gro", o.gro)
        .u("batch", o.batch as u64)
        .u("rcvbuf_bytes", o.rcvbuf)
        .f("duration_s", o.duration)
        .f("idle_timeout_s", o.idle_timeout)
        .opt_s("ready_file", o.ready_file.as_deref())
        .opt_u("run_id", o.run_id.map(|r| r as u64))
        .opt_u("cpu", o.cpu.map(|x| x as u64))
        .b("ignore_end", o.ignore_end)
        .opt_u("end_port", o.end_port.map(|p| p as u64))
        .u("interval_ms", o.interval_ms);

    let window_ns = c.last_rx.saturating_sub(c.first_rx);
    let window_s = window_ns as f64 / 1e9;
    let have_window = c.datagrams > 1 && window_ns > 0;
    let unique = c.seq.unique;

    let mut lat = Obj::new();
    let us = |v: Option<u64>| v.map(|x| x as f64 / 1e3);
    lat.opt_f("min", us(if c.latency.n > 0 { Some(c.latency.min) } else { None }))
        .opt_f("mean", c.latency.mean().map(|m| m / 1e3))
        .opt_f("p50", us(c.latency.percentile(50.0)))
        .opt_f("p90", us(c.latency.percentile(90.0)))
        .opt_f("p99", us(c.latency.percentile(99.0)))
        .opt_f("max", us(if c.latency.n > 0 { Some(c.latency.max) } else { None }))
        .u("samples", c.latency.n)
        .u("negative", c.latency_negative);

    let mut errs = Obj::new();
    for (k, v) in &c.recv_errors {
        errs.u(k, *v);
    }

    let lost_vs_tx = c.tx_datagrams.map(|s| s.saturating_sub(unique));
    let mut out = json::envelope("rx", opts);
    out.s("local", &local.to_string())
        .u("rcvbuf_bytes", rcvbuf)
        .opt_u("run_id", c.run_id.map(|r| r as u64))
        .s("stop_reason", stop_reason)
        .s("clock", "CLOCK_MONOTONIC")
        .u("start_unix_ns", start_wall)
        .f("elapsed_s", (end - start) as f64 / 1e9)
        .u("datagrams", c.datagrams)
        .u("unique_datagrams", unique)
        .u("bytes", c.bytes)
        .u("calls", c.calls)
        .u("messages", c.messages)
        .u("gro_buffers", c.gro_buffers)
        .opt_f(
            "datagrams_per_message",
            if c.messages > 0 { Some(c.segments as f64 / c.messages as f64) } else { None },
        )
        .opt_f(
            "datagrams_per_call",
            if c.calls > 0 { Some(c.segments as f64 / c.calls as f64) } else { None },
        )
        .opt_u("highest_seq", c.seq.highest())
        .u("lost", c.seq.lost())
        .opt_f(
            "loss_ratio",
            if c.seq.next_expected > 0 { Some(c.seq.lost() as f64 / c.seq.next_expected as f64) } else { None },
        )
        .opt_u("tx_datagrams", c.tx_datagrams)
        .opt_u("lost_vs_tx", lost_vs_tx)
        .opt_f(
            "loss_ratio_vs_tx",
            match c.tx_datagrams {
                Some(s) if s > 0 => Some(s.saturating_sub(unique) as f64 / s as f64),
                _ => None,
            },
        )
        .u("duplicates", c.seq.duplicates)
        .u("reordered", c.seq.reordered)
        .u("too_old", c.seq.too_old)
        .u("foreign", c.foreign)
        .u("foreign_bytes", c.foreign_bytes)
        .u("truncated", c.truncated)
        .opt_u("socket_drops", c.socket_drops)
        .opt_f("jitter_us", if unique > 1 { Some(c.jitter.ns() / 1e3) } else { None })
        .obj("latency_us", lat)
        .opt_u("first_rx_mono_ns", if c.datagrams > 0 { Some(c.first_rx) } else { None })
        .opt_u("last_rx_mono_ns", if c.datagrams > 0 { Some(c.last_rx) } else { None })
        .opt_f("window_s", if c.datagrams > 0 { Some(window_s) } else { None })
        .opt_f("goodput_bps", if have_window { Some(c.bytes as f64 * 8.0 / window_s) } else { None })
        .opt_f("pps", if have_window { Some(c.datagrams as f64 / window_s) } else { None })
        .obj("recv_errors", errs);
    out.into_value()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::{encode, Header};

    fn dgram(run_id: u32, seq: u64, tx_ns: u64, flags: u8, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        encode(&Header { flags, run_id, seq, tx_ns }, &mut b);
        b
    }

    #[test]
    fn first_run_id_is_locked_and_others_are_foreign() {
        let mut c = Counters::new(None);
        c.record(&dgram(7, 0, 100, 0, 100), 1_100);
        c.record(&dgram(8, 0, 100, 0, 100), 1_200);
        c.record(b"not ours at all, no magic here", 1_300);
        c.record(&dgram(7, 1, 200, 0, 100), 1_400);
        c.flush();
        assert_eq!((c.datagrams, c.bytes, c.foreign, c.foreign_bytes), (2, 200, 2, 130));
        assert_eq!(c.run_id, Some(7));
        assert_eq!((c.first_rx, c.last_rx), (1_100, 1_400));
        assert_eq!(c.latency.n, 2);
        assert_eq!(c.latency.min, 1_000);
        assert_eq!(c.latency.max, 1_200);
    }

    #[test]
    fn end_marker_carries_the_sent_count_and_is_not_data() {
        let mut c = Counters::new(Some(3));
        c.record(&dgram(3, 0, 0, 0, 64), 10);
        c.record(&dgram(3, 2, 0, 0, 64), 20);
        c.record(&dgram(3, 4, 0, FLAG_END, 24), 30);
        assert_eq!(c.datagrams, 2);
        assert_eq!(c.tx_datagrams, Some(4));
        assert_eq!(c.end_seen_at, 30);
        assert_eq!(c.seq.lost(), 1); // seq 1 is missing below the highest (2)
    }

    #[test]
    fn gro_buffer_split_accounts_every_segment() {
        // Three datagrams of 100 bytes coalesced, the last one 40 bytes.
        let mut buf = dgram(1, 0, 0, 0, 100);
        buf.extend(dgram(1, 1, 0, 0, 100));
        buf.extend(dgram(1, 2, 0, 0, 40));
        let mut c = Counters::new(None);
        let mut off = 0;
        for l in gro::segments(buf.len(), 100) {
            c.record(&buf[off..off + l], 5);
            off += l;
        }
        assert_eq!((c.datagrams, c.bytes, c.seq.unique, c.seq.lost()), (3, 240, 3, 0));
    }
}

#[cfg(test)]
mod cost {
    use super::*;
    use crate::header::{encode, Header};

    /// Per-datagram accounting cost on 44-segment GRO buffers; a measurement,
    /// not a check: `cargo test --release -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn accounting_cost_per_datagram() {
        let (size, segs, rounds) = (1472usize, 44usize, 100_000u64);
        let mut buf = vec![0u8; size * segs];
        let mut c = Counters::new(None);
        let t0 = sys::mono_ns();
        for r in 0..rounds {
            for s in 0..segs {
                let seq = r * segs as u64 + s as u64;
                encode(&Header { flags: 0, run_id: 1, seq, tx_ns: t0 }, &mut buf[s * size..]);
            }
            let now = sys::mono_ns();
            let mut off = 0;
            for l in gro::segments(buf.len(), size) {
                c.record(&buf[off..off + l], now);
                off += l;
            }
        }
        let ns = (sys::mono_ns() - t0) as f64 / (rounds * segs as u64) as f64;
        assert_eq!(c.seq.unique, rounds * segs as u64);
        println!("encode + account: {:.1} ns per datagram", ns);
    }
}
