//! offlab-agent: the command agent inside an offlab guest (docs/vm.md, "The command channel").
//!
//! It holds the virtio-serial port named `ctl` and answers one line per request:
//!
//! ```text
//! host → guest  Q <id> <b64 command> <b64 stdin | ->  run `sh -c command` in a new session
//!               K <id>                              SIGKILL that command's process group
//!               P <id>                              echo: `R <id> 0` at once
//!               F <id> <op> <op> ...                file operations in this process, no fork:
//!                   r:<b64 path>                      read a whole file
//!                   w:<b64 path>:<b64 data>           write (create, truncate) a file
//!                   e:<b64 path>                      does it exist
//!                   t:<b64 path>:<ms>                 wait until it exists, at most ms (inotify)
//!                   q:                                the qdiscs' counters over rtnetlink, as the JSON
//!                                                     of `tc -s -j qdisc show` (the fields offlab reads)
//! guest → host  O <id> <b64 stdout>   E <id> <b64 stderr>   R <id> <exit code>
//!               A <id> <res> <res> ...  one per op, in order: `0:<b64 data>` or `<errno>:`
//! ```
//!
//! A command, and a wait for a file, runs on a thread of its own, so a slow one holds up nothing;
//! reads and writes (opened non-blocking) are answered on the loop itself. An answer is written
//! whole under one lock, so answers interleave only between lines. A command's
//! stdin, stdout and stderr are memory files, as the shell agent's were tmpfs files: a
//! command that leaves a background child behind is done when its shell exits, and the
//! child never holds the port (which opens exclusively). The port reads end-of-file while
//! no host is connected: the agent then sleeps until the port's SIGIO says a host connected
//! (looking again every 500 ms all the same), so an idle guest costs its host next to nothing.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::FromRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const PORT_NAME: &str = "ctl";
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// A read larger than this is refused (EFBIG): the answer is held in memory twice.
const MAX_READ: u64 = 64 << 20;

struct Agent {
    port: File,
    write: Mutex<()>,
    /// id → process group of a running command; ids killed before their command started.
    running: Mutex<(HashMap<String, i32>, HashSet<String>)>,
}

impl Agent {
    /// One answer, all its lines in one locked run of writes (a virtio-serial write takes at most
    /// 32 KiB, so a long line takes several; nothing else is written in between).
    fn send(&self, text: &[u8]) {
        let _guard = self.write.lock().unwrap_or_else(|e| e.into_inner());
        // A host that left: the write waits for the next one, whose reader drops unknown ids.
        let _ = (&self.port).write_all(text);
    }
}

fn main() {
    // `offlab-agent --qdiscs`: the `q:` answer on stdout, here (for a look or a test outside a guest)
    if std::env::args().nth(1).as_deref() == Some("--qdiscs") {
        match qdisc_json() {
            Ok(j) => println!("{}", String::from_utf8_lossy(&j)),
            Err(e) => {
                eprintln!("offlab-agent: {}", e);
                std::process::exit(3);
            }
        }
        return;
    }
    std::env::set_var("PATH", PATH);
    std::env::set_var("HOME", "/root");
    let _ = fs::create_dir_all("/root");
    let _ = std::env::set_current_dir("/root");
    // Before any thread starts, so that every thread inherits the mask and the signal waits for us.
    let sigio = block_sigio();
    let (port, dev) = open_port();
    let host_signals = signal_host_connects(&port);
    let uptime = fs::read_to_string("/proc/uptime").unwrap_or_default();
    // on the console (init's stdout for us): the boot waits for it; a console that is gone is no reason to stop
    let _ = writeln!(std::io::stdout(), "READY {} {}", uptime.split_whitespace().next().unwrap_or("?"), dev);
    let _ = std::io::stdout().flush();
    let agent = Arc::new(Agent { port, write: Mutex::new(()), running: Mutex::new((HashMap::new(), HashSet::new())) });
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 16);
    let mut chunk = vec![0u8; 1 << 16];
    let mut scanned = 0; // bytes of `buf` known to hold no newline (a long line arrives in many reads)
    loop {
        match (&agent.port).read(&mut chunk) {
            Ok(0) | Err(_) => {
                // No host connected: a line it left half-sent is garbage for the next one.
                buf.clear();
                scanned = 0;
                wait_for_host(&sigio, host_signals);
                continue;
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        let mut start = 0;
        while let Some(nl) = buf[scanned..].iter().position(|&b| b == b'\n') {
            let end = scanned + nl;
            dispatch(&agent, &buf[start..end]);
            start = end + 1;
            scanned = start;
        }
        buf.drain(..start);
        scanned = buf.len();
    }
}

/// SIGIO blocked in this thread (and so in every thread it starts): it stays pending until
/// `wait_for_host` takes it.
fn block_sigio() -> libc::sigset_t {
    // SAFETY: the set is a local initialised by sigemptyset before use; pthread_sigmask reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGIO);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Asks the port for SIGIO to this process: a virtio-serial port raises it when the host side opens
/// or closes, and when data arrives. False if the kernel refused (the agent then polls).
fn signal_host_connects(port: &File) -> bool {
    use std::os::unix::io::AsRawFd;
    let fd = port.as_raw_fd();
    // SAFETY: fcntl on a descriptor this File owns, with integer arguments only.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0
            && libc::fcntl(fd, libc::F_SETOWN, libc::getpid()) == 0
            && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_ASYNC) == 0
    }
}

/// No host on the port: until a SIGIO (a host connected, or one raised since the last read: then
/// the next read tells), at most 500 ms; without SIGIO, 20 ms as before. A connect between the
/// read and this wait is not missed: the blocked signal is pending.
fn wait_for_host(sigio: &libc::sigset_t, host_signals: bool) {
    if !host_signals {
        thread::sleep(Duration::from_millis(20));
        return;
    }
    let limit = libc::timespec { tv_sec: 0, tv_nsec: 500_000_000 };
    // SAFETY: both pointers are to live locals/arguments for the call; a null siginfo is allowed.
    unsafe {
        libc::sigtimedwait(sigio, std::ptr::null_mut(), &limit);
    }
}

/// The port named `ctl` under /sys/class/virtio-ports (its /dev/vportNpM number depends on the
/// other devices), opened read-write; waits for it to appear.
fn open_port() -> (File, String) {
    loop {
        if let Ok(entries) = fs::read_dir("/sys/class/virtio-ports") {
            for e in entries.flatten() {
                let name = fs::read_to_string(e.path().join("name")).unwrap_or_default();
                if name.trim() == PORT_NAME {
                    let dev = format!("/dev/{}", e.file_name().to_string_lossy());
                    if let Ok(f) = OpenOptions::new().read(true).write(true).open(&dev) {
                        return (f, dev);
                    }
                }
            }
        }
        thread::sleep(Duration::from_millis(100));
    }
}

fn valid_id(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= 64 && id.iter().all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
}

fn dispatch(agent: &Arc<Agent>, line: &[u8]) {
    let parts: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    if parts.len() < 2 || !valid_id(parts[1]) {
        return;
    }
    let id = String::from_utf8_lossy(parts[1]).into_owned();
    match parts[0] {
        b"P" => agent.send(format!("R {} 0\n", id).as_bytes()),
        b"K" => kill(agent, &id),
        b"Q" if parts.len() >= 3 => {
            let (cmd, stdin) = match (b64_decode(parts[2]), parts.get(3).copied()) {
                (Some(c), None) | (Some(c), Some(b"-")) => (c, Vec::new()),
                (Some(c), Some(s)) => match b64_decode(s) {
                    Some(d) => (c, d),
                    None => return agent.send(format!("E {} {}\nR {} 2\n", id, b64_encode(b"offlab-agent: bad stdin\n"), id).as_bytes()),
                },
                (None, _) => return agent.send(format!("E {} {}\nR {} 2\n", id, b64_encode(b"offlab-agent: bad command\n"), id).as_bytes()),
            };
            let agent = Arc::clone(agent);
            thread::spawn(move || run_command(&agent, &id, &cmd, &stdin));
        }
        b"F" => {
            let ops: Vec<Vec<u8>> = parts[2..].iter().filter(|p| !p.is_empty()).map(|p| p.to_vec()).collect();
            let answer = move |agent: &Agent| {
                let mut out = format!("A {}", id).into_bytes();
                for op in &ops {
                    out.push(b' ');
                    out.extend_from_slice(&file_op(op));
                }
                out.push(b'\n');
                agent.send(&out);
            };
            // Reads and writes open non-blocking (a FIFO or a tty cannot hold the loop up) and are
            // answered here, a thread's start saved; a wait gets a thread of its own.
            if parts[2..].iter().any(|p| p.starts_with(b"t:")) {
                let agent = Arc::clone(agent);
                thread::spawn(move || answer(&agent));
            } else {
                answer(agent);
            }
        }
        _ => {}
    }
}

fn kill(agent: &Agent, id: &str) {
    let mut running = agent.running.lock().unwrap_or_else(|e| e.into_inner());
    match running.0.get(id) {
        // SAFETY: kill() takes plain integers; a negative pid names the command's own process group.
        Some(&pgid) => unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        },
        None => {
            running.1.insert(id.to_string());
        }
    }
}

/// An anonymous memory file (memfd), holding `data`, positioned at its start.
fn memfile(name: &str, data: &[u8]) -> std::io::Result<File> {
    let cname = CString::new(name).unwrap_or_default();
    // SAFETY: `cname` is a valid NUL-terminated string for the call; flags are plain integers.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nothing else.
    let mut f = unsafe { File::from_raw_fd(fd) };
    f.write_all(data)?;
    f.seek(SeekFrom::Start(0))?;
    Ok(f)
}

fn run_command(agent: &Agent, id: &str, cmd: &[u8], stdin: &[u8]) {
    let answer = match spawn_and_wait(agent, id, cmd, stdin) {
        Ok((rc, out, err)) => {
            let mut a = Vec::with_capacity(out.len() * 4 / 3 + err.len() * 4 / 3 + 64);
            if !out.is_empty() {
                a.extend_from_slice(format!("O {} {}\n", id, b64_encode(&out)).as_bytes());
            }
            if !err.is_empty() {
                a.extend_from_slice(format!("E {} {}\n", id, b64_encode(&err)).as_bytes());
            }
            a.extend_from_slice(format!("R {} {}\n", id, rc).as_bytes());
            a
        }
        Err(e) => {
            let msg = format!("offlab-agent: cannot run the command: {}\n", e);
            format!("E {} {}\nR {} 126\n", id, b64_encode(msg.as_bytes()), id).into_bytes()
        }
    };
    agent.send(&answer);
}

fn spawn_and_wait(agent: &Agent, id: &str, cmd: &[u8], stdin: &[u8]) -> std::io::Result<(i32, Vec<u8>, Vec<u8>)> {
    let input = memfile("in", stdin)?;
    let mut out = memfile("out", b"")?;
    let mut err = memfile("err", b"")?;
    use std::os::unix::ffi::OsStrExt;
    let mut command = Command::new("/bin/sh");
    command
        .arg("-c")
        .arg(std::ffi::OsStr::from_bytes(cmd))
        .stdin(Stdio::from(input))
        .stdout(Stdio::from(out.try_clone()?))
        .stderr(Stdio::from(err.try_clone()?));
    // SAFETY: setsid() and pthread_sigmask() are async-signal-safe; they run in the child between
    // fork and exec, making the command the leader of its own session and process group (for `K`)
    // and giving it an empty signal mask (the agent's threads block SIGIO), on a local set.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    let pgid = child.id() as i32;
    {
        let mut running = agent.running.lock().unwrap_or_else(|e| e.into_inner());
        if running.1.remove(id) {
            // SAFETY: kill() takes plain integers; the group is the command's, started just above.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
        running.0.insert(id.to_string(), pgid);
    }
    let status = child.wait();
    agent.running.lock().unwrap_or_else(|e| e.into_inner()).0.remove(id);
    let status = status?;
    // As sh's `$?` says it: the exit code, or 128 + the signal that ended it.
    let rc = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    let mut o = Vec::new();
    let mut e = Vec::new();
    out.seek(SeekFrom::Start(0))?;
    out.read_to_end(&mut o)?;
    err.seek(SeekFrom::Start(0))?;
    err.read_to_end(&mut e)?;
    Ok((rc, o, e))
}

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

fn answer(result: std::io::Result<Vec<u8>>) -> Vec<u8> {
    match result {
        Ok(data) => {
            let mut r = b"0:".to_vec();
            r.extend_from_slice(b64_encode(&data).as_bytes());
            r
        }
        Err(e) => format!("{}:", errno_of(&e)).into_bytes(),
    }
}

/// One file operation → `0:<b64 data>` or `<errno>:`.
fn file_op(op: &[u8]) -> Vec<u8> {
    let fields: Vec<&[u8]> = op.split(|&b| b == b':').collect();
    if fields[0] == b"q" {
        return answer(qdisc_json());
    }
    let path = match fields.get(1).and_then(|p| b64_decode(p)) {
        Some(p) if !p.is_empty() => p,
        _ => return format!("{}:", libc::EINVAL).into_bytes(),
    };
    use std::os::unix::ffi::OsStrExt;
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(&path));
    let result: std::io::Result<Vec<u8>> = match (fields[0], fields.len()) {
        (b"r", 2) => read_file(path),
        (b"e", 2) => fs::metadata(path).map(|_| Vec::new()),
        (b"w", 3) => match b64_decode(fields[2]) {
            // one write() for what fits, as a sysctl needs
            Some(data) => OpenOptions::new().write(true).create(true).truncate(true)
                .custom_flags(libc::O_NONBLOCK).open(path)
                .and_then(|mut f| f.write_all(&data)).map(|_| Vec::new()),
            None => Err(std::io::Error::from_raw_os_error(libc::EINVAL)),
        },
        (b"t", 3) => {
            let ms: u64 = std::str::from_utf8(fields[2]).ok().and_then(|s| s.parse().ok()).unwrap_or(0);
            wait_exists(path, Instant::now() + Duration::from_millis(ms))
        }
        _ => Err(std::io::Error::from_raw_os_error(libc::EINVAL)),
    };
    answer(result)
}

/// Until `path` exists or the deadline passes (ETIMEDOUT): woken by inotify on its directory, so a
/// wait costs the guest no CPU until the file appears (a look every second besides, in case the
/// directory itself is replaced; every 100 ms where inotify cannot watch it).
fn wait_exists(path: &std::path::Path, deadline: Instant) -> std::io::Result<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("/"),
    };
    let cdir = CString::new(dir.as_os_str().as_bytes()).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: inotify_init1 takes plain flags and returns a new descriptor or -1.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
    // SAFETY: `fd` (when valid) is a fresh descriptor owned by nothing else; File closes it.
    let ino = if fd >= 0 { Some(unsafe { File::from_raw_fd(fd) }) } else { None };
    // SAFETY: `cdir` is a valid NUL-terminated path for the call; `fd` is our inotify descriptor.
    let watched = fd >= 0 && unsafe { libc::inotify_add_watch(fd, cdir.as_ptr(), libc::IN_CREATE | libc::IN_MOVED_TO) } >= 0;
    let mut events = [0u8; 4096];
    loop {
        if fs::symlink_metadata(path).is_ok() {
            return Ok(Vec::new());
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(std::io::Error::from_raw_os_error(libc::ETIMEDOUT));
        }
        let step = (deadline - now).min(Duration::from_millis(if watched { 1000 } else { 100 }));
        match (&ino, watched) {
            (Some(f), true) => {
                let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                // SAFETY: `pfd` is one valid pollfd that lives across the call.
                unsafe { libc::poll(&mut pfd, 1, step.as_millis() as libc::c_int) };
                let _ = (&*f).read(&mut events); // drain; which file it was does not matter
            }
            _ => thread::sleep(step),
        }
    }
}

/// The qdiscs of this network namespace from one RTM_GETQDISC dump, as `tc -s -j qdisc show` prints
/// them (kind, handle, root, dev, bytes, packets, drops, overlimits, requeues, backlog, qlen).
fn qdisc_json() -> std::io::Result<Vec<u8>> {
    const RTM_NEWQDISC: u16 = 36;
    const RTM_GETQDISC: u16 = 38;
    const NLMSG_ERROR: u16 = 2;
    const NLMSG_DONE: u16 = 3;
    const TCA_KIND: u16 = 1;
    const TCA_STATS: u16 = 3;
    const TCA_STATS2: u16 = 7;
    const TCA_STATS_BASIC: u16 = 1;
    const TCA_STATS_QUEUE: u16 = 3;
    const TCA_STATS_PKT64: u16 = 8;
    const TC_H_ROOT: u32 = 0xFFFF_FFFF;
    // SAFETY: socket() takes plain integers and returns a new descriptor or -1.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket() and is owned by nothing else.
    let mut sock = unsafe { File::from_raw_fd(fd) };
    // nlmsghdr (len, type, flags, seq, pid) + an all-zero tcmsg (20 bytes): every qdisc of every link
    let mut req = Vec::with_capacity(36);
    req.extend_from_slice(&36u32.to_ne_bytes());
    req.extend_from_slice(&RTM_GETQDISC.to_ne_bytes());
    req.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    req.extend_from_slice(&[0u8; 20]);
    sock.write_all(&req)?; // an unconnected netlink socket sends to the kernel
    let u16_at = |b: &[u8], i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
    let u32_at = |b: &[u8], i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let u64_at = |b: &[u8], i: usize| (u32_at(b, i) as u64) | (u32_at(b, i + 4) as u64) << 32;
    // (type, payload) of each attribute in `b`
    fn attrs(b: &[u8]) -> Vec<(u16, &[u8])> {
        let mut out = Vec::new();
        let mut i = 0;
        while i + 4 <= b.len() {
            let len = u16::from_ne_bytes([b[i], b[i + 1]]) as usize;
            if len < 4 || i + len > b.len() {
                break;
            }
            out.push((u16::from_ne_bytes([b[i + 2], b[i + 3]]) & 0x3fff, &b[i + 4..i + len]));
            i += (len + 3) & !3;
        }
        out
    }
    let mut items: Vec<String> = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    'dump: loop {
        let n = sock.read(&mut buf)?;
        let mut i = 0;
        while i + 16 <= n {
            let len = u32_at(&buf, i) as usize;
            let kind = u16_at(&buf, i + 4);
            if len < 16 || i + len > n {
                break;
            }
            let msg = &buf[i..i + len];
            i += (len + 3) & !3;
            match kind {
                NLMSG_DONE => break 'dump,
                NLMSG_ERROR => {
                    let err = if msg.len() >= 20 { u32_at(msg, 16) as i32 } else { -libc::EIO };
                    if err != 0 {
                        return Err(std::io::Error::from_raw_os_error(-err));
                    }
                }
                RTM_NEWQDISC if msg.len() >= 36 => {
                    let ifindex = u32_at(msg, 20);
                    let (handle, parent) = (u32_at(msg, 24), u32_at(msg, 28));
                    let (mut qkind, mut bytes, mut packets) = (String::new(), 0u64, 0u64);
                    let (mut drops, mut overlimits, mut requeues, mut backlog, mut qlen) = (0u32, 0u32, 0u32, 0u32, 0u32);
                    for (t, v) in attrs(&msg[36..]) {
                        match t {
                            TCA_KIND => qkind = String::from_utf8_lossy(v.split(|&c| c == 0).next().unwrap_or(b"")).into_owned(),
                            TCA_STATS2 => {
                                for (st, sv) in attrs(v) {
                                    match st {
                                        TCA_STATS_BASIC if sv.len() >= 12 => {
                                            bytes = u64_at(sv, 0);
                                            packets = u32_at(sv, 8) as u64;
                                        }
                                        TCA_STATS_PKT64 if sv.len() >= 8 => packets = u64_at(sv, 0),
                                        TCA_STATS_QUEUE if sv.len() >= 20 => {
                                            qlen = u32_at(sv, 0);
                                            backlog = u32_at(sv, 4);
                                            drops = u32_at(sv, 8);
                                            requeues = u32_at(sv, 12);
                                            overlimits = u32_at(sv, 16);
                                        }
                                        _ => {}
                                    }
                                }
                            }
                            // the old struct tc_stats, where a kernel gives no TCA_STATS2
                            TCA_STATS if bytes == 0 && packets == 0 && v.len() >= 36 => {
                                bytes = u64_at(v, 0);
                                packets = u32_at(v, 8) as u64;
                                drops = u32_at(v, 12);
                                overlimits = u32_at(v, 16);
                                qlen = u32_at(v, 28);
                                backlog = u32_at(v, 32);
                            }
                            _ => {}
                        }
                    }
                    let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
                    // SAFETY: `name` has the IF_NAMESIZE bytes if_indextoname may write, NUL included.
                    let dev = if unsafe { libc::if_indextoname(ifindex, name.as_mut_ptr()) }.is_null() {
                        ifindex.to_string()
                    } else {
                        // SAFETY: if_indextoname succeeded, so `name` holds a NUL-terminated string.
                        unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned()
                    };
                    // the parent as tc prints it: `"root":true`, or `"parent":":2"` (an mq's child of tx queue 1)
                    let place = if parent == TC_H_ROOT { "\"root\":true,".to_string() } else { format!("\"parent\":\"{}\",", tc_classid(parent)) };
                    items.push(format!(
                        "{{\"kind\":\"{}\",\"handle\":\"{:x}:\",{}\"dev\":\"{}\",\"bytes\":{},\"packets\":{},\
                         \"drops\":{},\"overlimits\":{},\"requeues\":{},\"backlog\":{},\"qlen\":{}}}",
                        json_escape(&qkind), handle >> 16, place,
                        json_escape(&dev), bytes, packets, drops, overlimits, requeues, backlog, qlen));
                }
                _ => {}
            }
        }
        if n == 0 {
            break;
        }
    }
    Ok(format!("[{}]", items.join(",")).into_bytes())
}

/// A class id as tc prints one: "major:minor" in hex, either side left empty when it is 0.
fn tc_classid(h: u32) -> String {
    let (major, minor) = (h >> 16, h & 0xffff);
    match (major, minor) {
        (0, m) => format!(":{m:x}"),
        (m, 0) => format!("{m:x}:"),
        (a, b) => format!("{a:x}:{b:x}"),
    }
}

fn json_escape(s: &str) -> String {
    s.chars().flat_map(|c| match c {
        '"' | '\\' => vec!['\\', c],
        c if (c as u32) < 0x20 => format!("\\u{:04x}", c as u32).chars().collect(),
        c => vec![c],
    }).collect()
}

/// A whole file, as `cat` gives it: /proc and /sys files report size 0, so read until EOF.
fn read_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    let f = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let mut data = Vec::new();
    f.take(MAX_READ + 1).read_to_end(&mut data)?;
    if data.len() as u64 > MAX_READ {
        return Err(std::io::Error::from_raw_os_error(libc::EFBIG));
    }
    Ok(data)
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64_encode(data: &[u8]) -> String {
    let mut s = String::with_capacity((data.len() + 2) / 3 * 4);
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        s.push(B64[(n >> 18) as usize & 63] as char);
        s.push(B64[(n >> 12) as usize & 63] as char);
        s.push(if c.len() > 1 { B64[(n >> 6) as usize & 63] as char } else { '=' });
        s.push(if c.len() > 2 { B64[n as usize & 63] as char } else { '=' });
    }
    s
}

fn b64_decode(text: &[u8]) -> Option<Vec<u8>> {
    fn val(b: u8) -> Option<u32> {
        match b {
            b'A'..=b'Z' => Some((b - b'A') as u32),
            b'a'..=b'z' => Some((b - b'a' + 26) as u32),
            b'0'..=b'9' => Some((b - b'0' + 52) as u32),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let text: Vec<u8> = text.iter().copied().filter(|&b| b != b'\r').collect();
    if text.len() % 4 != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    for q in text.chunks(4) {
        let pad = q.iter().rev().take_while(|&&b| b == b'=').count();
        if pad > 2 {
            return None;
        }
        let mut n = 0u32;
        for &b in &q[..4 - pad] {
            n = n << 6 | val(b)?;
        }
        n <<= 6 * pad as u32;
        out.push((n >> 16) as u8);
        if pad < 2 {
            out.push((n >> 8) as u8);
        }
        if pad < 1 {
            out.push(n as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_every_byte_and_every_padding() {
        for len in 0..7 {
            let data: Vec<u8> = (0..=255u8).cycle().skip(len * 37).take(len * 50 + len).collect();
            assert_eq!(b64_decode(b64_encode(&data).as_bytes()), Some(data));
        }
        assert_eq!(b64_encode(b"ab"), "YWI=");
        assert_eq!(b64_decode(b"YWI"), None);
        assert_eq!(b64_decode(b"Y!I="), None);
    }

    #[test]
    fn a_class_id_reads_as_tc_prints_it() {
        assert_eq!(tc_classid(0x0000_0002), ":2");
        assert_eq!(tc_classid(0x8001_0000), "8001:");
        assert_eq!(tc_classid(0x0001_000a), "1:a");
    }

    #[test]
    fn a_file_op_reads_writes_and_names_the_errno() {
        let dir = std::env::temp_dir().join(format!("offlab-agent-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        let p64 = b64_encode(p.to_str().unwrap().as_bytes());
        assert_eq!(file_op(format!("w:{}:{}", p64, b64_encode(b"x\0y")).as_bytes()), b"0:".to_vec());
        assert_eq!(file_op(format!("r:{}", p64).as_bytes()), format!("0:{}", b64_encode(b"x\0y")).into_bytes());
        assert_eq!(file_op(format!("e:{}", p64).as_bytes()), b"0:".to_vec());
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(file_op(format!("r:{}", p64).as_bytes()), format!("{}:", libc::ENOENT).into_bytes());
        assert_eq!(file_op(format!("t:{}:30", p64).as_bytes()), format!("{}:", libc::ETIMEDOUT).into_bytes());
        assert_eq!(file_op(b"r"), format!("{}:", libc::EINVAL).into_bytes());
    }
}
