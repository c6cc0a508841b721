//! Options of `offlab-engine rr` (the client) and `offlab-engine rr-server`.

use std::net::IpAddr;

use crate::argv::{
    no_value, parse_addr, parse_int, parse_interval, parse_seconds, unknown, ArgError, Args, Parsed, MAX_PAYLOAD_V4,
    MAX_PAYLOAD_V6,
};
use crate::rr_wire::HEADER_LEN;

pub const DEFAULT_RR_PORT: u16 = 5301;
pub const DEFAULT_RR_SIZE: usize = 64;
/// Largest TCP request or response: bounds the buffers both sides allocate.
pub const MAX_TCP_MESSAGE: usize = 1 << 20;
pub const MAX_FLOWS: u64 = 256;
/// One transaction per microsecond per flow is the finest schedule the engine
/// keeps: a clock read pair costs tens of ns, a round trip through any
/// socket several microseconds, so a tighter schedule is only a backlog.
pub const MAX_TPS_PER_FLOW: f64 = 1_000_000.0;
/// The histogram must hold RTTs of at least this long (and at most an hour).
pub const MAX_HISTOGRAM_S: f64 = 3600.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Udp,
    Tcp,
    /// A new TCP connection per transaction: connect, request, response, close.
    TcpCrr,
}

impl Proto {
    pub fn name(&self) -> &'static str {
        match self {
            Proto::Udp => "udp",
            Proto::Tcp => "tcp",
            Proto::TcpCrr => "tcp-crr",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RrOpts {
    pub dest: IpAddr,
    pub port: u16,
    pub proto: Proto,
    pub request_size: usize,
    pub response_size: usize,
    pub flows: usize,
    /// Target transactions/s over all flows; None = closed loop (as fast as answered).
    pub rate: Option<f64>,
    pub rate_text: String,
    pub duration: f64,
    pub warmup: f64,
    pub timeout: f64,
    /// Highest RTT the histogram holds, seconds.
    pub histogram_max: f64,
    pub cpu: Option<usize>,
    /// Per-interval rows every this many ms; 0 = none.
    pub interval_ms: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RrServerOpts {
    pub bind: IpAddr,
    pub port: u16,
    pub ready_file: Option<String>,
    /// Seconds; 0 = until SIGINT/SIGTERM.
    pub duration: f64,
    pub cpu: Option<usize>,
}

pub const RR_HELP: &str = "\
usage: offlab-engine rr --dest ADDR [options]
  --dest ADDR            rr-server address, IPv4 or IPv6 (required)
  --port P               its port (default 5301)
  --proto P              udp | tcp | tcp-crr (a new connection per transaction) (default udp)
  --request-size N       bytes per request, 24..65507 UDP IPv4 / 65527 IPv6 / 1048576 TCP (default 64)
  --response-size N      bytes per response, same range (default 64)
  --flows N              parallel flows, one thread and socket each, 1..256 (default 1)
  --rate R               target transactions/s over all flows: 1000, 10k, 1M, 50ktps;
                         0 = closed loop, each flow as fast as it is answered (default 0).
                         With a rate, a transaction's RTT counts from its scheduled send
                         time (no coordinated omission); at most 1000000/s per flow
  --duration S           seconds measured, after the warm-up (default 10)
  --warmup S             seconds of transactions before measuring, excluded (default 0)
  --timeout S            a transaction not answered within S is lost (default 1)
  --histogram-max S      highest RTT the histogram holds, >= --timeout, <= 3600
                         (default warmup + duration + timeout + 1: every RTT fits)
  --cpu N                pin every flow to CPU N
  --interval MS          per-interval rows (series) every MS ms, aligned on the window's start,
                         0 = none (default 100)
RTTs come from CLOCK_MONOTONIC; one JSON object on stdout (SCHEMA.md).
";

pub const SERVER_HELP: &str = "\
usage: offlab-engine rr-server [options]
  --bind ADDR          local address, IPv4 or IPv6 (default 0.0.0.0)
  --port P             UDP and TCP port, 0 = any free port (default 5301)
  --ready-file PATH    written (atomically) once both sockets are bound: \"ready ADDR PORT\"
  --duration S         stop after S seconds, 0 = at SIGINT/SIGTERM (default 0)
  --cpu N              pin to CPU N
Answers UDP and TCP requests on the same port; prints one JSON object when it stops.
";

fn size(name: &str, v: &str, max: usize) -> Result<usize, ArgError> {
    match v.trim().parse::<i64>() {
        Ok(n) if n >= HEADER_LEN as i64 && n <= max as i64 => Ok(n as usize),
        Ok(n) if n <= 0 => Err(ArgError(format!(
            "--{} {}: a message needs at least {} bytes (the engine's header); use {}..{}",
            name, n, HEADER_LEN, HEADER_LEN, max
        ))),
        _ => Err(ArgError(format!("--{} '{}': must be an integer {}..{} bytes", name, v, HEADER_LEN, max))),
    }
}

/// Transactions per second: `1000`, `10k`, `1.5M`, `50ktps`, `0`.
pub fn parse_tps(v: &str) -> Result<f64, ArgError> {
    let lower = v.trim().to_ascii_lowercase();
    let body = lower.strip_suffix("tps").or_else(|| lower.strip_suffix("/s")).unwrap_or(&lower);
    let (num, mult) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 1e3),
        Some('m') => (&body[..body.len() - 1], 1e6),
        Some('g') => (&body[..body.len() - 1], 1e9),
        _ => (body, 1.0),
    };
    match num.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 && !num.is_empty() => Ok(x * mult),
        _ => Err(ArgError(format!(
            "--rate '{}': must be transactions per second, 0 (closed loop) or more: 1000, 10k, 1M, 50ktps",
            v
        ))),
    }
}

pub fn parse_rr(argv: &[String]) -> Result<Parsed<RrOpts>, ArgError> {
    let mut dest = None;
    let mut port = DEFAULT_RR_PORT;
    let mut proto = Proto::Udp;
    let mut req_text = DEFAULT_RR_SIZE.to_string();
    let mut resp_text = DEFAULT_RR_SIZE.to_string();
    let mut flows = 1u64;
    let mut rate_text = "0".to_string();
    let mut duration = 10.0;
    let mut warmup = 0.0;
    let mut timeout = 1.0;
    let mut hist_max: Option<f64> = None;
    let mut cpu = None;
    let mut interval_ms = crate::series::DEFAULT_INTERVAL_MS;
    let mut a = Args { argv, i: 0 };
    while let Some((name, inline)) = a.next_opt() {
        match name.as_str() {
            "-h" | "--help" => {
                no_value(&name, &inline)?;
                return Ok(Parsed::Help(RR_HELP));
            }
            "--dest" => dest = Some(parse_addr("--dest", &a.value(&name, inline)?)?),
            "--port" => port = parse_int("--port", &a.value(&name, inline)?, 1, 65535)? as u16,
            "--proto" => {
                proto = match a.value(&name, inline)?.as_str() {
                    "udp" => Proto::Udp,
                    "tcp" => Proto::Tcp,
                    "tcp-crr" | "crr" => Proto::TcpCrr,
                    other => return Err(ArgError(format!("--proto '{}': choose udp, tcp or tcp-crr", other))),
                }
            }
            "--request-size" => req_text = a.value(&name, inline)?,
            "--response-size" => resp_text = a.value(&name, inline)?,
            "--flows" => flows = parse_int("--flows", &a.value(&name, inline)?, 1, MAX_FLOWS)?,
            "--rate" => rate_text = a.value(&name, inline)?,
            "--duration" => duration = parse_seconds("--duration", &a.value(&name, inline)?, false)?,
            "--warmup" => warmup = parse_seconds("--warmup", &a.value(&name, inline)?, true)?,
            "--timeout" => timeout = parse_seconds("--timeout", &a.value(&name, inline)?, false)?,
            "--histogram-max" => {
                hist_max = Some(parse_seconds("--histogram-max", &a.value(&name, inline)?, false)?)
            }
            "--cpu" => cpu = Some(parse_int("--cpu", &a.value(&name, inline)?, 0, 4095)? as usize),
            "--interval" => interval_ms = parse_interval(&a.value(&name, inline)?)?,
            other => return Err(ArgError(unknown(other, "rr"))),
        }
    }
    let dest = dest.ok_or_else(|| ArgError("--dest ADDR is required (the rr-server's address)".to_string()))?;
    let max = match (proto, dest) {
        (Proto::Udp, IpAddr::V4(_)) => MAX_PAYLOAD_V4,
        (Proto::Udp, IpAddr::V6(_)) => MAX_PAYLOAD_V6,
        _ => MAX_TCP_MESSAGE,
    };
    let request_size = size("request-size", &req_text, max)?;
    let response_size = size("response-size", &resp_text, max)?;
    if !(0.001..=60.0).contains(&timeout) {
        return Err(ArgError(format!("--timeout {}: must be 1ms..60 s", timeout)));
    }
    let rate = parse_tps(&rate_text)?;
    let rate = if rate > 0.0 {
        let per_flow = rate / flows as f64;
        if per_flow > MAX_TPS_PER_FLOW {
            return Err(ArgError(format!(
                "--rate {}: {} transactions/s per flow is one every {:.3} us, finer than the engine \
                 schedules (at most {} per flow per second); use --flows {} or more, or a lower --rate",
                rate_text,
                per_flow,
                1e6 / per_flow,
                MAX_TPS_PER_FLOW,
                (rate / MAX_TPS_PER_FLOW).ceil()
            )));
        }
        if per_flow * (duration + warmup) < 1.0 {
            return Err(ArgError(format!(
                "--rate {}: under one transaction per flow in {} s; raise --rate or --duration",
                rate_text,
                duration + warmup
            )));
        }
        Some(rate)
    } else {
        None
    };
    let histogram_max = match hist_max {
        None => (warmup + duration + timeout + 1.0).min(MAX_HISTOGRAM_S).max(timeout),
        Some(h) if h < timeout => {
            return Err(ArgError(format!(
                "--histogram-max {} s is below --timeout {} s: RTTs up to the timeout would overflow \
                 the histogram; use --histogram-max {} or more",
                h, timeout, timeout
            )))
        }
        Some(h) if h > MAX_HISTOGRAM_S => {
            return Err(ArgError(format!("--histogram-max {} s: at most {} s", h, MAX_HISTOGRAM_S)))
        }
        Some(h) => h,
    };
    Ok(Parsed::Run(RrOpts {
        dest,
        port,
        proto,
        request_size,
        response_size,
        flows: flows as usize,
        rate,
        rate_text,
        duration,
        warmup,
        timeout,
        histogram_max,
        cpu,
        interval_ms,
    }))
}

pub fn parse_server(argv: &[String]) -> Result<Parsed<RrServerOpts>, ArgError> {
    let mut o = RrServerOpts {
        bind: "0.0.0.0".parse().unwrap(),
        port: DEFAULT_RR_PORT,
        ready_file: None,
        duration: 0.0,
        cpu: None,
    };
    let mut a = Args { argv, i: 0 };
    while let Some((name, inline)) = a.next_opt() {
        match name.as_str() {
            "-h" | "--help" => return Ok(Parsed::Help(SERVER_HELP)),
            "--bind" => o.bind = parse_addr("--bind", &a.value(&name, inline)?)?,
            "--port" => o.port = parse_int("--port", &a.value(&name, inline)?, 0, 65535)? as u16,
            "--ready-file" => {
                let v = a.value(&name, inline)?;
                if v.is_empty() {
                    return Err(ArgError("--ready-file: empty path".to_string()));
                }
                o.ready_file = Some(v)
            }
            "--duration" => o.duration = parse_seconds("--duration", &a.value(&name, inline)?, true)?,
            "--cpu" => o.cpu = Some(parse_int("--cpu", &a.value(&name, inline)?, 0, 4095)? as usize),
            other => return Err(ArgError(unknown(other, "rr-server"))),
        }
    }
    Ok(Parsed::Run(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rr(s: &str) -> Result<RrOpts, ArgError> {
        let argv: Vec<String> = s.split_whitespace().skip(1).map(|x| x.to_string()).collect();
        match parse_rr(&argv)? {
            Parsed::Run(o) => Ok(o),
            other => panic!("{:?}", other),
        }
    }

    #[test]
    fn defaults_are_udp_64_bytes_closed_loop() {
        let o = rr("rr --dest 10.200.1.2").unwrap();
        assert_eq!((o.proto, o.request_size, o.response_size, o.flows), (Proto::Udp, 64, 64, 1));
        assert_eq!((o.rate, o.duration, o.warmup, o.timeout), (None, 10.0, 0.0, 1.0));
        assert_eq!(o.histogram_max, 12.0);
        assert_eq!(o.port, DEFAULT_RR_PORT);
    }

    #[test]
    fn options_are_read() {
        let o = rr("rr --dest fd00:200::2 --proto tcp-crr --request-size 100 --response-size 8000 \
                    --flows 4 --rate 20k --duration 2 --warmup 500ms --timeout 0.2 --cpu 1")
            .unwrap();
        assert_eq!((o.proto, o.request_size, o.response_size, o.flows), (Proto::TcpCrr, 100, 8000, 4));
        assert_eq!((o.rate, o.duration, o.warmup, o.timeout), (Some(20_000.0), 2.0, 0.5, 0.2));
        assert_eq!(o.cpu, Some(1));
    }

    #[test]
    fn zero_negative_and_oversized_sizes_name_the_option() {
        for (args, want) in [
            ("--request-size 0", "--request-size 0"),
            ("--request-size -5", "--request-size -5"),
            ("--response-size 0", "--response-size 0"),
            ("--response-size 23", "24..65507"),
            ("--request-size 65508", "24..65507"),
            ("--request-size abc", "--request-size 'abc'"),
            ("--proto tcp --response-size 2000000", "24..1048576"),
        ] {
            let e = rr(&format!("rr --dest 10.200.1.2 {}", args)).unwrap_err();
            assert!(e.0.contains(want), "{}: {}", args, e.0);
        }
        assert!(rr("rr --dest 10.200.1.2 --proto tcp --request-size 65508").is_ok());
    }

    #[test]
    fn a_rate_finer_than_the_engine_clocks_is_refused() {
        let e = rr("rr --dest 10.200.1.2 --rate 5M").unwrap_err();
        assert!(e.0.contains("--rate 5M") && e.0.contains("--flows 5"), "{}", e.0);
        assert!(rr("rr --dest 10.200.1.2 --rate 5M --flows 5").is_ok());
        assert!(rr("rr --dest 10.200.1.2 --rate -3").unwrap_err().0.contains("--rate"));
        assert!(rr("rr --dest 10.200.1.2 --rate nan").unwrap_err().0.contains("--rate"));
        assert!(rr("rr --dest 10.200.1.2 --rate 0.01 --duration 1").unwrap_err().0.contains("under one"));
        assert_eq!(parse_tps("50ktps").unwrap(), 50_000.0);
        assert_eq!(parse_tps("1.5M").unwrap(), 1_500_000.0);
        assert_eq!(parse_tps("0").unwrap(), 0.0);
    }

    #[test]
    fn a_histogram_too_small_for_the_timeout_is_refused() {
        let e = rr("rr --dest 10.200.1.2 --timeout 2 --histogram-max 1").unwrap_err();
        assert!(e.0.contains("overflow"), "{}", e.0);
        assert!(rr("rr --dest 10.200.1.2 --histogram-max 7200").unwrap_err().0.contains("3600"));
        assert_eq!(rr("rr --dest 10.200.1.2 --histogram-max 5").unwrap().histogram_max, 5.0);
    }

    #[test]
    fn other_bad_arguments() {
        assert!(rr("rr").unwrap_err().0.contains("--dest"));
        assert!(rr("rr --dest 10.200.1.2 --proto sctp").unwrap_err().0.contains("udp, tcp or tcp-crr"));
        assert!(rr("rr --dest 10.200.1.2 --flows 0").unwrap_err().0.contains("1..256"));
        assert!(rr("rr --dest 10.200.1.2 --timeout 0").unwrap_err().0.contains("--timeout"));
        assert!(rr("rr --dest 10.200.1.2 --bogus").unwrap_err().0.contains("--bogus"));
        assert!(rr("rr --dest 10.200.1.2 --interval -5").unwrap_err().0.contains("--interval"));
        assert_eq!(rr("rr --dest 10.200.1.2 --interval 50").unwrap().interval_ms, 50);
    }
}
