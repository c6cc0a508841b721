//! Receive-side accounting: loss, duplicates, reordering, jitter, latency.
//! Pure functions of the (seq, tx time, rx time) stream, so tests can feed
//! synthetic sequences and check the numbers by hand.

/// Tracks which sequence numbers arrived, in a sliding window below the
/// highest one seen. A seq older than the window cannot be told apart from a
/// duplicate; it is counted as `too_old` and assumed unique.
pub struct SeqTracker {
    bits: Vec<u64>,
    window: u64,
    /// Highest seq seen + 1 (0: nothing yet).
    pub next_expected: u64,
    pub unique: u64,
    pub duplicates: u64,
    pub reordered: u64,
    pub too_old: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqKind {
    /// First arrival, in order (seq above every seq before).
    New,
    /// First arrival, but after a higher seq.
    Reordered,
    Duplicate,
}

impl SeqTracker {
    /// `window` is rounded up to a power of two (at least 64), so that the
    /// per-datagram slot lookup is a mask, not a division.
    pub fn new(window: u64) -> SeqTracker {
        let window = window.max(64).next_power_of_two();
        SeqTracker {
            bits: vec![0; (window / 64) as usize],
            window,
            next_expected: 0,
            unique: 0,
            duplicates: 0,
            reordered: 0,
            too_old: 0,
        }
    }

    #[inline]
    fn get(&self, seq: u64) -> bool {
        let i = seq & (self.window - 1);
        self.bits[(i >> 6) as usize] & (1u64 << (i & 63)) != 0
    }

    #[inline]
    fn put(&mut self, seq: u64, on: bool) {
        let i = seq & (self.window - 1);
        let w = &mut self.bits[(i >> 6) as usize];
        if on {
            *w |= 1u64 << (i & 63);
        } else {
            *w &= !(1u64 << (i & 63));
        }
    }

    #[inline(always)]
    pub fn record(&mut self, seq: u64) -> SeqKind {
        if seq == self.next_expected {
            // The common case, kept small enough to inline.
            self.put(seq, true);
            self.next_expected = seq + 1;
            self.unique += 1;
            return SeqKind::New;
        }
        self.record_other(seq)
    }

    #[inline(never)]
    fn record_other(&mut self, seq: u64) -> SeqKind {
        if seq >= self.next_expected {
            // Positions of skipped seqs still hold bits of seqs one window
            // older: clear them so a late arrival is seen as new.
            let gap = seq - self.next_expected;
            if gap >= self.window {
                for w in self.bits.iter_mut() {
                    *w = 0;
                }
            } else {
                let mut s = self.next_expected;
                while s < seq {
                    self.put(s, false);
                    s += 1;
                }
            }
            self.put(seq, true);
            self.next_expected = seq + 1;
            self.unique += 1;
            return SeqKind::New;
        }
        if self.next_expected - seq > self.window {
            self.too_old += 1;
            self.unique += 1;
            self.reordered += 1;
            return SeqKind::Reordered;
        }
        if self.get(seq) {
            self.duplicates += 1;
            return SeqKind::Duplicate;
        }
        self.put(seq, true);
        self.unique += 1;
        self.reordered += 1;
        SeqKind::Reordered
    }

    /// Datagrams missing below the highest seq seen: `highest + 1 - unique`.
    pub fn lost(&self) -> u64 {
        self.next_expected.saturating_sub(self.unique)
    }

    pub fn highest(&self) -> Option<u64> {
        if self.unique == 0 && self.next_expected == 0 {
            None
        } else {
            Some(self.next_expected - 1)
        }
    }
}

/// RFC 3550 section 6.4.1 interarrival jitter, in nanoseconds:
/// `J += (|D| - J) / 16` with `D` the change in transit time between two
/// consecutive arrivals. Kept as 16 * J in an integer, as in the RFC's
/// appendix A.8, so the per-datagram update is a few integer operations.
#[derive(Debug, Default)]
pub struct Jitter {
    prev_transit: Option<i64>,
    j16: u64,
}

impl Jitter {
    #[inline]
    pub fn record(&mut self, tx_ns: u64, rx_ns: u64) {
        let transit = rx_ns as i64 - tx_ns as i64;
        if let Some(p) = self.prev_transit {
            let d = (transit - p).unsigned_abs();
            self.j16 = self.j16 + d - ((self.j16 + 8) >> 4);
        }
        self.prev_transit = Some(transit);
    }
    pub fn ns(&self) -> f64 {
        self.j16 as f64 / 16.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(seqs: &[u64]) -> SeqTracker {
        let mut t = SeqTracker::new(1024);
        for &s in seqs {
            t.record(s);
        }
        t
    }

    #[test]
    fn in_order_stream_has_no_loss() {
        let t = feed(&[0, 1, 2, 3, 4]);
        assert_eq!((t.unique, t.lost(), t.duplicates, t.reordered), (5, 0, 0, 0));
        assert_eq!(t.highest(), Some(4));
    }

    #[test]
    fn gap_counts_as_loss_until_it_is_filled() {
        let t = feed(&[0, 2, 3]);
        assert_eq!((t.unique, t.lost(), t.reordered), (3, 1, 0));
        let t = feed(&[0, 2, 3, 1]);
        assert_eq!((t.unique, t.lost(), t.reordered), (4, 0, 1));
    }

    #[test]
    fn swapped_pair_is_one_reordered_and_no_loss() {
        let t = feed(&[0, 1, 3, 2, 4]);
        assert_eq!((t.unique, t.lost(), t.duplicates, t.reordered), (5, 0, 0, 1));
    }

    #[test]
    fn duplicates_are_counted_once_and_not_as_unique() {
        let t = feed(&[0, 1, 1, 2, 0]);
        assert_eq!((t.unique, t.lost(), t.duplicates, t.reordered), (3, 0, 2, 0));
    }

    #[test]
    fn missing_start_counts_as_loss() {
        // The run's first seq is 0; arriving from 5 on means 0..4 were lost.
        let t = feed(&[5, 6, 7]);
        assert_eq!((t.unique, t.lost()), (3, 5));
    }

    #[test]
    fn window_reuse_does_not_mistake_new_for_duplicate() {
        let mut t = SeqTracker::new(64);
        for s in 0..64 {
            t.record(s);
        }
        // Skip 64..=99, then 70 arrives late: slot 70 % 64 held seq 6's bit.
        assert_eq!(t.record(100), SeqKind::New);
        assert_eq!(t.record(70), SeqKind::Reordered);
        assert_eq!(t.record(70), SeqKind::Duplicate);
        assert_eq!(t.lost(), 101 - 66);
        // Older than the window: assumed unique, flagged too_old.
        assert_eq!(t.record(3), SeqKind::Reordered);
        assert_eq!(t.too_old, 1);
    }

    #[test]
    fn huge_jump_clears_the_window() {
        let mut t = SeqTracker::new(64);
        t.record(0);
        t.record(1_000_000);
        assert_eq!(t.record(999_999), SeqKind::Reordered);
        assert_eq!(t.lost(), 1_000_001 - 3);
    }

    #[test]
    fn jitter_follows_rfc3550_by_hand() {
        // Transit times 100, 110, 100 us: D = 10, 10 (us).
        // J1 = 10/16 = 0.625; J2 = 0.625 + (10 - 0.625)/16 = 1.2109375.
        let mut j = Jitter::default();
        j.record(0, 100_000);
        j.record(1_000_000, 1_110_000);
        assert_eq!(j.ns(), 625.0);
        j.record(2_000_000, 2_100_000);
        assert_eq!(j.ns(), 1_210.937_5);
    }

    #[test]
    fn constant_transit_has_zero_jitter() {
        let mut j = Jitter::default();
        for i in 0..100u64 {
            j.record(i * 1000, i * 1000 + 5000);
        }
        assert_eq!(j.ns(), 0.0);
    }
}
