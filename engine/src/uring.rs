//! A minimal io_uring over raw syscalls (io_uring_setup, io_uring_enter, io_uring_register and mmap of
//! the rings), just enough for `tx --send io_uring` and `--send io_uring-zc`: queue SEND / SEND_ZC
//! requests, submit them with one io_uring_enter, read their completions.
//!
//! Layout and constants follow the kernel's uapi header (linux/io_uring.h). The rings are shared with
//! the kernel: the SQ tail and CQ head are ours to write, the SQ head and CQ tail the kernel's; they are
//! read and written as atomics (acquire/release), as liburing does.

use std::mem;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::sys;

pub const IORING_OP_SEND: u8 = 26;
pub const IORING_OP_SEND_ZC: u8 = 47;
/// sqe.flags: the next SQE starts only once this one succeeded; a failure cancels the rest (-ECANCELED).
pub const IOSQE_IO_LINK: u8 = 1 << 2;
/// sqe.ioprio of SEND_ZC: the notification's res says whether the kernel copied after all (Linux 6.2).
pub const IORING_SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// cqe.flags: another CQE (the notification) follows for this request.
pub const IORING_CQE_F_MORE: u32 = 1 << 1;
/// cqe.flags: this CQE is a zero-copy notification: the kernel is done with the buffer.
pub const IORING_CQE_F_NOTIF: u32 = 1 << 3;
/// A notification's res with IORING_SEND_ZC_REPORT_USAGE: the data was copied, not sent from the buffer.
pub const IORING_NOTIF_USAGE_ZC_COPIED: i32 = i32::MIN; // 1 << 31

const IORING_SETUP_CQSIZE: u32 = 1 << 3;
const IORING_SETUP_SINGLE_ISSUER: u32 = 1 << 12;
const IORING_SETUP_DEFER_TASKRUN: u32 = 1 << 13;
const IORING_FEAT_SINGLE_MMAP: u32 = 1 << 0;
const IORING_OFF_SQ_RING: libc::off_t = 0;
const IORING_OFF_CQ_RING: libc::off_t = 0x800_0000;
const IORING_OFF_SQES: libc::off_t = 0x1000_0000;
const IORING_ENTER_GETEVENTS: u32 = 1 << 0;
const IORING_ENTER_EXT_ARG: u32 = 1 << 3;
const IORING_REGISTER_PROBE: u32 = 8;
const IO_URING_OP_SUPPORTED: u16 = 1 << 0;

#[repr(C)]
#[derive(Default)]
struct SqringOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    flags: u32,
    dropped: u32,
    array: u32,
    resv1: u32,
    user_addr: u64,
}

#[repr(C)]
#[derive(Default)]
struct CqringOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    overflow: u32,
    cqes: u32,
    flags: u32,
    resv1: u32,
    user_addr: u64,
}

#[repr(C)]
#[derive(Default)]
struct Params {
    sq_entries: u32,
    cq_entries: u32,
    flags: u32,
    sq_thread_cpu: u32,
    sq_thread_idle: u32,
    features: u32,
    wq_fd: u32,
    resv: [u32; 3],
    sq_off: SqringOffsets,
    cq_off: CqringOffsets,
}

/// One submission queue entry, 64 bytes; only the fields a send uses are named.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct Sqe {
    pub opcode: u8,
    pub flags: u8,
    pub ioprio: u16,
    pub fd: i32,
    pub off: u64,
    pub addr: u64,
    pub len: u32,
    pub msg_flags: u32,
    pub user_data: u64,
    pub buf_index: u16,
    pub personality: u16,
    pub file_index: u32,
    pub addr3: u64,
    pub pad2: u64,
}

/// One completion queue entry.
#[repr(C)]
#[derive(Default, Clone, Copy, Debug)]
pub struct Cqe {
    pub user_data: u64,
    pub res: i32,
    pub flags: u32,
}

/// io_uring_getevents_arg: a timeout for io_uring_enter (IORING_ENTER_EXT_ARG, Linux 5.11).
#[repr(C)]
struct GeteventsArg {
    sigmask: u64,
    sigmask_sz: u32,
    min_wait_usec: u32,
    ts: u64,
}

/// One mmap'ed region, unmapped on drop.
struct Map {
    ptr: *mut u8,
    len: usize,
}

impl Map {
    fn new(fd: libc::c_int, len: usize, offset: libc::off_t) -> Result<Map, i32> {
        // SAFETY: a fresh shared mapping of the ring fd at the offset the kernel defines for this region;
        // nothing of ours is overwritten (the address is the kernel's choice); failure is checked.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(sys::errno());
        }
        Ok(Map { ptr: p as *mut u8, len })
    }

    /// The address `off` bytes into the region (the kernel's offsets are within it).
    fn at(&self, off: u32) -> *mut u8 {
        debug_assert!((off as usize) < self.len);
        self.ptr.wrapping_add(off as usize)
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; the region is unmapped once, here, after the
        // Ring that reads it is gone (Ring owns its Maps).
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// An io_uring instance: its fd, the shared rings, and the SQEs queued but not yet submitted.
pub struct Ring {
    fd: libc::c_int,
    // Keep the mappings alive for as long as the pointers below are used; dropped after `fd` is closed.
    _sq_map: Map,
    _cq_map: Option<Map>,
    _sqe_map: Map,
    sq_tail: *const AtomicU32,
    sq_mask: u32,
    sq_entries: u32,
    sqes: *mut Sqe,
    cq_head: *const AtomicU32,
    cq_tail: *const AtomicU32,
    cq_mask: u32,
    cqes: *const Cqe,
    /// Our copy of the SQ tail: SQEs up to here are written; the shared tail is published on submit.
    local_tail: u32,
    /// SQEs written since the last submit.
    pending: u32,
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the Ring owns `fd` (from io_uring_setup) and closes it exactly once.
        unsafe { libc::close(self.fd) };
    }
}

fn setup(entries: u32, p: &mut Params) -> libc::c_int {
    // SAFETY: io_uring_setup reads and writes one io_uring_params, which `p` is (repr(C), same layout
    // and size as the kernel's struct), alive and exclusively borrowed for the call.
    unsafe { libc::syscall(libc::SYS_io_uring_setup, entries as libc::c_ulong, p as *mut Params) as libc::c_int }
}

impl Ring {
    /// A ring with room for `sq` SQEs and `cq` CQEs (both rounded up to powers of two by the kernel).
    /// Tries SINGLE_ISSUER | DEFER_TASKRUN first (Linux 6.1: completions are posted only while this
    /// task waits in io_uring_enter, no interrupting task work), then without. Err: the errno of
    /// io_uring_setup or mmap.
    pub fn new(sq: u32, cq: u32) -> Result<Ring, i32> {
        let mut p = Params::default();
        let mut fd = -1;
        for flags in [IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN, 0] {
            p = Params { cq_entries: cq, flags: flags | IORING_SETUP_CQSIZE, ..Params::default() };
            fd = setup(sq, &mut p);
            if fd >= 0 || sys::errno() != libc::EINVAL {
                break;
            }
        }
        if fd < 0 {
            return Err(sys::errno());
        }
        let sq_len = p.sq_off.array as usize + p.sq_entries as usize * mem::size_of::<u32>();
        let cq_len = p.cq_off.cqes as usize + p.cq_entries as usize * mem::size_of::<Cqe>();
        let single = p.features & IORING_FEAT_SINGLE_MMAP != 0;
        let maps = (|| {
            let sq_map = Map::new(fd, if single { sq_len.max(cq_len) } else { sq_len }, IORING_OFF_SQ_RING)?;
            let cq_map = if single { None } else { Some(Map::new(fd, cq_len, IORING_OFF_CQ_RING)?) };
            let sqe_map = Map::new(fd, p.sq_entries as usize * mem::size_of::<Sqe>(), IORING_OFF_SQES)?;
            Ok((sq_map, cq_map, sqe_map))
        })();
        let (sq_map, cq_map, sqe_map) = match maps {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: fd came from io_uring_setup above and is not used after this.
                unsafe { libc::close(fd) };
                return Err(e);
            }
        };
        let cq_base = cq_map.as_ref().unwrap_or(&sq_map);
        // SAFETY: the kernel filled sq_off/cq_off with offsets inside the regions just mapped (sized from
        // those same offsets); the ring mask, entry counts and the SQ array are u32s there, 4-byte aligned
        // (the kernel's struct io_rings).
        let sq_mask = unsafe { *(sq_map.at(p.sq_off.ring_mask) as *const u32) };
        // SAFETY: as above.
        let cq_mask = unsafe { *(cq_base.at(p.cq_off.ring_mask) as *const u32) };
        let array = sq_map.at(p.sq_off.array) as *mut u32;
        for i in 0..p.sq_entries {
            // SAFETY: the SQ array holds sq_entries u32s (sq_len above); index i maps to SQE i for good,
            // so the array is written once here and the SQE index is tail & mask from then on.
            unsafe { array.add(i as usize).write_volatile(i) };
        }
        Ok(Ring {
            fd,
            sq_tail: sq_map.at(p.sq_off.tail) as *const AtomicU32,
            sq_mask,
            sq_entries: p.sq_entries,
            sqes: sqe_map.ptr as *mut Sqe,
            cq_head: cq_base.at(p.cq_off.head) as *const AtomicU32,
            cq_tail: cq_base.at(p.cq_off.tail) as *const AtomicU32,
            cq_mask,
            cqes: cq_base.at(p.cq_off.cqes) as *const Cqe,
            // SAFETY: the SQ tail is a u32 in the mapped ring (as above); nothing submitted yet.
            local_tail: unsafe { (*(sq_map.at(p.sq_off.tail) as *const AtomicU32)).load(Ordering::Relaxed) },
            pending: 0,
            _sq_map: sq_map,
            _cq_map: cq_map,
            _sqe_map: sqe_map,
        })
    }

    /// Whether the kernel knows `op` (IORING_REGISTER_PROBE, Linux 5.6).
    pub fn supports(&self, op: u8) -> bool {
        // struct io_uring_probe (16 bytes) followed by 256 io_uring_probe_op (8 bytes each).
        let mut buf = [0u64; 2 + 256];
        // SAFETY: `buf` is a zeroed, 8-byte aligned io_uring_probe with room for 256 ops, the count
        // passed; the kernel writes within it.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                self.fd as libc::c_ulong,
                IORING_REGISTER_PROBE as libc::c_ulong,
                buf.as_mut_ptr(),
                256 as libc::c_ulong,
            )
        };
        if r < 0 {
            return false;
        }
        let bytes: &[u8] = {
            // SAFETY: viewing the u64 array as its bytes (same memory, u8 has no alignment need).
            unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, mem::size_of_val(&buf)) }
        };
        let last_op = bytes[0];
        if op > last_op {
            return false;
        }
        // ops[op] starts at 16 + 8 * op: { u8 op; u8 resv; u16 flags; u32 resv2 }.
        let at = 16 + 8 * op as usize;
        u16::from_ne_bytes([bytes[at + 2], bytes[at + 3]]) & IO_URING_OP_SUPPORTED != 0
    }

    /// SQEs that can be queued before a submit.
    pub fn capacity(&self) -> u32 {
        self.sq_entries
    }

    /// Queues one SQE (not yet visible to the kernel: `submit_and_wait` publishes it).
    /// Panics if more than `capacity()` are queued without a submit (a caller's bug).
    pub fn push(&mut self, sqe: &Sqe) {
        assert!(self.pending < self.sq_entries, "io_uring: more SQEs queued than the ring holds");
        let idx = (self.local_tail & self.sq_mask) as usize;
        // SAFETY: idx ≤ sq_mask < sq_entries, the number of SQEs mapped; the slot is ours to write: the
        // kernel consumed everything up to the published tail (io_uring_enter submits all of it before
        // returning, or we see it via `pending` below), and at most sq_entries are outstanding.
        unsafe { self.sqes.add(idx).write(*sqe) };
        self.local_tail = self.local_tail.wrapping_add(1);
        self.pending += 1;
    }

    /// Publishes the queued SQEs and enters the kernel: submits them and waits until at least
    /// `wait` CQEs are in the ring (0: do not wait), or `timeout_ns` passed (None: no limit).
    /// Returns how many SQEs the kernel consumed (the rest stay queued for the next call), or the errno
    /// (EINTR on a signal, ETIME on a timeout) when it consumed none.
    pub fn submit_and_wait(&mut self, wait: u32, timeout_ns: Option<u64>) -> Result<u32, i32> {
        // SAFETY: sq_tail points at the SQ tail in the mapped ring; Release makes the SQEs written in
        // `push` visible to the kernel before the tail that covers them.
        unsafe { (*self.sq_tail).store(self.local_tail, Ordering::Release) };
        let to_submit = self.pending;
        let ts = timeout_ns.map(|ns| libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        });
        let arg = GeteventsArg {
            sigmask: 0,
            sigmask_sz: 0,
            min_wait_usec: 0,
            ts: ts.as_ref().map_or(0, |t| t as *const libc::timespec as u64),
        };
        let mut flags = if wait > 0 { IORING_ENTER_GETEVENTS } else { 0 };
        let (argp, argsz) = if ts.is_some() {
            flags |= IORING_ENTER_EXT_ARG | IORING_ENTER_GETEVENTS;
            (&arg as *const GeteventsArg as usize, mem::size_of::<GeteventsArg>())
        } else {
            (0, 0)
        };
        // SAFETY: plain integers and, with EXT_ARG, a pointer to `arg` (and through it to `ts`), both
        // alive on this stack frame for the call; the kernel reads the SQEs published above.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_uring_enter,
                self.fd as libc::c_ulong,
                to_submit as libc::c_ulong,
                wait as libc::c_ulong,
                flags as libc::c_ulong,
                argp,
                argsz,
            )
        };
        if r < 0 {
            // The kernel returns an error only when it submitted nothing in this call (a wait that ends
            // with EINTR or ETIME after a submission returns the count submitted): `pending` stands.
            return Err(sys::errno());
        }
        let n = r as u32;
        self.pending -= n.min(self.pending);
        Ok(n)
    }

    /// The next completion, if one is in the ring.
    pub fn pop(&mut self) -> Option<Cqe> {
        // SAFETY: cq_head/cq_tail point at the CQ head and tail in the mapped ring; Acquire on the tail
        // makes the kernel's CQE writes visible before we read them.
        let (head, tail) = unsafe { ((*self.cq_head).load(Ordering::Relaxed), (*self.cq_tail).load(Ordering::Acquire)) };
        if head == tail {
            return None;
        }
        // SAFETY: head & cq_mask < cq_entries, the number of CQEs mapped; the entry between head and tail
        // is the kernel's finished write (Acquire above).
        let cqe = unsafe { ptr::read(self.cqes.add((head & self.cq_mask) as usize)) };
        // SAFETY: as above; Release hands the slot back to the kernel after our read.
        unsafe { (*self.cq_head).store(head.wrapping_add(1), Ordering::Release) };
        Some(cqe)
    }
}

/// Why io_uring cannot be used here, for the one-line error: the sysctl that disables it, if set.
pub fn unavailable_hint() -> String {
    match std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled") {
        Ok(v) if v.trim() != "0" => format!(" (kernel.io_uring_disabled = {})", v.trim()),
        Ok(_) => String::new(),
        Err(_) => " (no kernel.io_uring_disabled: the kernel may lack io_uring)".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_kernel() {
        assert_eq!(mem::size_of::<Sqe>(), 64);
        assert_eq!(mem::size_of::<Cqe>(), 16);
        assert_eq!(mem::size_of::<Params>(), 120);
        assert_eq!(mem::size_of::<GeteventsArg>(), 24);
    }

    #[test]
    fn a_send_on_loopback_completes_through_the_ring() {
        let mut ring = match Ring::new(4, 8) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("io_uring unavailable here ({}): test not applicable", sys::describe(e));
                return;
            }
        };
        assert!(ring.supports(IORING_OP_SEND));
        let rx = sys::Socket::udp(false).unwrap();
        rx.bind(&"127.0.0.1:0".parse().unwrap()).unwrap();
        let tx = sys::Socket::udp(false).unwrap();
        tx.connect(&rx.local_addr().unwrap()).unwrap();
        let buf = [7u8; 100];
        ring.push(&Sqe {
            opcode: IORING_OP_SEND,
            fd: tx.fd,
            addr: buf.as_ptr() as u64,
            len: buf.len() as u32,
            user_data: 42,
            ..Sqe::default()
        });
        assert_eq!(ring.submit_and_wait(1, None), Ok(1));
        let c = ring.pop().unwrap();
        assert_eq!((c.user_data, c.res), (42, 100));
        assert!(ring.pop().is_none());
        let mut got = [0u8; 200];
        // SAFETY: the pointer and length describe `got`, alive for the call.
        let n = unsafe { libc::recv(rx.fd, got.as_mut_ptr() as *mut libc::c_void, got.len(), libc::MSG_DONTWAIT) };
        assert_eq!(n, 100);
        assert_eq!(got[99], 7);
    }
}
