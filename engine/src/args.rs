//! Command-line parsing, by hand: `offlab-engine rx|tx [--opt VALUE | --opt=VALUE | --flag]...`.

use std::net::IpAddr;

use crate::argv::{
    err, no_value, parse_addr, parse_bytes, parse_int, parse_interval, parse_seconds, unknown, ArgError, Args,
    Parsed, MAX_PAYLOAD_V4, MAX_PAYLOAD_V6,
};
use crate::header::HEADER_LEN;
use crate::series::DEFAULT_INTERVAL_MS;

pub const DEFAULT_PORT: u16 = 5300;
pub const DEFAULT_SIZE: usize = 1472;
pub const DEFAULT_RCVBUF: u64 = 4 << 20;
pub const MAX_BATCH: u64 = 1024;
/// UDP_MAX_SEGMENTS of the kernels this runs on (raised to 128 only in 6.x).
pub const MAX_GSO_SEGMENTS: u64 = 64;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    Unlimited,
    /// Datagrams per second.
    Pps(f64),
    /// UDP payload bits per second (like iperf3 -b).
    Bps(f64),
}

impl Rate {
    /// Target datagrams per second for a payload of `size` bytes.
    pub fn pps(&self, size: usize) -> Option<f64> {
        match *self {
            Rate::Unlimited => None,
            Rate::Pps(p) => Some(p),
            Rate::Bps(b) => Some(b / (8.0 * size as f64)),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RxOpts {
    pub bind: IpAddr,
    pub port: u16,
    pub gro: bool,
    pub batch: usize,
    /// 0: keep the kernel's default.
    pub rcvbuf: u64,
    /// Seconds; 0 = no limit.
    pub duration: f64,
    /// Seconds without a datagram, after the first one; 0 = never.
    pub idle_timeout: f64,
    pub ready_file: Option<String>,
    pub run_id: Option<u32>,
    pub cpu: Option<usize>,
    pub ignore_end: bool,
    /// A port of its own for the sender's END markers (the data socket's full buffer drops them).
    pub end_port: Option<u16>,
    /// Per-interval rows every this many ms; 0 = none.
    pub interval_ms: u64,
}

/// How tx hands datagrams to the kernel (`--send`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendPath {
    /// One send() per message.
    Send,
    /// sendmmsg() of up to --batch messages.
    Sendmmsg,
    /// send(MSG_ZEROCOPY): the kernel pins the buffer and reports on the error queue when it is done.
    Zerocopy,
    /// io_uring IORING_OP_SEND: up to --batch linked sends per io_uring_enter().
    IoUring,
    /// io_uring IORING_OP_SEND_ZC: as IoUring; a buffer is reused only after its notification CQE.
    IoUringZc,
}

impl SendPath {
    pub fn name(self) -> &'static str {
        match self {
            SendPath::Send => "send",
            SendPath::Sendmmsg => "sendmmsg",
            SendPath::Zerocopy => "zerocopy",
            SendPath::IoUring => "io_uring",
            SendPath::IoUringZc => "io_uring-zc",
        }
    }

    /// Whether --batch N > 1 applies: messages per sendmmsg() call, SQEs per io_uring_enter().
    pub fn batches(self) -> bool {
        matches!(self, SendPath::Sendmmsg | SendPath::IoUring | SendPath::IoUringZc)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TxOpts {
    pub dest: IpAddr,
    pub port: u16,
    pub size: usize,
    pub gso: bool,
    /// Segments per send call; 1 without --gso.
    pub gso_segments: usize,
    pub batch: usize,
    pub send: SendPath,
    pub rate: Rate,
    pub rate_text: String,
    pub duration: f64,
    pub cpu: Option<usize>,
    /// 0: keep the kernel's default.
    pub sndbuf: u64,
    pub run_id: Option<u32>,
    pub no_end: bool,
    /// The receiver's --end-port: each END marker goes there too.
    pub end_port: Option<u16>,
    /// Per-interval rows every this many ms; 0 = none.
    pub interval_ms: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Rx(RxOpts),
    Tx(TxOpts),
    Rr(crate::rr_args::RrOpts),
    RrServer(crate::rr_args::RrServerOpts),
    Help(&'static str),
    Version,
}

pub const USAGE: &str = "\
usage: offlab-engine rx [options]    receive, print one JSON object on stdout
       offlab-engine tx --dest ADDR [options]
       offlab-engine rr --dest ADDR [options]    request/response round trips (UDP, TCP, TCP_CRR)
       offlab-engine rr-server [options]         answers rr (UDP and TCP on one port)
       offlab-engine --version | --help | rx --help | tx --help | rr --help | rr-server --help
";

pub const RX_HELP: &str = "\
usage: offlab-engine rx [options]
  --bind ADDR          local address, IPv4 or IPv6 (default 0.0.0.0)
  --port P             UDP port, 0 = any free port (default 5300)
  --gro                enable UDP_GRO and split coalesced buffers by gso_size
  --batch N            datagrams per recvmmsg call, 1..1024 (default 1: recvmsg)
  --rcvbuf BYTES       SO_RCVBUFFORCE (SO_RCVBUF if not permitted); K/M/G = KiB/MiB/GiB;
                       0 = kernel default (default 4M)
  --duration S         stop after S seconds, 0 = no limit (default 0)
  --idle-timeout S     stop S seconds after the last datagram, 0 = never (default 2)
  --ready-file PATH    written (atomically) once the socket is bound: \"ready ADDR PORT\"
  --run-id ID          accept only this run id (default: the first one seen)
  --cpu N              pin to CPU N
  --ignore-end         keep running after the sender's END marker
  --end-port P         also take END markers on UDP port P, a socket the data cannot fill
                       (read once the data port has been quiet for 20 ms)
  --interval MS        per-interval rows (series) every MS ms from the first datagram, 0 = none
                       (default 100)
A line \"offlab-engine: ready ADDR PORT\" is also printed on stderr once bound.
Stops on --duration, --idle-timeout, the sender's END marker, SIGINT or SIGTERM.
";

pub const TX_HELP: &str = "\
usage: offlab-engine tx --dest ADDR [options]
  --dest ADDR          destination, IPv4 or IPv6 (required)
  --port P             destination UDP port (default 5300)
  --size N             UDP payload bytes per datagram, 24..65507 (IPv4) / 65527 (IPv6)
                       (default 1472)
  --gso                UDP_SEGMENT: one send carries --gso-segments datagrams of --size
  --gso-segments K     1..64, size*K <= 65507 (IPv4) / 65527 (IPv6)
                       (default: as many as fit, at most 64)
  --batch N            messages per sendmmsg call or io_uring_enter, 1..1024 (default 1: send)
  --send PATH          send | sendmmsg | zerocopy (send with MSG_ZEROCOPY; completions read
                       from the error queue, copies the kernel made reported) | io_uring
                       (IORING_OP_SEND, --batch linked SQEs per io_uring_enter) | io_uring-zc
                       (IORING_OP_SEND_ZC; a buffer is reused after its notification CQE,
                       copies reported); default: send, or sendmmsg with --batch > 1
  --rate R             0 = unlimited (default); 500pps, 100kpps, 1Mpps;
                       bit/s of UDP payload: 1000000, 200k, 200M, 200Mbit, 1G, 1Gbit
  --duration S         seconds to send, > 0 (default 10)
  --cpu N              pin to CPU N
  --sndbuf BYTES       SO_SNDBUFFORCE (SO_SNDBUF if not permitted); 0 = kernel default (default 0)
  --run-id ID          u32 run id carried in every datagram (default random)
  --no-end             do not send END markers after the run
  --end-port P         send each END marker to port P too (the receiver's --end-port)
  --interval MS        per-interval rows (series) every MS ms from the start, 0 = none (default 100)
";

pub fn parse(argv: &[String]) -> Result<Command, ArgError> {
    let first = match argv.first() {
        Some(f) => f.as_str(),
        None => return err(format!("missing command: rx or tx\n{}", USAGE.trim_end())),
    };
    match first {
        "rx" => parse_rx(&argv[1..]),
        "tx" => parse_tx(&argv[1..]),
        "rr" => Ok(match crate::rr_args::parse_rr(&argv[1..])? {
            Parsed::Run(o) => Command::Rr(o),
            Parsed::Help(h) => Command::Help(h),
        }),
        "rr-server" => Ok(match crate::rr_args::parse_server(&argv[1..])? {
            Parsed::Run(o) => Command::RrServer(o),
            Parsed::Help(h) => Command::Help(h),
        }),
        "-h" | "--help" | "help" => Ok(Command::Help(USAGE)),
        "-V" | "--version" => Ok(Command::Version),
        other => err(format!("unknown command '{}': expected rx or tx (or rr, rr-server)", other)),
    }
}

fn parse_rx(argv: &[String]) -> Result<Command, ArgError> {
    let mut o = RxOpts {
        bind: "0.0.0.0".parse().unwrap(),
        port: DEFAULT_PORT,
        gro: false,
        batch: 1,
        rcvbuf: DEFAULT_RCVBUF,
        duration: 0.0,
        idle_timeout: 2.0,
        ready_file: None,
        run_id: None,
        cpu: None,
        ignore_end: false,
        end_port: None,
        interval_ms: DEFAULT_INTERVAL_MS,
    };
    let mut a = Args { argv, i: 0 };
    while let Some((name, inline)) = a.next_opt() {
        match name.as_str() {
            "-h" | "--help" => return Ok(Command::Help(RX_HELP)),
            "--bind" => o.bind = parse_addr("--bind", &a.value(&name, inline)?)?,
            "--port" => o.port = parse_int("--port", &a.value(&name, inline)?, 0, 65535)? as u16,
            "--gro" => {
                no_value(&name, &inline)?;
                o.gro = true
            }
            "--batch" => o.batch = parse_int("--batch", &a.value(&name, inline)?, 1, MAX_BATCH)? as usize,
            "--rcvbuf" => o.rcvbuf = parse_bytes("--rcvbuf", &a.value(&name, inline)?)?,
            "--duration" => o.duration = parse_seconds("--duration", &a.value(&name, inline)?, true)?,
            "--idle-timeout" => {
                o.idle_timeout = parse_seconds("--idle-timeout", &a.value(&name, inline)?, true)?
            }
            "--ready-file" => {
                let v = a.value(&name, inline)?;
                if v.is_empty() {
                    return err("--ready-file: empty path".to_string());
                }
                o.ready_file = Some(v)
            }
            "--run-id" => o.run_id = Some(parse_run_id(&a.value(&name, inline)?)?),
            "--cpu" => o.cpu = Some(parse_int("--cpu", &a.value(&name, inline)?, 0, 4095)? as usize),
            "--ignore-end" => {
                no_value(&name, &inline)?;
                o.ignore_end = true
            }
            "--end-port" => o.end_port = Some(parse_int("--end-port", &a.value(&name, inline)?, 1, 65535)? as u16),
            "--interval" => o.interval_ms = parse_interval(&a.value(&name, inline)?)?,
            other => return err(unknown(other, "rx")),
        }
    }
    Ok(Command::Rx(o))
}

fn parse_tx(argv: &[String]) -> Result<Command, ArgError> {
    let mut dest: Option<IpAddr> = None;
    let mut port = DEFAULT_PORT;
    let mut size = DEFAULT_SIZE as u64;
    let mut gso = false;
    let mut segs: Option<u64> = None;
    let mut batch = 1u64;
    let mut send: Option<SendPath> = None;
    let mut rate = Rate::Unlimited;
    let mut rate_text = "0".to_string();
    let mut duration = 10.0;
    let mut cpu = None;
    let mut sndbuf = 0u64;
    let mut run_id = None;
    let mut no_end = false;
    let mut end_port = None;
    let mut interval_ms = DEFAULT_INTERVAL_MS;
    let mut a = Args { argv, i: 0 };
    while let Some((name, inline)) = a.next_opt() {
        match name.as_str() {
            "-h" | "--help" => return Ok(Command::Help(TX_HELP)),
            "--dest" => dest = Some(parse_addr("--dest", &a.value(&name, inline)?)?),
            "--port" => port = parse_int("--port", &a.value(&name, inline)?, 1, 65535)? as u16,
            "--size" => size = parse_int("--size", &a.value(&name, inline)?, 0, u32::MAX as u64)?,
            "--gso" => {
                no_value(&name, &inline)?;
                gso = true
            }
            "--gso-segments" => {
                segs = Some(parse_int("--gso-segments", &a.value(&name, inline)?, 1, MAX_GSO_SEGMENTS)?)
            }
            "--batch" => batch = parse_int("--batch", &a.value(&name, inline)?, 1, MAX_BATCH)?,
            "--send" => {
                let v = a.value(&name, inline)?;
                send = Some(match v.as_str() {
                    "send" => SendPath::Send,
                    "sendmmsg" => SendPath::Sendmmsg,
                    "zerocopy" => SendPath::Zerocopy,
                    "io_uring" => SendPath::IoUring,
                    "io_uring-zc" => SendPath::IoUringZc,
                    _ => {
                        return err(format!(
                            "--send '{}': choose send, sendmmsg, zerocopy, io_uring or io_uring-zc",
                            v
                        ))
                    }
                })
            }
            "--rate" => {
                rate_text = a.value(&name, inline)?;
                rate = parse_rate(&rate_text)?;
            }
            "--duration" => duration = parse_seconds("--duration", &a.value(&name, inline)?, false)?,
            "--cpu" => cpu = Some(parse_int("--cpu", &a.value(&name, inline)?, 0, 4095)? as usize),
            "--sndbuf" => sndbuf = parse_bytes("--sndbuf", &a.value(&name, inline)?)?,
            "--run-id" => run_id = Some(parse_run_id(&a.value(&name, inline)?)?),
            "--no-end" => {
                no_value(&name, &inline)?;
                no_end = true
            }
            "--end-port" => end_port = Some(parse_int("--end-port", &a.value(&name, inline)?, 1, 65535)? as u16),
            "--interval" => interval_ms = parse_interval(&a.value(&name, inline)?)?,
            other => return err(unknown(other, "tx")),
        }
    }
    let dest = match dest {
        Some(d) => d,
        None => return err("--dest ADDR is required (IPv4 or IPv6 address)".to_string()),
    };
    let (max_payload, family) = match dest {
        IpAddr::V4(_) => (MAX_PAYLOAD_V4, "IPv4"),
        IpAddr::V6(_) => (MAX_PAYLOAD_V6, "IPv6"),
    };
    if size < HEADER_LEN as u64 || size > max_payload as u64 {
        return err(format!(
            "--size {}: must be {}..{} for {} (the engine's header takes {} bytes)",
            size, HEADER_LEN, max_payload, family, HEADER_LEN
        ));
    }
    let size = size as usize;
    if segs.is_some() && !gso {
        return err("--gso-segments needs --gso".to_string());
    }
    let gso_segments = if gso {
        let fit = (max_payload / size) as u64;
        match segs {
            None => fit.clamp(1, MAX_GSO_SEGMENTS) as usize,
            Some(k) => {
                if k * size as u64 > max_payload as u64 {
                    return err(format!(
                        "--gso-segments {} x --size {} = {} bytes: one UDP_SEGMENT send carries \
                         at most {} bytes of payload over {} (use --gso-segments 1..{})",
                        k,
                        size,
                        k * size as u64,
                        max_payload,
                        family,
                        fit.min(MAX_GSO_SEGMENTS)
                    ));
                }
                k as usize
            }
        }
    } else {
        1
    };
    let send = send.unwrap_or(if batch > 1 { SendPath::Sendmmsg } else { SendPath::Send });
    if !send.batches() && batch > 1 {
        return err(format!(
            "--send {} sends one message a call: --batch {} needs --send sendmmsg, io_uring or io_uring-zc",
            send.name(),
            batch
        ));
    }
    Ok(Command::Tx(TxOpts {
        dest,
        port,
        size,
        gso,
        gso_segments,
        batch: batch as usize,
        send,
        rate,
        rate_text,
        duration,
        cpu,
        sndbuf,
        run_id,
        no_end,
        end_port,
        interval_ms,
    }))
}

fn parse_run_id(v: &str) -> Result<u32, ArgError> {
    let parsed = if let Some(hex) = v.strip_prefix("0x") {
        u32::from_str_radix(hex, 16).ok()
    } else {
        v.parse::<u32>().ok()
    };
    match parsed {
        Some(n) => Ok(n),
        None => err(format!("--run-id '{}': must be an integer 0..4294967295 (or 0x hex)", v)),
    }
}

/// Rates: `0` (unlimited), `500pps`, `100kpps`, `1Mpps`, or UDP payload bit/s:
/// `1000000`, `200k`, `200M`, `200Mbit`, `1G`, `1Gbit` (decimal units).
pub fn parse_rate(v: &str) -> Result<Rate, ArgError> {
    let bad = || {
        err(format!(
            "--rate '{}': must be 0 (unlimited), packets per second (500pps, 100kpps, 1Mpps) \
             or bit/s of UDP payload (1000000, 200k, 200M, 200Mbit, 1G, 1Gbit)",
            v
        ))
    };
    let lower = v.trim().to_ascii_lowercase();
    let (body, pps) = match lower.strip_suffix("pps") {
        Some(b) => (b, true),
        None => (
            lower
                .strip_suffix("bit/s")
                .or_else(|| lower.strip_suffix("bps"))
                .or_else(|| lower.strip_suffix("bit"))
                .unwrap_or(&lower),
            false,
        ),
    };
    let (num, mult) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 1e3),
        Some('m') => (&body[..body.len() - 1], 1e6),
        Some('g') => (&body[..body.len() - 1], 1e9),
        _ => (body, 1.0),
    };
    let x = match num.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 && !num.is_empty() => x * mult,
        _ => return bad(),
    };
    if x == 0.0 {
        return Ok(Rate::Unlimited);
    }
    if pps {
        if x > 1e9 {
            return bad();
        }
        Ok(Rate::Pps(x))
    } else {
        if x > 1e13 {
            return bad();
        }
        Ok(Rate::Bps(x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(|x| x.to_string()).collect()
    }

    fn tx(s: &str) -> Result<TxOpts, ArgError> {
        match parse(&argv(s))? {
            Command::Tx(o) => Ok(o),
            other => panic!("{:?}", other),
        }
    }

    fn rx(s: &str) -> Result<RxOpts, ArgError> {
        match parse(&argv(s))? {
            Command::Rx(o) => Ok(o),
            other => panic!("{:?}", other),
        }
    }

    #[test]
    fn rates_in_pps_and_bits() {
        assert_eq!(parse_rate("100kpps"), Ok(Rate::Pps(100_000.0)));
        assert_eq!(parse_rate("1Mpps"), Ok(Rate::Pps(1_000_000.0)));
        assert_eq!(parse_rate("500pps"), Ok(Rate::Pps(500.0)));
        assert_eq!(parse_rate("1.5Mpps"), Ok(Rate::Pps(1_500_000.0)));
        assert_eq!(parse_rate("1G"), Ok(Rate::Bps(1e9)));
        assert_eq!(parse_rate("1Gbit"), Ok(Rate::Bps(1e9)));
        assert_eq!(parse_rate("200M"), Ok(Rate::Bps(200e6)));
        assert_eq!(parse_rate("200Mbit"), Ok(Rate::Bps(200e6)));
        assert_eq!(parse_rate("10k"), Ok(Rate::Bps(10e3)));
        assert_eq!(parse_rate("1000000"), Ok(Rate::Bps(1e6)));
        assert_eq!(parse_rate("0"), Ok(Rate::Unlimited));
    }

    #[test]
    fn bad_rates_name_the_option() {
        for bad in ["", "abc", "-5", "5x", "pps", "M", "1e400", "nan"] {
            let e = parse_rate(bad).unwrap_err();
            assert!(e.0.starts_with("--rate"), "{}: {}", bad, e.0);
        }
    }

    #[test]
    fn bit_rate_becomes_pps_by_payload_size() {
        // 1 Gbit/s of 1250-byte payloads = 100000 datagrams/s.
        assert_eq!(Rate::Bps(1e9).pps(1250), Some(100_000.0));
        assert_eq!(Rate::Pps(7.0).pps(1250), Some(7.0));
        assert_eq!(Rate::Unlimited.pps(1250), None);
    }

    #[test]
    fn seconds_and_bytes() {
        assert_eq!(parse_seconds("--d", "2", false), Ok(2.0));
        assert_eq!(parse_seconds("--d", "2.5s", false), Ok(2.5));
        assert_eq!(parse_seconds("--d", "500ms", false), Ok(0.5));
        assert!(parse_seconds("--d", "0", false).is_err());
        assert_eq!(parse_seconds("--d", "0", true), Ok(0.0));
        assert!(parse_seconds("--d", "-1", true).is_err());
        assert_eq!(parse_bytes("--b", "4M"), Ok(4 << 20));
        assert_eq!(parse_bytes("--b", "4MiB"), Ok(4 << 20));
        assert_eq!(parse_bytes("--b", "256k"), Ok(256 << 10));
        assert_eq!(parse_bytes("--b", "1000"), Ok(1000));
        assert!(parse_bytes("--b", "4T").is_err());
        assert!(parse_bytes("--b", "3G").is_err());
    }

    #[test]
    fn rx_defaults_and_options() {
        let o = rx("rx").unwrap();
        assert_eq!(o.port, DEFAULT_PORT);
        assert_eq!(o.batch, 1);
        assert_eq!(o.rcvbuf, DEFAULT_RCVBUF);
        assert_eq!(o.idle_timeout, 2.0);
        assert!(!o.gro);
        let o = rx("rx --bind fd00:200::2 --port=9000 --gro --batch 64 --rcvbuf 8M \
                    --duration 5 --idle-timeout 500ms --ready-file /tmp/r --run-id 0x10 --cpu 1")
            .unwrap();
        assert_eq!(o.bind, "fd00:200::2".parse::<IpAddr>().unwrap());
        assert_eq!((o.port, o.gro, o.batch, o.rcvbuf), (9000, true, 64, 8 << 20));
        assert_eq!((o.duration, o.idle_timeout), (5.0, 0.5));
        assert_eq!(o.ready_file.as_deref(), Some("/tmp/r"));
        assert_eq!((o.run_id, o.cpu), (Some(16), Some(1)));
    }

    #[test]
    fn tx_send_path_follows_the_batch_unless_named() {
        assert_eq!(tx("tx --dest 10.200.1.2").unwrap().send, SendPath::Send);
        assert_eq!(tx("tx --dest 10.200.1.2 --batch 8").unwrap().send, SendPath::Sendmmsg);
        assert_eq!(tx("tx --dest 10.200.1.2 --send sendmmsg").unwrap().send, SendPath::Sendmmsg);
        assert_eq!(tx("tx --dest 10.200.1.2 --send zerocopy --gso").unwrap().send, SendPath::Zerocopy);
        let e = tx("tx --dest 10.200.1.2 --send zerocopy --batch 8").unwrap_err();
        assert!(e.0.contains("--batch 8 needs --send sendmmsg"), "{}", e.0);
        assert_eq!(tx("tx --dest 10.200.1.2 --send io_uring --batch 8").unwrap().send, SendPath::IoUring);
        assert_eq!(tx("tx --dest 10.200.1.2 --send io_uring-zc --gso").unwrap().send, SendPath::IoUringZc);
        assert!(tx("tx --dest 10.200.1.2 --send uring").unwrap_err().0.starts_with("--send 'uring'"));
    }

    #[test]
    fn tx_gso_segments_default_to_what_fits() {
        let o = tx("tx --dest 10.200.1.2 --gso").unwrap();
        assert_eq!((o.size, o.gso_segments), (1472, 44)); // 44 * 1472 = 64768 <= 65507
        let o = tx("tx --dest 10.200.1.2 --gso --size 1000").unwrap();
        assert_eq!(o.gso_segments, 64); // UDP_MAX_SEGMENTS caps 65
        let o = tx("tx --dest 10.200.1.2 --gso --size 8972").unwrap();
        assert_eq!(o.gso_segments, 7);
        let o = tx("tx --dest fd00:200::2 --gso --size 65527").unwrap();
        assert_eq!(o.gso_segments, 1);
        let o = tx("tx --dest 10.200.1.2").unwrap();
        assert_eq!((o.gso, o.gso_segments, o.rate, o.duration), (false, 1, Rate::Unlimited, 10.0));
    }

    #[test]
    fn tx_rejects_payloads_that_cannot_be_sent() {
        let e = tx("tx --dest 10.200.1.2 --size 65508").unwrap_err();
        assert!(e.0.contains("--size 65508") && e.0.contains("65507"), "{}", e.0);
        assert!(tx("tx --dest fd00:200::2 --size 65527").is_ok());
        assert!(tx("tx --dest fd00:200::2 --size 65528").is_err());
        let e = tx("tx --dest 10.200.1.2 --size 23").unwrap_err();
        assert!(e.0.contains("24"), "{}", e.0);
        let e = tx("tx --dest 10.200.1.2 --gso --gso-segments 45").unwrap_err();
        assert!(e.0.contains("66240") && e.0.contains("1..44"), "{}", e.0);
        let e = tx("tx --dest 10.200.1.2 --gso --size 100 --gso-segments 65").unwrap_err();
        assert!(e.0.contains("--gso-segments") && e.0.contains("1..64"), "{}", e.0);
        assert!(tx("tx --dest 10.200.1.2 --gso-segments 4").is_err());
    }

    #[test]
    fn bad_arguments_name_the_option() {
        assert!(tx("tx").unwrap_err().0.contains("--dest"));
        assert!(tx("tx --dest 10.200.1.300").unwrap_err().0.contains("--dest"));
        assert!(tx("tx --dest 10.200.1.2 --batch 0").unwrap_err().0.contains("1..1024"));
        assert!(tx("tx --dest 10.200.1.2 --port 70000").unwrap_err().0.contains("--port"));
        assert!(tx("tx --dest 10.200.1.2 --bogus").unwrap_err().0.contains("--bogus"));
        assert!(tx("tx --dest 10.200.1.2 --gso=1").unwrap_err().0.contains("takes no value"));
        assert!(rx("rx --batch").unwrap_err().0.contains("needs a value"));
        assert!(parse(&argv("tcp")).unwrap_err().0.contains("rx or tx"));
    }

    #[test]
    fn interval_defaults_to_100_ms_and_0_turns_it_off() {
        assert_eq!(tx("tx --dest 10.200.1.2").unwrap().interval_ms, 100);
        assert_eq!(rx("rx").unwrap().interval_ms, 100);
        assert_eq!(tx("tx --dest 10.200.1.2 --interval 0").unwrap().interval_ms, 0);
        assert_eq!(rx("rx --interval=250ms").unwrap().interval_ms, 250);
        for bad in ["-1", "0.5", "60001", "x"] {
            let e = tx(&format!("tx --dest 10.200.1.2 --interval {}", bad)).unwrap_err();
            assert!(e.0.starts_with("--interval") && e.0.contains("0..60000"), "{}", e.0);
        }
    }

    #[test]
    fn help_and_version() {
        assert_eq!(parse(&argv("--help")), Ok(Command::Help(USAGE)));
        assert_eq!(parse(&argv("tx --help")), Ok(Command::Help(TX_HELP)));
        assert_eq!(parse(&argv("rx -h")), Ok(Command::Help(RX_HELP)));
        assert_eq!(parse(&argv("--version")), Ok(Command::Version));
    }
}
