//! `rr` against `rr-server` over 127.0.0.1: every protocol answers, the
//! figures agree with each other and with the server's counts, a dead peer
//! costs one timeout per transaction, bad input is exit 2 without a panic.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const ENGINE: &str = env!("CARGO_BIN_EXE_offlab-engine");

fn field<'a>(json: &'a str, key: &str) -> &'a str {
    let pat = format!("\"{}\": ", key);
    let start = json.find(&pat).unwrap_or_else(|| panic!("no {} in {}", key, json)) + pat.len();
    let rest = &json[start..];
    let end = rest.find(&[',', '}'][..]).unwrap_or(rest.len());
    rest[..end].trim_matches('"')
}

fn num(json: &str, key: &str) -> f64 {
    field(json, key).parse().unwrap_or_else(|_| panic!("{} is not a number in {}", key, json))
}

struct Server {
    child: Child,
    port: u16,
}

impl Server {
    #[allow(clippy::zombie_processes)] // the Server owns the child; stop() waits for it
    fn start(name: &str) -> Server {
        let mut ready = std::env::temp_dir();
        ready.push(format!("offlab-rr-test-{}-{}", std::process::id(), name));
        let ready: PathBuf = ready;
        let _ = std::fs::remove_file(&ready);
        let mut child = Command::new(ENGINE)
            .args(["rr-server", "--bind", "127.0.0.1", "--port", "0", "--duration", "30", "--ready-file"])
            .arg(&ready)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rr-server");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                let _ = std::fs::remove_file(&ready);
                let port = text.split_whitespace().nth(2).expect("port").parse().expect("port number");
                return Server { child, port };
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("rr-server not ready after 10 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops the server (SIGINT) and returns its report.
    fn stop(self) -> String {
        // SAFETY: kill(2) on the pid of the child this test started and still owns.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let out = self.child.wait_with_output().unwrap();
        stdout(&out)
    }
}

fn rr(port: u16, extra: &[&str]) -> Output {
    let port = port.to_string();
    let mut args = vec!["rr", "--dest", "127.0.0.1", "--port", &port];
    args.extend_from_slice(extra);
    Command::new(ENGINE).args(&args).output().expect("run rr")
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "exit {:?}: {}", o.status.code(), String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn check_consistent(r: &str) {
    let n = num(r, "transactions");
    assert!(n > 100.0, "{}", r);
    let (p50, p90, p99, p999, max) =
        (num(r, "rtt_p50_us"), num(r, "rtt_p90_us"), num(r, "rtt_p99_us"), num(r, "rtt_p99_9_us"), num(r, "rtt_max_us"));
    assert!(num(r, "rtt_min_us") <= p50 && p50 <= p90 && p90 <= p99 && p99 <= p999 && p999 <= max, "{}", r);
    assert!(p50 > 0.0 && max < 2e6, "{}", r);
    assert_eq!(num(r, "lost"), 0.0, "{}", r);
    assert_eq!(num(r, "transactions_per_s"), n / num(r, "window_s"), "{}", r);
    // The histogram's buckets hold every counted transaction.
    let b = r.find("\"buckets\": [").unwrap();
    let buckets = &r[b..r[b..].find("]]").map(|e| b + e + 2).unwrap()];
    let total: f64 = buckets
        .split('[')
        .filter_map(|x| x.trim_end_matches(&[']', ',', ' '][..]).split(", ").nth(2))
        .map(|c| c.parse::<f64>().unwrap())
        .sum();
    assert_eq!(total, n, "{}", buckets);
}

#[test]
fn udp_tcp_and_crr_answer_and_agree_with_the_server() {
    let srv = Server::start("protos");
    let mut sent = 0.0;
    let mut conns = 0.0;
    for proto in ["udp", "tcp", "tcp-crr"] {
        let r = stdout(&rr(srv.port, &["--proto", proto, "--duration", "0.5", "--warmup", "0.1", "--request-size", "100",
                                       "--response-size", "300"]));
        assert_eq!(field(&r, "proto"), proto);
        assert_eq!(field(&r, "rtt_from"), "send");
        check_consistent(&r);
        assert_eq!(num(&r, "requests_sent"), num(&r, "responses_received"), "{}", r);
        assert!(num(&r, "transactions_total") > num(&r, "transactions"), "warm-up excluded: {}", r);
        sent += num(&r, "requests_sent");
        conns += num(&r, "connects");
        if proto == "tcp-crr" {
            assert_eq!(num(&r, "connects"), num(&r, "transactions_total"), "{}", r);
        }
    }
    let s = srv.stop();
    assert_eq!(num(&s, "udp_requests") + num(&s, "tcp_requests"), sent, "{}", s);
    assert_eq!(num(&s, "tcp_connections"), conns, "{}", s);
    assert_eq!(num(&s, "udp_foreign") + num(&s, "tcp_foreign") + num(&s, "tcp_errors"), 0.0, "{}", s);
}

#[test]
fn parallel_flows_at_a_target_rate_keep_the_schedule() {
    let srv = Server::start("rate");
    let r = stdout(&rr(srv.port, &["--proto", "tcp", "--flows", "4", "--rate", "4000", "--duration", "1", "--warmup", "0.2"]));
    srv.stop();
    assert_eq!(field(&r, "rtt_from"), "scheduled_send");
    check_consistent(&r);
    // 4000/s for 1 s, every flow its share; a late sender would show as unsent.
    let n = num(&r, "transactions") + num(&r, "unsent");
    assert!((3990.0..=4010.0).contains(&n), "{}", r);
    assert_eq!(num(&r, "per_flow_interval_us"), 1000.0, "{}", r);
    for f in 0..4 {
        assert!(r.contains(&format!("{{\"flow\": {}, \"transactions\": ", f)), "{}", r);
    }
}

#[test]
fn a_dead_peer_costs_one_timeout_per_transaction_and_counts_lost() {
    // Nothing listens on the port of a server that was stopped.
    let srv = Server::start("dead");
    let port = srv.port;
    srv.stop();
    for proto in ["udp", "tcp", "tcp-crr"] {
        let t0 = Instant::now();
        let out = rr(port, &["--proto", proto, "--duration", "1", "--timeout", "0.25"]);
        let r = stdout(&out);
        assert!(t0.elapsed() < Duration::from_secs(4), "{} took {:?}", proto, t0.elapsed());
        assert_eq!(num(&r, "transactions"), 0.0, "{}", r);
        assert!((3.0..=5.0).contains(&num(&r, "lost")), "{}", r);
        assert_eq!(field(&r, "rtt_p50_us"), "null", "{}", r);
    }
}

#[test]
fn a_silent_udp_peer_times_out_too() {
    // A bound socket that never answers: no ICMP, only the timeout tells.
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = sock.local_addr().unwrap().port();
    let t0 = Instant::now();
    let r = stdout(&rr(port, &["--duration", "0.6", "--timeout", "0.2", "--flows", "2"]));
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_eq!(num(&r, "transactions"), 0.0, "{}", r);
    assert!((4.0..=8.0).contains(&num(&r, "lost")), "{}", r);
    assert_eq!(num(&r, "loss_ratio"), 1.0, "{}", r);
}

#[test]
fn bad_input_is_exit_2_with_a_message_and_no_panic() {
    for args in [
        vec!["--request-size", "0"],
        vec!["--response-size", "-64"],
        vec!["--request-size", "65508"],
        vec!["--rate", "20M"],
        vec!["--rate", "-5"],
        vec!["--timeout", "2", "--histogram-max", "1"],
        vec!["--flows", "0"],
        vec!["--proto", "sctp"],
    ] {
        let out = rr(9, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{:?}: {}", args, err);
        assert!(err.starts_with("offlab-engine: error: --"), "{:?}: {}", args, err);
        assert!(!err.contains("panicked"), "{:?}: {}", args, err);
        assert!(out.stdout.is_empty());
    }
}
