//! Per-interval records (`--interval MS`): what happened in each slice of the run, so a stall or a
//! warm-up shows. tx and rx keep cumulative counters and take their change per interval at the
//! first call after each boundary (one comparison per call on the hot path); rr keeps a small
//! histogram per flow for the interval it is in and merges it into the shared row when the flow
//! moves on. Rows are bounded: at most MAX_INTERVALS, the rest only counted.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::histogram::Histogram;
use crate::json::{Obj, Value};

pub const DEFAULT_INTERVAL_MS: u64 = 100;
pub const MAX_INTERVAL_MS: u64 = 60_000;
/// One hour at 100 ms. Beyond it rows are not kept, only counted (`intervals_dropped`).
pub const MAX_INTERVALS: usize = 36_000;

/// The change of cumulative counters per interval, from `origin` on.
pub struct Deltas {
    iv: u64,
    origin: Option<u64>,
    /// End of the interval currently filling.
    next: u64,
    last: Vec<u64>,
    /// (start offset from origin ns, length ns, one change per counter), flat: `2 + n` per row.
    rows: Vec<i64>,
    n: usize,
    pub dropped: u64,
}

impl Deltas {
    /// `counters` per row; `iv_ns` > 0.
    pub fn new(iv_ns: u64, counters: usize) -> Deltas {
        Deltas { iv: iv_ns, origin: None, next: 0, last: vec![0; counters], rows: Vec::new(), n: counters, dropped: 0 }
    }

    /// The first interval starts at `origin`; counts before `start` (all zero) belong to it.
    pub fn start(&mut self, origin: u64) {
        self.origin = Some(origin);
        self.next = origin + self.iv;
    }

    pub fn started(&self) -> bool {
        self.origin.is_some()
    }

    /// Called before counting what happened at `now`: closes every interval that ended by `now`
    /// with the counters as they are (`cumul`, everything before `now`).
    #[inline(always)]
    pub fn tick(&mut self, now: u64, cumul: &[u64]) {
        if self.origin.is_some() && now >= self.next {
            self.close(now, cumul);
        }
    }

    #[inline(never)]
    fn close(&mut self, now: u64, cumul: &[u64]) {
        let start = self.next - self.iv;
        self.push(start, self.iv, cumul);
        // Intervals that passed without a call: nothing happened in them (a stall shows as zeros).
        let empty = (now - self.next) / self.iv;
        let room = (MAX_INTERVALS - self.rows_len().min(MAX_INTERVALS)) as u64;
        for k in 0..empty.min(room) {
            let s = self.next + k * self.iv;
            let c = self.last.clone();
            self.push(s, self.iv, &c);
        }
        self.dropped += empty - empty.min(room);
        self.next += (empty + 1) * self.iv;
    }

    /// Closes the last interval at `end` (shorter than the others unless `end` is on a boundary).
    pub fn finish(&mut self, end: u64, cumul: &[u64]) {
        if self.origin.is_none() {
            return;
        }
        self.tick(end, cumul);
        let start = self.next - self.iv;
        if end > start || cumul != self.last.as_slice() {
            self.push(start, end.saturating_sub(start), cumul);
        }
    }

    fn push(&mut self, start: u64, len: u64, cumul: &[u64]) {
        if self.rows_len() >= MAX_INTERVALS {
            self.dropped += 1;
        } else {
            let origin = self.origin.unwrap_or(0);
            self.rows.push((start - origin) as i64);
            self.rows.push(len as i64);
            for (c, l) in cumul.iter().zip(self.last.iter()) {
                self.rows.push(*c as i64 - *l as i64);
            }
        }
        self.last.copy_from_slice(cumul);
    }

    pub fn rows_len(&self) -> usize {
        self.rows.len() / (2 + self.n)
    }

    /// (start ns after the origin, length ns, the counters' changes), in order.
    pub fn rows(&self) -> impl Iterator<Item = (i64, i64, &[i64])> {
        self.rows.chunks(2 + self.n).map(|r| (r[0], r[1], &r[2..]))
    }

    pub fn iv_ns(&self) -> u64 {
        self.iv
    }

    pub fn origin(&self) -> Option<u64> {
        self.origin
    }
}

/// The `series` object every mode prints: what a row is, then the rows.
pub fn to_json(iv_ns: u64, origin: &str, origin_ns: Option<u64>, dropped: u64, columns: &[&str], rows: Vec<Value>) -> Value {
    let mut o = Obj::new();
    o.f("interval_s", iv_ns as f64 / 1e9)
        .s("t_from", origin)
        .opt_u("t0_mono_ns", origin_ns)
        .u("max_intervals", MAX_INTERVALS as u64)
        .u("intervals_dropped", dropped)
        .set("columns", Value::Arr(columns.iter().map(|c| Value::Str(c.to_string())).collect()))
        .set("rows", Value::Arr(rows));
    o.into_value()
}

/// A rate per second over `len_ns`, or null for an empty interval.
pub fn per_s(count: f64, len_ns: i64) -> Value {
    if len_ns > 0 {
        Value::F64(count * 1e9 / len_ns as f64)
    } else {
        Value::Null
    }
}

/// One interval of one rr flow (or, merged, of all flows).
struct Acc {
    transactions: u64,
    lost: u64,
    rtt: Histogram,
}

impl Acc {
    fn new(highest_ns: u64) -> Acc {
        Acc { transactions: 0, lost: 0, rtt: Histogram::new(highest_ns) }
    }
}

/// A finished rr interval: counts and RTT percentiles (ns).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RrRow {
    pub transactions: u64,
    pub lost: u64,
    pub p50: Option<u64>,
    pub p99: Option<u64>,
    pub max: Option<u64>,
}

struct Table {
    open: BTreeMap<i64, Acc>,
    /// The interval each flow is in (i64::MAX once it finished).
    at: Vec<i64>,
    rows: Vec<RrRow>,
}

/// rr's intervals, aligned on the window's start (`warm_end`): interval 0 opens the window,
/// negative ones are warm-up. A transaction belongs to the interval of its start (its due time
/// with a rate), as it does to the window.
pub struct RrSeries {
    pub iv: u64,
    warm_end: u64,
    start: u64,
    end: u64,
    first: i64,
    pub dropped: u64,
    highest_ns: u64,
    table: Mutex<Table>,
}

/// What one flow holds of the interval it is in.
pub struct FlowInterval {
    flow: usize,
    idx: i64,
    acc: Acc,
}

impl RrSeries {
    pub fn new(iv_ns: u64, start: u64, warm_end: u64, end: u64, flows: usize, highest_ns: u64) -> RrSeries {
        let iv = iv_ns.max(1);
        let first = ((start as i128 - warm_end as i128).div_euclid(iv as i128)) as i64;
        let last = ((end as i128 - warm_end as i128 - 1).div_euclid(iv as i128)) as i64;
        let total = (last - first + 1).max(0) as u64;
        let count = total.min(MAX_INTERVALS as u64) as usize;
        RrSeries {
            iv,
            warm_end,
            start,
            end,
            first,

            dropped: total - count as u64,
            highest_ns,
            table: Mutex::new(Table { open: BTreeMap::new(), at: vec![i64::MIN; flows], rows: vec![RrRow::default(); count] }),
        }
    }

    pub fn flow(&self, flow: usize) -> FlowInterval {
        FlowInterval { flow, idx: self.first, acc: Acc::new(self.highest_ns) }
    }

    pub fn window_start(&self) -> u64 {
        self.warm_end
    }

    fn index(&self, t: u64) -> i64 {
        ((t as i128 - self.warm_end as i128).div_euclid(self.iv as i128)) as i64
    }

    /// One transaction of `f` that started (or was due) at `due`: its RTT, or None if lost.
    #[inline]
    pub fn record(&self, f: &mut FlowInterval, due: u64, rtt_ns: Option<u64>) {
        let idx = self.index(due);
        if idx != f.idx {
            self.hand_over(f, idx);
        }
        match rtt_ns {
            Some(r) => {
                f.acc.transactions += 1;
                f.acc.rtt.record(r);
            }
            None => f.acc.lost += 1,
        }
    }

    /// The flow is done: what it holds goes to the table.
    pub fn finish(&self, f: &mut FlowInterval) {
        self.hand_over(f, i64::MAX);
    }

    /// Merges the flow's interval into the table, moves the flow to `next`, and closes every
    /// interval that all flows have left.
    fn hand_over(&self, f: &mut FlowInterval, next: i64) {
        let mut t = match self.table.lock() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        };
        if f.acc.transactions + f.acc.lost > 0 {
            let highest = self.highest_ns;
            let slot = t.open.entry(f.idx).or_insert_with(|| Acc::new(highest));
            slot.transactions += f.acc.transactions;
            slot.lost += f.acc.lost;
            slot.rtt.merge(&f.acc.rtt);
            f.acc.transactions = 0;
            f.acc.lost = 0;
            f.acc.rtt.clear();
        }
        f.idx = next;
        t.at[f.flow] = next;
        let oldest = t.at.iter().copied().min().unwrap_or(i64::MAX);
        let done: Vec<i64> = t.open.range(..oldest).map(|(k, _)| *k).collect();
        for k in done {
            if let Some(acc) = t.open.remove(&k) {
                let row = k - self.first;
                if row >= 0 && (row as usize) < t.rows.len() {
                    let h = &acc.rtt;
                    t.rows[row as usize] = RrRow {
                        transactions: acc.transactions,
                        lost: acc.lost,
                        p50: h.percentile(50.0),
                        p99: h.percentile(99.0),
                        max: if h.n > 0 { Some(h.max) } else { None },
                    };
                }
            }
        }
    }

    /// Rows in order: (interval number, 0 = the window's first; start ns and length ns within
    /// the run, clipped to start..end; the row).
    pub fn rows(&self) -> Vec<(i64, i64, i64, RrRow)> {
        let t = match self.table.lock() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        };
        let (w, iv) = (self.warm_end as i128, self.iv as i128);
        t.rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let idx = self.first + i as i64;
                let lo = (w + idx as i128 * iv).max(self.start as i128);
                let hi = (w + (idx as i128 + 1) * iv).min(self.end as i128);
                (idx, (lo - w) as i64, (hi - lo).max(0) as i64, *r)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn deltas_split_counts_by_interval_and_sum_to_the_total() {
        let mut d = Deltas::new(100 * MS, 2);
        d.start(1_000 * MS);
        // cumulative (datagrams, bytes) as seen before each call
        d.tick(1_010 * MS, &[0, 0]);
        d.tick(1_050 * MS, &[5, 500]);
        d.tick(1_120 * MS, &[10, 1_000]); // closes [0, 100) with 10
        d.tick(1_190 * MS, &[12, 1_200]);
        d.finish(1_250 * MS, &[15, 1_500]); // closes [100, 200) with 5, then [200, 250) with 0
        let rows: Vec<_> = d.rows().map(|(s, l, c)| (s, l, c.to_vec())).collect();
        let ms = |v: u64| (v * MS) as i64;
        assert_eq!(
            rows,
            vec![(0, ms(100), vec![10, 1_000]), (ms(100), ms(100), vec![5, 500]), (ms(200), ms(50), vec![0, 0])]
        );
        assert_eq!(d.rows().map(|r| r.2[0]).sum::<i64>(), 15);
    }

    #[test]
    fn a_stall_shows_as_empty_intervals() {
        let mut d = Deltas::new(100 * MS, 1);
        d.start(0);
        d.tick(50 * MS, &[4]);
        d.tick(420 * MS, &[7]); // nothing between 0.1 and 0.4 s
        d.finish(450 * MS, &[9]);
        let counts: Vec<i64> = d.rows().map(|r| r.2[0]).collect();
        assert_eq!(counts, vec![7, 0, 0, 0, 2]);
        let last = d.rows().last().unwrap();
        assert_eq!((last.0, last.1), ((400 * MS) as i64, (50 * MS) as i64));
    }

    #[test]
    fn a_counter_that_falls_gives_a_negative_change() {
        // rx's "lost" falls when a late datagram fills an older gap.
        let mut d = Deltas::new(10, 1);
        d.start(0);
        d.tick(10, &[3]);
        d.finish(15, &[1]);
        assert_eq!(d.rows().map(|r| r.2[0]).collect::<Vec<_>>(), vec![3, -2]);
    }

    #[test]
    fn rows_beyond_the_cap_are_counted_not_kept() {
        let mut d = Deltas::new(1, 1);
        d.start(0);
        d.tick(MAX_INTERVALS as u64 + 500, &[1]);
        d.finish(MAX_INTERVALS as u64 + 500, &[1]);
        assert_eq!(d.rows_len(), MAX_INTERVALS);
        assert_eq!(d.rows_len() as u64 + d.dropped, MAX_INTERVALS as u64 + 500);
    }

    #[test]
    fn rr_rows_align_on_the_window_and_mark_warmup() {
        // start 1.00 s, window 1.15 .. 1.40 s, 100 ms intervals: -2 (1.05..1.15 clipped to 1.00..), -1, 0, 1, 2
        let s = RrSeries::new(100 * MS, 1_000 * MS, 1_150 * MS, 1_400 * MS, 1, 1_000 * MS);
        let mut f = s.flow(0);
        s.record(&mut f, 1_010 * MS, Some(50)); // warm-up
        s.record(&mut f, 1_160 * MS, Some(100));
        s.record(&mut f, 1_170 * MS, Some(200));
        s.record(&mut f, 1_170 * MS, None);
        s.record(&mut f, 1_390 * MS, Some(70));
        s.finish(&mut f);
        let rows = s.rows();
        let idx: Vec<i64> = rows.iter().map(|r| r.0).collect();
        assert_eq!(idx, vec![-2, -1, 0, 1, 2]);
        assert_eq!((rows[0].1, rows[0].2), (-(150 * MS as i64), (50 * MS) as i64));
        assert_eq!(rows[0].3.transactions, 1);
        assert_eq!((rows[2].3.transactions, rows[2].3.lost, rows[2].3.max), (2, 1, Some(200)));
        assert_eq!((rows[2].3.p50, rows[2].3.p99), (Some(100), Some(200)));
        assert_eq!(rows[3].3, RrRow::default()); // nothing happened: a stall is a zero row
        assert_eq!((rows[4].2, rows[4].3.transactions), ((50 * MS) as i64, 1));
    }

    #[test]
    fn rr_flows_merge_into_one_row_only_when_all_have_left_it() {
        let s = RrSeries::new(100, 0, 0, 300, 2, 1_000_000);
        let (mut a, mut b) = (s.flow(0), s.flow(1));
        s.record(&mut a, 10, Some(100));
        s.record(&mut a, 150, Some(300)); // a leaves interval 0; b has not started it
        assert_eq!(s.rows()[0].3, RrRow::default());
        s.record(&mut b, 20, Some(200));
        s.record(&mut b, 250, Some(400));
        let r0 = s.rows()[0].3;
        assert_eq!((r0.transactions, r0.p50, r0.max), (2, Some(100), Some(200)));
        s.finish(&mut a);
        s.finish(&mut b);
        let total: u64 = s.rows().iter().map(|r| r.3.transactions).sum();
        assert_eq!(total, 4);
    }
}
