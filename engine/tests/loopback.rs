//! End to end over 127.0.0.1: rx and tx as a driver runs them, a few thousand
//! paced datagrams each, so the counts can be checked exactly.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const ENGINE: &str = env!("CARGO_BIN_EXE_offlab-engine");

fn temp_path(name: &str) -> PathBuf {
    let mut p = std::env::temp_dir();
    p.push(format!("offlab-engine-test-{}-{}", std::process::id(), name));
    let _ = std::fs::remove_file(&p);
    p
}

/// The value of the first `"key": value` in a one-line JSON object.
fn field(json: &str, key: &str) -> String {
    let pat = format!("\"{}\": ", key);
    let start = json.find(&pat).unwrap_or_else(|| panic!("no {} in {}", key, json)) + pat.len();
    let rest = &json[start..];
    let end = rest.find(&[',', '}'][..]).unwrap_or(rest.len());
    rest[..end].trim_matches('"').to_string()
}

fn num(json: &str, key: &str) -> f64 {
    field(json, key).parse().unwrap_or_else(|_| panic!("{} is not a number in {}", key, json))
}

/// Starts rx on 127.0.0.1, any port; returns the child and its port once ready.
#[allow(clippy::zombie_processes)] // the caller waits for the child it gets back
fn start_rx(name: &str, extra: &[&str]) -> (Child, u16) {
    let ready = temp_path(name);
    let mut args = vec!["rx", "--bind", "127.0.0.1", "--port", "0", "--duration", "20"];
    args.extend_from_slice(extra);
    let mut child = Command::new(ENGINE)
        .args(&args)
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rx");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(&ready) {
            let _ = std::fs::remove_file(&ready);
            // "ready 127.0.0.1 PORT"
            let port = text.split_whitespace().nth(2).expect("port in ready file");
            return (child, port.parse().expect("port number"));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("rx not ready after 10 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn tx(port: u16, extra: &[&str]) -> Output {
    let port = port.to_string();
    let mut args = vec!["tx", "--dest", "127.0.0.1", "--port", &port];
    args.extend_from_slice(extra);
    Command::new(ENGINE).args(&args).output().expect("run tx")
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "exit {:?}: {}", o.status.code(), String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn paced_run_is_counted_exactly_on_both_sides() {
    let (rx, port) = start_rx("paced", &[]);
    let t = stdout(&tx(port, &["--rate", "20kpps", "--duration", "0.5", "--size", "200"]));
    let r = stdout(&rx.wait_with_output().unwrap());
    // 20 000 datagrams/s for 0.5 s: datagram k is due at k * 50 us, so at most
    // 0..9999 (a sender still late at the end does not overrun the duration).
    let sent = num(&t, "datagrams");
    assert!((9_000.0..=10_000.0).contains(&sent), "{}", t);
    assert_eq!(num(&t, "sent_seq_max"), sent - 1.0, "{}", t);
    assert_eq!(num(&t, "bytes"), sent * 200.0, "{}", t);
    assert_eq!(field(&t, "schema"), "offlab-engine/1", "{}", t);
    assert_eq!(field(&r, "role"), "rx", "{}", r);
    assert_eq!(field(&r, "stop_reason"), "end", "{}", r);
    assert_eq!(num(&r, "tx_datagrams"), sent, "{}", r);
    assert_eq!(num(&r, "unique_datagrams"), sent, "{}", r);
    assert_eq!(num(&r, "lost_vs_tx"), 0.0, "{}", r);
    assert_eq!(num(&r, "lost"), 0.0, "{}", r);
    assert_eq!(num(&r, "duplicates"), 0.0, "{}", r);
    assert_eq!(num(&r, "foreign"), 0.0, "{}", r);
    assert_eq!(field(&r, "run_id"), field(&t, "run_id"), "{}", r);
    let window = num(&r, "window_s");
    assert!(window > 0.3 && window < 5.0, "window {}", window);
}

#[test]
fn gso_segments_arrive_as_gro_buffers_and_are_split() {
    let (rx, port) = start_rx("gro", &["--gro"]);
    let t = stdout(&tx(
        port,
        &["--gso", "--gso-segments", "4", "--size", "1000", "--rate", "8kpps", "--duration", "0.5"],
    ));
    let r = stdout(&rx.wait_with_output().unwrap());
    let sent = num(&t, "datagrams");
    assert!((3_600.0..=4_000.0).contains(&sent), "{}", t);
    assert_eq!(num(&t, "calls") - num(&t, "failed_calls"), sent / 4.0, "{}", t);
    assert_eq!(num(&r, "unique_datagrams"), sent, "{}", r);
    assert_eq!(num(&r, "bytes"), sent * 1000.0, "{}", r);
    // Loopback hands a GSO send to a UDP_GRO socket whole: 4 datagrams per buffer.
    assert!(num(&r, "gro_buffers") > 0.0, "{}", r);
    assert!(num(&r, "datagrams_per_message") > 1.0, "{}", r);
}

#[test]
fn foreign_run_ids_are_kept_apart() {
    let (rx, port) = start_rx("foreign", &["--run-id", "7", "--idle-timeout", "0.3"]);
    let other = stdout(&tx(port, &["--run-id", "8", "--rate", "1kpps", "--duration", "0.1", "--no-end"]));
    let ours = stdout(&tx(port, &["--run-id", "7", "--rate", "1kpps", "--duration", "0.1"]));
    let r = stdout(&rx.wait_with_output().unwrap());
    assert_eq!(num(&r, "foreign"), num(&other, "datagrams"), "{}", r);
    assert_eq!(num(&r, "unique_datagrams"), num(&ours, "datagrams"), "{}", r);
    assert_eq!(num(&r, "run_id"), 7.0, "{}", r);
}

#[test]
fn bad_arguments_exit_2_naming_the_option() {
    for (args, needle) in [
        (vec!["tx", "--dest", "127.0.0.1", "--size", "65508"], "--size"),
        (vec!["tx", "--dest", "127.0.0.1", "--rate", "fast"], "--rate"),
        (vec!["tx", "--dest", "127.0.0.1", "--gso", "--gso-segments", "65"], "--gso-segments"),
        (vec!["rx", "--batch", "0"], "--batch"),
        (vec!["rx", "--frobnicate"], "--frobnicate"),
    ] {
        let o = Command::new(ENGINE).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{:?}: {}", args, err);
        assert!(err.starts_with("offlab-engine: error: ") && err.contains(needle), "{}", err);
        assert_eq!(err.lines().count(), 1, "{}", err);
        assert!(o.stdout.is_empty());
    }
}

#[test]
fn unusable_bind_address_exits_3() {
    // Not configured on this host: bind fails before any traffic.
    let o = Command::new(ENGINE).args(["rx", "--bind", "10.200.255.254"]).output().unwrap();
    assert_eq!(o.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&o.stderr).contains("EADDRNOTAVAIL"));
}
