//! Latency statistics in bounded memory: a log-linear histogram of nanosecond durations.
//!
//! Mirrors `python/rlmesh/_pycore/telemetry.py` name for name; that file is the specification
//! (the bucket layout, the quantile rule, the error bound, the messages). Durations below
//! `EXACT_BELOW` = 128 ns have a bucket each; above, every power of two is cut into
//! `SUB_BUCKETS` = 64 buckets, so `quantile` (a bucket's midpoint, capped at `max_ns`) is within
//! 1/128 of the exact nearest-rank quantile. At most `MAX_BUCKETS` = 3712 buckets, allocated up
//! to the largest duration seen.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args::{i64_arg, type_name, vector, ArgError, Dtype};

pub const SUB_BUCKET_BITS: u32 = 6;
pub const SUB_BUCKETS: usize = 1 << SUB_BUCKET_BITS;
pub const EXACT_BELOW: u64 = 2 * SUB_BUCKETS as u64;
/// `bucket_index(2**63 - 1) + 1`: one row of `SUB_BUCKETS` per shift 0..57.
pub const MAX_BUCKETS: usize = (64 - SUB_BUCKET_BITS as usize) * SUB_BUCKETS;

/// The bucket of a duration `0 <= ns < 2**63`.
///
/// `ns` is shifted right until it has 7 significant bits (values below 128 are not shifted at
/// all); the shift picks the row and those 7 bits (64..127 once shifted) the bucket in it.
pub fn bucket_index(ns: u64) -> usize {
    let bit_length = u64::BITS - ns.leading_zeros();
    let shift = bit_length.saturating_sub(SUB_BUCKET_BITS + 1);
    shift as usize * SUB_BUCKETS + (ns >> shift) as usize
}

/// `(start, width)` of bucket `index`: it holds durations `start .. start+width-1`.
pub fn bucket_bounds(index: usize) -> (u64, u64) {
    let shift = (index / SUB_BUCKETS).saturating_sub(1);
    (((index - shift * SUB_BUCKETS) as u64) << shift, 1 << shift)
}

/// `ns` checked as a duration: non-negative, or an error naming `name` and the value.
fn duration(ns: i64, name: &str) -> Result<u64, ArgError> {
    u64::try_from(ns)
        .map_err(|_| ArgError(format!("{name} must be a non-negative duration, got {ns}")))
}

/// `q` as a float in `[0, 1]`, or a `ValueError`.
fn quantile_arg(q: &Bound<'_, PyAny>) -> PyResult<f64> {
    let value = q.extract::<f64>().map_err(|_| match type_name(q) {
        Ok(kind) => PyValueError::new_err(format!("q must be a number in [0, 1], got {kind}")),
        Err(err) => err,
    })?;
    if !(0.0..=1.0).contains(&value) {
        return Err(PyValueError::new_err(format!(
            "q must be a number in [0, 1], got {}",
            q.repr()?
        )));
    }
    Ok(value)
}

/// Count, mean, max and quantiles of nanosecond durations, in bounded memory.
///
/// ``record(ns)`` adds one duration, ``record_many(ns)`` a ``[K]`` integer array of them;
/// ``merge(other)`` adds another LatencyStats of the same core; ``quantile(q)`` is within 1/128
/// of the exact nearest-rank quantile and never above ``max_ns``. Durations must lie in
/// ``[0, 2**63)``. See ``rlmesh._pycore.telemetry.LatencyStats`` for the full contract.
///
/// Example:
///     >>> stats = LatencyStats()
///     >>> stats.record_many(np.array([100, 200, 300, 400, 1_000_000]))
///     >>> stats.count, stats.quantile(0.5), stats.max_ns, stats.snapshot()["avg_ns"]
///     (5, 302, 1000000, 200200.0)
#[pyclass(module = "rlmesh._core")]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LatencyStats {
    /// Grown up to the bucket of the largest duration seen, never past `MAX_BUCKETS`.
    buckets: Vec<u64>,
    count: u64,
    /// Up to 2**64 durations below 2**63 each: a u128 cannot overflow.
    total_ns: u128,
    max_ns: u64,
}

impl LatencyStats {
    /// Room for bucket `index`.
    fn grow_to(&mut self, index: usize) {
        if index >= self.buckets.len() {
            self.buckets.resize(index + 1, 0);
        }
    }

    /// Add one duration.
    pub(crate) fn add(&mut self, ns: u64) {
        let index = bucket_index(ns);
        self.grow_to(index);
        self.buckets[index] += 1;
        self.count += 1;
        self.total_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Add every duration of `durations`; all or none of them.
    pub fn record_many(&mut self, durations: &[i64]) -> Result<(), ArgError> {
        let mut largest = 0;
        for (position, &ns) in durations.iter().enumerate() {
            if ns < 0 {
                duration(ns, &format!("ns[{position}]"))?;
            }
            largest = largest.max(ns as u64);
        }
        if !durations.is_empty() {
            self.grow_to(bucket_index(largest)); // once, not per value
        }
        for &ns in durations {
            let ns = ns as u64; // checked non-negative above
            self.buckets[bucket_index(ns)] += 1;
            self.total_ns += u128::from(ns);
        }
        self.count += durations.len() as u64;
        self.max_ns = self.max_ns.max(largest);
        Ok(())
    }

    /// Add everything `other` recorded, as if it had been recorded here.
    pub fn merge(&mut self, other: &LatencyStats) {
        if other.buckets.len() > self.buckets.len() {
            self.buckets.resize(other.buckets.len(), 0);
        }
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            *mine += theirs;
        }
        self.count += other.count;
        self.total_ns += other.total_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    /// The exact mean duration (the snapshot's ``avg_ns``); 0.0 when empty.
    pub fn mean_ns(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        self.total_ns as f64 / self.count as f64
    }

    /// The midpoint of the bucket holding the `ceil(q * count)`-th smallest duration, capped
    /// at `max_ns` (and `max_ns` itself for the `count`-th); 0 when empty. `q` is in `[0, 1]`.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        // Saturating float-to-int cast, then the rank clamped into 1..=count as in Python.
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        if rank == self.count {
            return self.max_ns; // the largest duration is known exactly
        }
        let mut seen = 0;
        let index = self
            .buckets
            .iter()
            .position(|&count| {
                seen += count;
                seen >= rank
            })
            .expect("the buckets hold count >= rank durations");
        let (start, width) = bucket_bounds(index);
        (start + width / 2).min(self.max_ns)
    }
}

/// The Python face: argument conversion around the histogram.
#[pymethods]
impl LatencyStats {
    #[new]
    fn py_new() -> Self {
        LatencyStats::default()
    }

    /// Add one duration ``ns`` (an integer number of nanoseconds, ``>= 0``).
    #[pyo3(name = "record")]
    fn py_record(&mut self, ns: &Bound<'_, PyAny>) -> PyResult<()> {
        self.add(duration(i64_arg(ns, "ns")?, "ns")?);
        Ok(())
    }

    /// Add every duration of ``ns``, a ``[K]`` integer array; all or none of them.
    #[pyo3(name = "record_many")]
    fn py_record_many(&mut self, ns: &Bound<'_, PyAny>) -> PyResult<()> {
        let durations = vector::<i64>(ns, Dtype::Int64, "ns")?;
        Ok(self.record_many(durations.as_slice()?)?)
    }

    /// Add everything ``other`` recorded, as if it had been recorded here.
    #[pyo3(name = "merge")]
    fn py_merge(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<()> {
        let Ok(other) = other.cast::<LatencyStats>() else {
            let kind = other.get_type();
            return Err(PyTypeError::new_err(format!(
                "merge needs a LatencyStats from the same core, got {}.{}",
                kind.module()?,
                kind.qualname()?
            )));
        };
        // A copy: other may be slf, which is about to be borrowed mutably.
        let theirs = other.borrow().clone();
        slf.borrow_mut().merge(&theirs);
        Ok(())
    }

    /// Forget everything recorded, and the buckets' memory with it.
    fn reset(&mut self) {
        *self = LatencyStats::default();
    }

    #[getter]
    fn count(&self) -> u64 {
        self.count
    }

    #[getter]
    fn total_ns(&self) -> u128 {
        self.total_ns
    }

    /// The largest duration recorded, exactly; 0 when empty.
    #[getter]
    fn max_ns(&self) -> u64 {
        self.max_ns
    }

    /// A value within 1/128 of the exact nearest-rank ``q``-quantile; 0 when empty.
    #[pyo3(name = "quantile")]
    fn py_quantile(&self, q: &Bound<'_, PyAny>) -> PyResult<u64> {
        Ok(self.quantile(quantile_arg(q)?))
    }

    /// ``{count, avg_ns, p50_ns, p95_ns, p99_ns, max_ns}``: all ints but ``avg_ns``.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let snapshot = PyDict::new(py);
        snapshot.set_item("count", self.count)?;
        snapshot.set_item("avg_ns", self.mean_ns())?;
        snapshot.set_item("p50_ns", self.quantile(0.5))?;
        snapshot.set_item("p95_ns", self.quantile(0.95))?;
        snapshot.set_item("p99_ns", self.quantile(0.99))?;
        snapshot.set_item("max_ns", self.max_ns)?;
        Ok(snapshot)
    }

    fn __repr__(&self) -> String {
        format!(
            "LatencyStats(count={}, total_ns={}, max_ns={})",
            self.count, self.total_ns, self.max_ns
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(durations: &[i64]) -> LatencyStats {
        let mut stats = LatencyStats::default();
        stats.record_many(durations).unwrap();
        stats
    }

    #[test]
    fn buckets_are_exact_below_128_then_tile_each_power_of_two_in_64() {
        for ns in 0..EXACT_BELOW {
            assert_eq!(bucket_bounds(bucket_index(ns)), (ns, 1));
        }
        assert_eq!(bucket_index(128), 128);
        assert_eq!(bucket_bounds(128), (128, 2));
        assert_eq!(bucket_index(i64::MAX as u64), MAX_BUCKETS - 1);
        // Consecutive buckets tile the durations with no gap or overlap.
        for index in 1..MAX_BUCKETS {
            let (start, width) = bucket_bounds(index - 1);
            assert_eq!(bucket_bounds(index).0, start + width);
            assert!(width <= start.max(1) / SUB_BUCKETS as u64 || start < EXACT_BELOW);
            assert_eq!(bucket_index(start + width - 1), index - 1);
        }
    }

    #[test]
    fn quantiles_are_nearest_rank_bucket_midpoints_capped_at_the_max() {
        let stats = stats(&[100, 200, 300, 400, 1_000_000]);
        assert_eq!(stats.quantile(0.0), 100);
        assert_eq!(stats.quantile(0.5), 302);
        assert_eq!(stats.quantile(1.0), 1_000_000);
        assert_eq!(stats.mean_ns(), 200_200.0);
        assert_eq!(LatencyStats::default().quantile(0.5), 0);
    }

    #[test]
    fn a_negative_duration_is_named_and_nothing_is_recorded() {
        let mut stats = stats(&[5]);
        let err = stats.record_many(&[1, -3]).unwrap_err();
        assert_eq!(err.0, "ns[1] must be a non-negative duration, got -3");
        assert_eq!(stats, self::stats(&[5]));
    }

    #[test]
    fn memory_is_bounded_by_the_largest_value_never_by_the_count() {
        let mut stats = stats(&[999_999]);
        let buckets = stats.buckets.len();
        assert_eq!(buckets, bucket_index(999_999) + 1);
        let many: Vec<i64> = (0..1_000_000).map(|k| (k * 7_919) % 1_000_000).collect();
        stats.record_many(&many).unwrap();
        assert_eq!(stats.count, 1_000_001);
        assert_eq!(stats.buckets.len(), buckets); // a million values, no more buckets
        stats.add(i64::MAX as u64);
        assert_eq!(stats.buckets.len(), MAX_BUCKETS); // the most any LatencyStats ever holds
        stats = LatencyStats::default();
        assert!(stats.buckets.is_empty());
    }

    #[test]
    fn merging_equals_recording_everything_in_one() {
        let mut merged = stats(&[1, 1_000, 7_000_000]);
        merged.merge(&stats(&[i64::MAX, 3]));
        assert_eq!(merged, stats(&[1, 1_000, 7_000_000, i64::MAX, 3]));
    }
}
