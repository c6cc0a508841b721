//! `offlab-engine rr`: request/response round trips (UDP, TCP, TCP connect +
//! request/response) over N flows, closed loop or at a target rate, into an
//! RTT histogram; one JSON object on stdout.
//!
//! At a target rate, transaction k of flow i is due at
//! `start + i / rate + k * flows / rate` and its RTT counts from that due
//! time, not from when it was sent: a flow held up by a slow answer sends late
//! and the wait shows in the RTT (no coordinated omission).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::json::{self, Obj, Value};
use crate::rr_args::{Proto, RrOpts};
use crate::rr_wire::{self, decode, encode, Io, RrHeader, FLAG_CLOSE, HEADER_LEN};
use crate::histogram::Histogram;
use crate::series::{self, RrSeries};
use crate::sys::{self, Socket};
use crate::Failure;

/// Clock read pairs timed at start to state the engine's own timing overhead.
const CLOCK_SAMPLES: usize = 20_000;
/// Flows start together this long after the sockets are set up.
const START_DELAY_NS: u64 = 20_000_000;

struct Flow {
    rtt: Histogram,
    /// RTT from the moment the request was actually sent (= `rtt` in closed loop).
    service: Histogram,
    transactions: u64,
    lost: u64,
    unsent: u64,
    late_responses: u64,
    bad_responses: u64,
    requests_sent: u64,
    responses_received: u64,
    transactions_total: u64,
    connects: u64,
    connect_failures: u64,
    max_lag_ns: u64,
    late_sends: u64,
    errors: BTreeMap<i32, u64>,
}

impl Flow {
    fn new(highest_ns: u64) -> Flow {
        Flow {
            rtt: Histogram::new(highest_ns),
            service: Histogram::new(highest_ns),
            transactions: 0,
            lost: 0,
            unsent: 0,
            late_responses: 0,
            bad_responses: 0,
            requests_sent: 0,
            responses_received: 0,
            transactions_total: 0,
            connects: 0,
            connect_failures: 0,
            max_lag_ns: 0,
            late_sends: 0,
            errors: BTreeMap::new(),
        }
    }
    fn error(&mut self, e: i32) {
        *self.errors.entry(e).or_insert(0) += 1;
    }
}

/// The cost of one pair of CLOCK_MONOTONIC reads (ns): min, median, p99.
fn clock_overhead() -> (u64, u64, u64) {
    let mut d: Vec<u64> = Vec::with_capacity(CLOCK_SAMPLES);
    for _ in 0..CLOCK_SAMPLES {
        let a = sys::mono_ns();
        let b = sys::mono_ns();
        d.push(b - a);
    }
    d.sort_unstable();
    (d[0], d[d.len() / 2], d[d.len() * 99 / 100])
}

#[derive(Clone, Copy)]
struct Plan {
    start: u64,
    warm_end: u64,
    end: u64,
    /// ns between a flow's transactions at the target rate; None = closed loop.
    interval: Option<f64>,
    phase: f64,
    timeout_ns: u64,
}

impl Plan {
    fn due(&self, k: u64) -> u64 {
        match self.interval {
            Some(iv) => self.start + (self.phase + k as f64 * iv) as u64,
            None => 0,
        }
    }
    /// Transactions due in the window [warm_end, end) from number `k` on.
    fn unsent_from(&self, k: u64) -> u64 {
        let iv = match self.interval {
            Some(iv) => iv,
            None => return 0,
        };
        let pos = |t: u64| (t.saturating_sub(self.start) as f64 - self.phase) / iv;
        let first = (pos(self.warm_end).ceil().max(0.0) as u64).max(k);
        let last = pos(self.end).ceil().max(0.0) as u64; // first due at or after end
        last.saturating_sub(first)
    }
}

pub fn run(o: &RrOpts) -> Result<Value, Failure> {
    if let Some(cpu) = o.cpu {
        sys::pin_cpu(cpu).map_err(Failure::Arg)?;
    }
    sys::install_stop_signals();
    sys::set_timer_slack_min();
    let dest = SocketAddr::new(o.dest, o.port);
    let (clk_min, clk_p50, clk_p99) = clock_overhead();
    // UDP sockets are made here, so a missing route is exit 3 before any flow runs.
    let mut udp: Vec<Option<Socket>> = Vec::new();
    for _ in 0..o.flows {
        if o.proto == Proto::Udp {
            let s = Socket::udp(o.dest.is_ipv6()).map_err(|e| Failure::Env(e.0))?;
            if let Err(e) = s.connect(&dest) {
                return Err(Failure::Env(sys::env_err(&format!("--dest {} --port {}: connect", o.dest, o.port), e).0));
            }
            rr_wire::set_nonblocking(&s);
            udp.push(Some(s));
        } else {
            udp.push(None);
        }
    }
    let highest_ns = (o.histogram_max * 1e9) as u64;
    let start = sys::mono_ns() + START_DELAY_NS;
    let start_wall = sys::realtime_ns() + START_DELAY_NS;
    let warm_end = start + (o.warmup * 1e9) as u64;
    let end = warm_end + (o.duration * 1e9) as u64;
    let intervals = if o.interval_ms > 0 {
        Some(Arc::new(RrSeries::new(o.interval_ms * 1_000_000, start, warm_end, end, o.flows, highest_ns)))
    } else {
        None
    };
    let mut handles = Vec::new();
    for (i, sock) in udp.into_iter().enumerate() {
        let plan = Plan {
            start,
            warm_end,
            end,
            interval: o.rate.map(|r| 1e9 * o.flows as f64 / r),
            phase: o.rate.map(|r| 1e9 * i as f64 / r).unwrap_or(0.0),
            timeout_ns: (o.timeout * 1e9) as u64,
        };
        let o2 = o.clone();
        let rows = intervals.clone();
        handles.push(std::thread::spawn(move || {
            if let Some(cpu) = o2.cpu {
                let _ = sys::pin_cpu(cpu);
            }
            let mut f = Flow::new(highest_ns);
            flow(&o2, i as u32, dest, sock, plan, &mut f, rows.as_deref());
            f
        }));
    }
    let flows: Vec<Flow> = handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Flow::new(highest_ns))).collect();
    let stop = sys::mono_ns();
    let stop_reason = if sys::stop_requested() { "signal" } else { "duration" };
    let mut out = report(o, &dest, &flows, start, start_wall, warm_end, end, stop, stop_reason, (clk_min, clk_p50, clk_p99));
    if let Value::Obj(fields) = &mut out {
        fields.push(("series".to_string(), intervals.map_or(Value::Null, |s| series_json(&s))));
    }
    Ok(out)
}

/// Runs one flow's transactions until the window ends.
fn flow(o: &RrOpts, id: u32, dest: SocketAddr, udp: Option<Socket>, plan: Plan, f: &mut Flow, rows: Option<&RrSeries>) {
    let mut interval = rows.map(|r| r.flow(id as usize));
    let flags = if o.proto == Proto::TcpCrr { FLAG_CLOSE } else { 0 };
    let mut req = vec![0u8; o.request_size];
    let mut resp = vec![0u8; o.response_size.max(65536)];
    let mut conn: Option<Socket> = None;
    if o.proto == Proto::Tcp {
        // The persistent connection is set up before timing starts.
        conn = connect(&dest, plan.start, f);
    }
    crate::pacing::wait_until(plan.start);
    let mut k: u64 = 0;
    loop {
        if sys::stop_requested() {
            break;
        }
        let mut now = sys::mono_ns();
        let due = match plan.interval {
            Some(iv) => {
                let due = plan.due(k);
                if due >= plan.end {
                    break;
                }
                if now >= plan.end {
                    f.unsent += plan.unsent_from(k);
                    break;
                }
                if due > now {
                    now = crate::pacing::wait_until_exact(due);
                    if sys::stop_requested() {
                        break;
                    }
                }
                let lag = now.saturating_sub(due);
                f.max_lag_ns = f.max_lag_ns.max(lag);
                if lag as f64 > iv {
                    f.late_sends += 1;
                }
                due
            }
            None => {
                if now >= plan.end {
                    break;
                }
                now
            }
        };
        let counted = due >= plan.warm_end;
        let h = RrHeader {
            flags,
            response_size: o.response_size as u32,
            seq: k,
            request_size: o.request_size as u32,
            flow: id,
        };
        encode(&h, &mut req);
        let sent_at = sys::mono_ns();
        let deadline = sent_at + plan.timeout_ns;
        let got = match o.proto {
            Proto::Udp => udp_transaction(udp.as_ref().unwrap(), &req, &mut resp, &h, deadline, f),
            Proto::Tcp => {
                if conn.is_none() {
                    conn = connect(&dest, deadline, f);
                }
                let r = match conn.as_ref() {
                    Some(c) => tcp_transaction(c, &req, &mut resp[..o.response_size], &h, deadline, f),
                    None => None,
                };
                if r.is_none() {
                    conn = None; // the stream's framing is lost with the transaction
                }
                r
            }
            Proto::TcpCrr => connect(&dest, deadline, f).and_then(|c| {
                let r = tcp_transaction(&c, &req, &mut resp[..o.response_size], &h, deadline, f);
                if r.is_some() {
                    // Wait for the server's FIN (after the RTT is taken), so the
                    // server closes first and keeps the TIME_WAIT.
                    let mut b = [0u8; 1];
                    let _ = rr_wire::read_exact(&c, &mut b, deadline.max(sys::mono_ns() + 1_000_000));
                }
                r
            }),
        };
        f.transactions_total += 1;
        if let (Some(r), Some(i)) = (rows, interval.as_mut()) {
            r.record(i, due, got.map(|t| t.saturating_sub(due)));
        }
        match got {
            Some(t) => {
                if counted {
                    f.transactions += 1;
                    f.rtt.record(t.saturating_sub(due));
                    f.service.record(t.saturating_sub(sent_at));
                }
            }
            None => {
                if counted {
                    f.lost += 1;
                }
                // A refused or reset peer fails at once: wait the timeout out,
                // so a dead peer costs one timeout per transaction, not a spin.
                crate::pacing::wait_until(deadline);
            }
        }
        k += 1;
    }
    if let (Some(r), Some(i)) = (rows, interval.as_mut()) {
        r.finish(i);
    }
}

/// Rows aligned on the window's start: t_s < 0 (and `warmup` true) before it, excluded from
/// the totals as those transactions are; the other rows sum to `transactions` and `lost`.
fn series_json(s: &RrSeries) -> Value {
    let rows = s
        .rows()
        .into_iter()
        .map(|(idx, t, len, r)| {
            let us = |v: Option<u64>| v.map_or(Value::Null, |x| Value::F64(x as f64 / 1e3));
            Value::Arr(vec![
                Value::F64(t as f64 / 1e9),
                Value::F64(len as f64 / 1e9),
                Value::Bool(idx < 0),
                Value::U64(r.transactions),
                Value::U64(r.lost),
                series::per_s(r.transactions as f64, len),
                us(r.p50),
                us(r.p99),
                us(r.max),
            ])
        })
        .collect();
    let cols = ["t_s", "dur_s", "warmup", "transactions", "lost", "tps", "rtt_p50_us", "rtt_p99_us", "rtt_max_us"];
    series::to_json(s.iv, "window_start", Some(s.window_start()), s.dropped, &cols, rows)
}

/// Sends the request and waits for its response; returns the receive time.
/// A TCP connection to the server, counted as a connect or a failure (with its errno).
fn connect(dest: &SocketAddr, deadline: u64, f: &mut Flow) -> Option<Socket> {
    match rr_wire::connect_tcp(dest, deadline) {
        Ok(s) => {
            f.connects += 1;
            Some(s)
        }
        Err(e) => {
            f.connect_failures += 1;
            if let Io::Err(e) = e {
                f.error(e);
            }
            None
        }
    }
}

fn udp_transaction(s: &Socket, req: &[u8], resp: &mut [u8], h: &RrHeader, deadline: u64, f: &mut Flow) -> Option<u64> {
    // SAFETY: `req` is borrowed for the call, pointer and length from it.
    let r = unsafe { libc::send(s.fd, req.as_ptr() as *const libc::c_void, req.len(), 0) };
    if r < 0 {
        f.error(sys::errno());
    } else {
        f.requests_sent += 1;
    }
    loop {
        // SAFETY: `resp` is borrowed mutably for the call, pointer and length from it.
        let r = unsafe { libc::recv(s.fd, resp.as_mut_ptr() as *mut libc::c_void, resp.len(), libc::MSG_DONTWAIT) };
        let t = sys::mono_ns();
        if r >= 0 {
            f.responses_received += 1;
            let n = r as usize;
            match decode(&resp[..n]) {
                Some(g) if g.flow == h.flow && g.seq == h.seq && n == h.response_size as usize => return Some(t),
                Some(g) if g.flow == h.flow && g.seq < h.seq => f.late_responses += 1,
                _ => f.bad_responses += 1,
            }
            continue;
        }
        let e = sys::errno();
        if e != libc::EAGAIN && e != libc::EINTR {
            f.error(e); // e.g. ECONNREFUSED: an ICMP port unreachable from the peer
        }
        if t >= deadline || sys::stop_requested() {
            return None;
        }
        rr_wire::wait_fd(s.fd, libc::POLLIN, deadline);
    }
}

/// One request/response on a TCP connection; returns the time the whole response was in.
fn tcp_transaction(c: &Socket, req: &[u8], resp: &mut [u8], h: &RrHeader, deadline: u64, f: &mut Flow) -> Option<u64> {
    match rr_wire::write_all(c, req, deadline) {
        Io::Done => f.requests_sent += 1,
        Io::Err(e) => {
            f.error(e);
            return None;
        }
        _ => return None,
    }
    match rr_wire::read_exact(c, resp, deadline) {
        Io::Done => {}
        Io::Err(e) => {
            f.error(e);
            return None;
        }
        _ => return None,
    }
    let t = sys::mono_ns();
    f.responses_received += 1;
    match decode(&resp[..HEADER_LEN]) {
        Some(g) if g.flow == h.flow && g.seq == h.seq => Some(t),
        _ => {
            f.bad_responses += 1;
            None
        }
    }
}

fn us(ns: Option<u64>) -> Option<f64> {
    ns.map(|v| v as f64 / 1e3)
}

#[allow(clippy::too_many_arguments)]
fn report(
    o: &RrOpts,
    dest: &SocketAddr,
    flows: &[Flow],
    start: u64,
    start_wall: u64,
    warm_end: u64,
    end: u64,
    stop: u64,
    stop_reason: &str,
    clk: (u64, u64, u64),
) -> Value {
    let highest_ns = (o.histogram_max * 1e9) as u64;
    let mut rtt = Histogram::new(highest_ns);
    let mut service = Histogram::new(highest_ns);
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let sum = |g: &dyn Fn(&Flow) -> u64| flows.iter().map(g).sum::<u64>();
    for f in flows {
        rtt.merge(&f.rtt);
        service.merge(&f.service);
        for (e, n) in &f.errors {
            *errors.entry(sys::errno_name(*e)).or_insert(0) += n;
        }
    }
    let window_s = (end - warm_end) as f64 / 1e9;
    let transactions = sum(&|f| f.transactions);
    let mut opts = Obj::new();
    opts.s("dest", &o.dest.to_string())
        .u("port", o.port as u64)
        .s("proto", o.proto.name())
        .u("request_size", o.request_size as u64)
        .u("response_size", o.response_size as u64)
        .u("flows", o.flows as u64)
        .s("rate", &o.rate_text)
        .f("duration_s", o.duration)
        .f("warmup_s", o.warmup)
        .f("timeout_s", o.timeout)
        .f("histogram_max_s", o.histogram_max)
        .opt_u("cpu", o.cpu.map(|c| c as u64))
        .u("interval_ms", o.interval_ms);
    let mut pace = Obj::new();
    match o.rate {
        Some(r) => {
            pace.f("target_tps", r)
                .f("per_flow_interval_us", 1e6 * o.flows as f64 / r)
                .f("max_send_lag_us", flows.iter().map(|f| f.max_lag_ns).max().unwrap_or(0) as f64 / 1e3)
                .u("late_sends", sum(&|f| f.late_sends));
        }
        None => {
            pace.null("target_tps").null("per_flow_interval_us").null("max_send_lag_us").u("late_sends", 0);
        }
    }
    let mut svc = Obj::new();
    svc.opt_f("p50_us", us(service.percentile(50.0)))
        .opt_f("p99_us", us(service.percentile(99.0)))
        .opt_f("max_us", if service.n > 0 { Some(service.max as f64 / 1e3) } else { None });
    let mut hist = Obj::new();
    hist.s("unit", "ns")
        .u("sub_buckets_per_octave", crate::histogram::SUB)
        .u("highest_trackable_ns", highest_ns)
        .u("overflow", rtt.overflow)
        .set(
            "buckets",
            Value::Arr(
                rtt.buckets()
                    .into_iter()
                    .map(|(lo, hi, n)| Value::Arr(vec![Value::U64(lo), Value::U64(hi), Value::U64(n)]))
                    .collect(),
            ),
        );
    let per_flow = Value::Arr(
        flows
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let mut p = Obj::new();
                p.u("flow", i as u64)
                    .u("transactions", f.transactions)
                    .u("lost", f.lost)
                    .u("unsent", f.unsent)
                    .opt_f("rtt_p50_us", us(f.rtt.percentile(50.0)))
                    .opt_f("rtt_p99_us", us(f.rtt.percentile(99.0)));
                p.into_value()
            })
            .collect(),
    );
    let mut errs = Obj::new();
    for (k, n) in &errors {
        errs.u(k, *n);
    }
    let mut clock = Obj::new();
    clock
        .s("clock", "CLOCK_MONOTONIC")
        .u("read_pair_min_ns", clk.0)
        .u("read_pair_p50_ns", clk.1)
        .u("read_pair_p99_ns", clk.2)
        .u("samples", CLOCK_SAMPLES as u64)
        .u("reads_per_transaction", 2);
    let lost = sum(&|f| f.lost);
    let mut out = json::envelope("rr", opts);
    out.s("remote", &dest.to_string())
        .s("proto", o.proto.name())
        .s("stop_reason", stop_reason)
        .s("clock", "CLOCK_MONOTONIC")
        .s("rtt_from", if o.rate.is_some() { "scheduled_send" } else { "send" })
        .u("start_unix_ns", start_wall)
        .u("start_mono_ns", start)
        .f("window_s", window_s)
        .f("elapsed_s", (stop.saturating_sub(start)) as f64 / 1e9)
        .u("transactions", transactions)
        .u("lost", lost)
        .opt_f(
            "loss_ratio",
            if transactions + lost > 0 { Some(lost as f64 / (transactions + lost) as f64) } else { None },
        )
        .u("unsent", sum(&|f| f.unsent))
        .f("transactions_per_s", if window_s > 0.0 { transactions as f64 / window_s } else { 0.0 })
        .opt_f("rtt_mean_us", rtt.mean().map(|m| m / 1e3))
        .opt_f("rtt_min_us", if rtt.n > 0 { Some(rtt.min as f64 / 1e3) } else { None })
        .opt_f("rtt_p50_us", us(rtt.percentile(50.0)))
        .opt_f("rtt_p90_us", us(rtt.percentile(90.0)))
        .opt_f("rtt_p99_us", us(rtt.percentile(99.0)))
        .opt_f("rtt_p99_9_us", us(rtt.percentile(99.9)))
        .opt_f("rtt_max_us", if rtt.n > 0 { Some(rtt.max as f64 / 1e3) } else { None })
        .obj("rtt_histogram", hist)
        .obj("service_rtt", svc)
        .obj("pacing", pace)
        .obj("timing_overhead", clock)
        .u("transactions_total", sum(&|f| f.transactions_total))
        .u("requests_sent", sum(&|f| f.requests_sent))
        .u("responses_received", sum(&|f| f.responses_received))
        .u("late_responses", sum(&|f| f.late_responses))
        .u("bad_responses", sum(&|f| f.bad_responses))
        .u("connects", sum(&|f| f.connects))
        .u("connect_failures", sum(&|f| f.connect_failures))
        .obj("errors", errs)
        .set("per_flow", per_flow);
    out.into_value()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(rate: f64, flows: usize, i: usize) -> Plan {
        Plan {
            start: 1_000_000_000,
            warm_end: 1_500_000_000,
            end: 2_500_000_000,
            interval: Some(1e9 * flows as f64 / rate),
            phase: 1e9 * i as f64 / rate,
            timeout_ns: 1_000_000_000,
        }
    }

    #[test]
    fn flows_interleave_on_one_schedule() {
        // 1000 tps over 2 flows: flow 0 at 0, 2, 4 ms; flow 1 at 1, 3, 5 ms.
        let a = plan(1000.0, 2, 0);
        let b = plan(1000.0, 2, 1);
        assert_eq!((a.due(0), a.due(1), a.due(2)), (1_000_000_000, 1_002_000_000, 1_004_000_000));
        assert_eq!((b.due(0), b.due(1)), (1_001_000_000, 1_003_000_000));
    }

    #[test]
    fn unsent_counts_only_the_window() {
        // 1000 tps, one flow: due at 1.000, 1.001, ... s; window 1.5 .. 2.5 s holds 1000.
        let p = plan(1000.0, 1, 0);
        assert_eq!(p.unsent_from(0), 1000);
        assert_eq!(p.unsent_from(500), 1000); // first in the window
        assert_eq!(p.unsent_from(1200), 300); // 1200..1499
        assert_eq!(p.unsent_from(1500), 0);
    }

    #[test]
    fn a_clock_read_pair_is_timed() {
        let (min, p50, p99) = clock_overhead();
        assert!(min <= p50 && p50 <= p99 && p50 < 10_000, "{} {} {}", min, p50, p99);
    }
}
