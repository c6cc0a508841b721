//! The engine's one histogram of nanosecond values (rx's one-way latency, rr's
//! round trips), HDR style: log-linear buckets (exact below 2 * SUB ns, then
//! SUB buckets per power of two, so a bucket is at most 1/SUB = 0.78 % wide),
//! a highest trackable value fixed up front, and an explicit overflow count
//! instead of a panic. Flows record into their own histogram; reports merge them.

pub const SUB_BITS: u32 = 7;
pub const SUB: u64 = 1 << SUB_BITS;

#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    /// Highest value a bucket holds; larger values only count in `overflow`.
    pub highest_ns: u64,
    pub n: u64,
    pub overflow: u64,
    pub min: u64,
    pub max: u64,
    sum: u128,
}

fn index(v: u64) -> usize {
    if v < 2 * SUB {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros();
    let shift = msb - SUB_BITS;
    let sub = (v >> shift) - SUB;
    ((shift as u64 + 1) * SUB + sub) as usize
}

/// Lowest value of bucket `i`.
fn bucket_low(i: usize) -> u64 {
    let i = i as u64;
    if i < 2 * SUB {
        return i;
    }
    let shift = i / SUB - 1;
    (SUB + i % SUB) << shift
}

/// Highest value of bucket `i`.
fn bucket_high(i: usize) -> u64 {
    if (i as u64) < 2 * SUB {
        return i as u64;
    }
    bucket_low(i + 1) - 1
}

impl Histogram {
    /// `highest_ns` must be at least 1 and below 2^62 (146 years).
    pub fn new(highest_ns: u64) -> Histogram {
        let highest_ns = highest_ns.clamp(1, 1 << 62);
        Histogram {
            counts: vec![0; index(highest_ns) + 1],
            highest_ns,
            n: 0,
            overflow: 0,
            min: u64::MAX,
            max: 0,
            sum: 0,
        }
    }

    /// Records one value; above `highest_ns` it counts only in `overflow`
    /// (and in min/max/mean, which stay exact).
    #[inline]
    pub fn record(&mut self, v: u64) {
        self.record_n(v, 1)
    }

    /// Records `v` `n` times (the datagrams of one GRO buffer share a value).
    #[inline]
    pub fn record_n(&mut self, v: u64, n: u64) {
        if n == 0 {
            return;
        }
        if v > self.highest_ns {
            self.overflow += n;
        } else {
            self.counts[index(v)] += n;
        }
        self.n += n;
        self.sum += v as u128 * n as u128;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    /// Empties it, keeping its range (and its memory).
    pub fn clear(&mut self) {
        for c in self.counts.iter_mut() {
            *c = 0;
        }
        self.n = 0;
        self.overflow = 0;
        self.sum = 0;
        self.min = u64::MAX;
        self.max = 0;
    }

    /// Adds another histogram of the same range.
    pub fn merge(&mut self, o: &Histogram) {
        if o.counts.len() > self.counts.len() {
            self.counts.resize(o.counts.len(), 0);
            self.highest_ns = self.highest_ns.max(o.highest_ns);
        }
        for (a, b) in self.counts.iter_mut().zip(o.counts.iter()) {
            *a += b;
        }
        self.n += o.n;
        self.overflow += o.overflow;
        self.sum += o.sum;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
    }

    /// Nearest-rank percentile (q in 0..=100): the middle of the bucket that
    /// holds the rank, clamped to [min, max]; `max` when the rank overflowed.
    pub fn percentile(&self, q: f64) -> Option<u64> {
        if self.n == 0 {
            return None;
        }
        let rank = ((q / 100.0) * self.n as f64).ceil().max(1.0) as u64;
        if rank >= self.n {
            return Some(self.max);
        }
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (low, high) = (bucket_low(i), bucket_high(i));
                return Some((low + (high - low) / 2).clamp(self.min, self.max));
            }
        }
        Some(self.max)
    }

    pub fn mean(&self) -> Option<f64> {
        if self.n == 0 {
            None
        } else {
            Some(self.sum as f64 / self.n as f64)
        }
    }

    /// Non-empty buckets as (lowest ns, highest ns, count), in order.
    pub fn buckets(&self) -> Vec<(u64, u64, u64)> {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| (bucket_low(i), bucket_high(i), c))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_are_exact() {
        let mut h = Histogram::new(1_000_000);
        for v in 1..=100u64 {
            h.record(v);
        }
        assert_eq!(h.percentile(50.0), Some(50));
        assert_eq!(h.percentile(99.0), Some(99));
        assert_eq!(h.percentile(99.9), Some(100));
        assert_eq!((h.min, h.max, h.n, h.overflow), (1, 100, 100, 0));
        assert_eq!(h.mean(), Some(50.5));
    }

    #[test]
    fn large_values_are_within_one_bucket() {
        // 1000 values 10..10000 us: p50 = 5000 us, p90 = 9000 us, by hand.
        let mut h = Histogram::new(60_000_000_000);
        for i in 1..=1000u64 {
            h.record(i * 10_000);
        }
        for (q, want) in [(50.0, 5_000_000.0), (90.0, 9_000_000.0), (99.0, 9_900_000.0)] {
            let got = h.percentile(q).unwrap() as f64;
            assert!((got - want).abs() / want < 1.0 / SUB as f64, "p{} = {}", q, got);
        }
        assert_eq!(h.percentile(100.0), Some(10_000_000));
    }

    #[test]
    fn buckets_cover_every_value_once() {
        for v in [0u64, 1, 255, 256, 257, 1000, 65_535, 1 << 40, (1 << 62) - 1] {
            let i = index(v);
            assert!(bucket_low(i) <= v && v <= bucket_high(i), "{}", v);
            assert_eq!(bucket_high(i) + 1, bucket_low(i + 1), "{}", v);
        }
    }

    #[test]
    fn bucket_width_is_under_one_percent() {
        for v in [300u64, 10_000, 123_456, 9_999_999, 1 << 40] {
            let i = index(v);
            let w = (bucket_high(i) - bucket_low(i) + 1) as f64;
            assert!(w / bucket_low(i) as f64 <= 1.0 / SUB as f64, "{}", v);
        }
    }

    #[test]
    fn record_n_equals_n_records() {
        let mut a = Histogram::new(1_000_000);
        let mut b = Histogram::new(1_000_000);
        a.record_n(5_000, 3);
        a.record_n(7, 0);
        for _ in 0..3 {
            b.record(5_000);
        }
        assert_eq!((a.n, a.min, a.max, a.mean()), (b.n, b.min, b.max, b.mean()));
        assert_eq!(a.percentile(50.0), b.percentile(50.0));
    }

    #[test]
    fn empty_histogram_has_no_percentiles() {
        let h = Histogram::new(1_000);
        assert_eq!(h.percentile(50.0), None);
        assert_eq!(h.mean(), None);
    }

    #[test]
    fn values_above_the_range_overflow_without_panic() {
        let mut h = Histogram::new(1_000);
        h.record(500);
        h.record(5_000);
        h.record(u64::MAX);
        assert_eq!((h.n, h.overflow, h.max), (3, 2, u64::MAX));
        assert_eq!(h.buckets().iter().map(|b| b.2).sum::<u64>(), 1);
        assert_eq!(h.percentile(50.0), Some(u64::MAX)); // the rank overflowed: max
        assert_eq!(h.percentile(10.0).map(|v| v <= 504), Some(true));
    }

    #[test]
    fn merge_equals_recording_everything_in_one() {
        let mut a = Histogram::new(1_000_000);
        let mut b = Histogram::new(1_000_000);
        let mut all = Histogram::new(1_000_000);
        for v in [10u64, 200, 3_000, 40_000] {
            a.record(v);
            all.record(v);
        }
        for v in [7u64, 900_000, 2_000_000] {
            b.record(v);
            all.record(v);
        }
        a.merge(&b);
        assert_eq!((a.n, a.overflow, a.min, a.max, a.mean()), (all.n, all.overflow, all.min, all.max, all.mean()));
        assert_eq!(a.buckets(), all.buckets());
        assert_eq!(a.percentile(50.0), all.percentile(50.0));
    }

    #[test]
    fn clear_forgets_everything() {
        let mut h = Histogram::new(1_000);
        h.record(10);
        h.record(5_000);
        h.clear();
        assert_eq!((h.n, h.overflow, h.buckets().len(), h.percentile(50.0)), (0, 0, 0, None));
        h.record(7);
        assert_eq!((h.min, h.max, h.mean()), (7, 7, Some(7.0)));
    }

    #[test]
    fn empty_has_no_percentiles() {
        let h = Histogram::new(1_000);
        assert_eq!((h.percentile(50.0), h.mean(), h.buckets().len()), (None, None, 0));
    }
}
