//! Rate pacing by datagram count: datagram `k` is due at `start + k / pps`.
//! Counting from the start (not from the previous send) keeps the average
//! exact however late single sends are; a sender that falls too far behind
//! gives up the lost time instead of bursting it all at once.

use crate::sys;

/// Past this lateness the schedule is moved, not caught up.
pub const MAX_LAG_NS: u64 = 100_000_000;
/// `wait_until_exact` sleeps (rather than spins) while the due time is farther than this.
const SLEEP_ABOVE_NS: u64 = 300_000;
/// `wait_until_exact` wakes this long before the due time and spins the rest.
const WAKE_EARLY_NS: u64 = 200_000;
#[derive(Debug, Clone)]
pub struct Pacer {
    start_ns: u64,
    interval_ns: f64,
    pub resets: u64,
    pub max_lag_ns: u64,
}

impl Pacer {
    pub fn new(start_ns: u64, pps: f64) -> Pacer {
        Pacer {
            start_ns,
            interval_ns: 1e9 / pps,
            resets: 0,
            max_lag_ns: 0,
        }
    }

    /// When datagram number `k` (0-based) is due.
    #[inline]
    pub fn due(&self, k: u64) -> u64 {
        self.start_ns + (k as f64 * self.interval_ns) as u64
    }

    /// How many datagrams, counting from `k`, are due at `now` (at least 1).
    #[inline]
    pub fn due_count(&self, now: u64, k: u64) -> u64 {
        if now <= self.start_ns {
            return 1;
        }
        let due_total = ((now - self.start_ns) as f64 / self.interval_ns).floor() as u64 + 1;
        due_total.saturating_sub(k).max(1)
    }

    /// Notes how late datagram `k` is at `now`; past MAX_LAG_NS, moves the
    /// schedule so that `k` is due now.
    pub fn note_lag(&mut self, now: u64, k: u64) {
        let due = self.due(k);
        if now > due {
            let lag = now - due;
            if lag > MAX_LAG_NS {
                self.start_ns += lag;
                self.resets += 1;
            } else if lag > self.max_lag_ns {
                self.max_lag_ns = lag;
            }
        }
    }
}

/// Waits until CLOCK_MONOTONIC reaches `t`, asleep (the senders set a timer slack of 1 ns): the
/// wake comes some microseconds late, and a stream sender sends what fell due meanwhile at once, so
/// its average stays exact and single gaps vary by the wake's lateness (`max_lag_us` in its report).
/// It never spins: a spinning sender takes a whole CPU, on a small machine the receiver's.
/// Returns the time read last (>= t unless a stop was asked).
pub fn wait_until(t: u64) -> u64 {
    loop {
        let now = sys::mono_ns();
        if now >= t || sys::stop_requested() {
            return now;
        }
        sys::sleep_until(t);
    }
}

/// Waits until CLOCK_MONOTONIC reaches `t` to the microsecond: sleeps while far, spins the last
/// stretch (a CPU while it spins). For a send whose due time is part of a figure: an open-loop round
/// trip counts from its scheduled send, so a late wake would be added to every RTT.
/// Returns the time read last (>= t unless a stop was asked).
pub fn wait_until_exact(t: u64) -> u64 {
    loop {
        let now = sys::mono_ns();
        if now >= t || sys::stop_requested() {
            return now;
        }
        if t - now > SLEEP_ABOVE_NS {
            sys::sleep_until(t - WAKE_EARLY_NS);
        } else {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_are_due_at_even_intervals() {
        let p = Pacer::new(1_000, 100_000.0); // 10 us apart
        assert_eq!(p.due(0), 1_000);
        assert_eq!(p.due(1), 11_000);
        assert_eq!(p.due(200_000), 1_000 + 2_000_000_000);
    }

    #[test]
    fn due_count_grows_with_time_for_batches() {
        let p = Pacer::new(0, 1_000.0); // 1 ms apart
        assert_eq!(p.due_count(0, 0), 1);
        assert_eq!(p.due_count(999_999, 0), 1);
        assert_eq!(p.due_count(1_000_000, 0), 2);
        assert_eq!(p.due_count(5_500_000, 2), 4); // 0..=5 due, 2 already sent
        assert_eq!(p.due_count(5_500_000, 10), 1); // ahead: never below 1
    }

    #[test]
    fn far_behind_moves_the_schedule_instead_of_bursting() {
        let mut p = Pacer::new(0, 1_000.0);
        p.note_lag(50_000_000, 0); // 50 ms late: caught up, recorded
        assert_eq!((p.resets, p.max_lag_ns), (0, 50_000_000));
        p.note_lag(500_000_000, 10); // 490 ms late: schedule moves
        assert_eq!(p.resets, 1);
        assert_eq!(p.due(10), 500_000_000);
        assert_eq!(p.due(11), 501_000_000);
    }
}
