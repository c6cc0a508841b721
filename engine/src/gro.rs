//! Splitting a UDP_GRO buffer back into the datagrams it was coalesced from.
//!
//! With UDP_GRO the kernel may hand one buffer holding several datagrams of the
//! same size `gso_size` (told in a cmsg); only the last one may be shorter.

/// Lengths of the datagrams inside a received buffer of `len` bytes.
/// `gso_size == 0` means no GRO cmsg came with it: the buffer is one datagram.
#[derive(Debug, Clone)]
pub struct Segments {
    remaining: usize,
    gso_size: usize,
    done: bool,
}

pub fn segments(len: usize, gso_size: usize) -> Segments {
    Segments {
        remaining: len,
        gso_size,
        done: false,
    }
}

impl Iterator for Segments {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        if self.done {
            return None;
        }
        if self.gso_size == 0 || self.remaining <= self.gso_size {
            // The last (or only) datagram; a zero-length datagram is still one.
            self.done = true;
            return Some(self.remaining);
        }
        self.remaining -= self.gso_size;
        Some(self.gso_size)
    }
}

/// How many datagrams a buffer holds, without walking it.
pub fn count(len: usize, gso_size: usize) -> usize {
    if gso_size == 0 || len <= gso_size {
        1
    } else {
        (len + gso_size - 1) / gso_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lens(len: usize, gso: usize) -> Vec<usize> {
        segments(len, gso).collect()
    }

    #[test]
    fn full_segments_then_a_short_last_one() {
        assert_eq!(lens(3000, 1472), vec![1472, 1472, 56]);
        assert_eq!(count(3000, 1472), 3);
    }

    #[test]
    fn exact_multiple_has_no_short_tail() {
        assert_eq!(lens(2944, 1472), vec![1472, 1472]);
        assert_eq!(count(2944, 1472), 2);
        assert_eq!(lens(44 * 1472, 1472).len(), 44);
    }

    #[test]
    fn buffer_not_larger_than_gso_size_is_one_datagram() {
        assert_eq!(lens(1472, 1472), vec![1472]);
        assert_eq!(lens(100, 1472), vec![100]);
        assert_eq!(count(100, 1472), 1);
    }

    #[test]
    fn without_gro_cmsg_the_buffer_is_one_datagram() {
        assert_eq!(lens(65507, 0), vec![65507]);
        assert_eq!(lens(0, 0), vec![0]);
        assert_eq!(count(65507, 0), 1);
    }

    #[test]
    fn lengths_add_up_to_the_buffer() {
        for &(len, gso) in &[(65507usize, 1472usize), (1, 1), (9000, 8972), (64000, 1000)] {
            let v = lens(len, gso);
            assert_eq!(v.iter().sum::<usize>(), len);
            assert_eq!(v.len(), count(len, gso));
            assert!(v[..v.len() - 1].iter().all(|&l| l == gso));
        }
    }
}
