//! Determinism evidence: each episode's reset digest and trajectory digest.
//!
//! Mirrors `python/rlmesh/_pycore/digests.py` name for name; that file is the specification
//! (`rlmesh-digest-1`: what is hashed, in which order, and why). Here an array's bytes are
//! hashed where they lie, and `bulk`'s loop is one LLVM vectorizes: a 256x256x3 uint8 image
//! takes a few microseconds.

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyString, PyTuple};

use crate::args::array_bytes;
use crate::assembly::numpy;
use crate::seeding::splitmix64;

// The domains of the digests: ASCII tags, so no two kinds of value start alike.
const KEY_BASE: u64 = 0x726C_6D65_7368_6B79; // "rlmeshky"
const LEAF_SEED: u64 = 0x6C65_6166; // "leaf"
const TEXT_SEED: u64 = 0x7465_7874; // "text"
const DICT_SEED: u64 = 0x6469_6374; // "dict"
const TUPLE_SEED: u64 = 0x7475_706C; // "tupl"
const TRAJECTORY_SEED: u64 = 0x7472_616A; // "traj"
/// The leaf of a value whose repr raised too.
const UNREADABLE: u64 = 0x3F3F_3F3F; // "????"
/// The dtype kinds whose bytes are hashed as they are.
const BYTE_KINDS: &[u8] = b"biufcSU";
/// Native arrays (byte order `=`) are little-endian here.
const LITTLE_ENDIAN: bool = cfg!(target_endian = "little");

/// One word into a digest's state: `splitmix64(state ^ word)`.
#[inline]
pub(crate) fn absorb(state: u64, word: u64) -> u64 {
    splitmix64(state ^ word)
}

/// The keys of `bulk`, `k_j = splitmix64(KEY_BASE + j)`, computed once and grown on demand.
#[derive(Debug, Default)]
pub(crate) struct Keys {
    keys: Vec<u64>,
}

impl Keys {
    /// The first `words` keys.
    fn get(&mut self, words: usize) -> &[u64] {
        if self.keys.len() < words {
            let size = words.max(2 * self.keys.len()).max(1024);
            let start = self.keys.len() as u64;
            self.keys
                .extend((start..size as u64).map(|j| splitmix64(KEY_BASE.wrapping_add(j))));
        }
        &self.keys[..words]
    }
}

/// One word's term of the NH sum.
#[inline(always)]
fn term(word: u64, key: u64) -> u64 {
    let low = u64::from((word as u32).wrapping_add(key as u32));
    let high = u64::from(((word >> 32) as u32).wrapping_add((key >> 32) as u32));
    (low * high).wrapping_add(word)
}

/// The NH sum of `bytes`' little-endian 64-bit words (the last one padded with zero bytes)
/// with their keys, modulo 2**64.
pub(crate) fn bulk(bytes: &[u8], keys: &mut Keys) -> u64 {
    let keys = keys.get(bytes.len().div_ceil(8));
    let chunks = bytes.chunks_exact(8);
    let tail = chunks.remainder();
    let mut acc = 0u64;
    for (chunk, &key) in chunks.zip(keys) {
        let word = u64::from_le_bytes(chunk.try_into().expect("chunks of 8 bytes"));
        acc = acc.wrapping_add(term(word, key));
    }
    if !tail.is_empty() {
        let mut word = [0u8; 8];
        word[..tail.len()].copy_from_slice(tail);
        acc = acc.wrapping_add(term(u64::from_le_bytes(word), keys[bytes.len() / 8]));
    }
    acc
}

/// The digest of a text's UTF-8 bytes (a dict key, a `repr`).
pub(crate) fn text_digest(text: &[u8], keys: &mut Keys) -> u64 {
    absorb(absorb(TEXT_SEED, text.len() as u64), bulk(text, keys))
}

/// What a leaf's digest starts from: its dtype's kind and item size, and its shape.
pub(crate) fn leaf_prefix(kind: u8, itemsize: usize, shape: &[usize]) -> u64 {
    let prefix = absorb(
        absorb(absorb(LEAF_SEED, u64::from(kind)), itemsize as u64),
        shape.len() as u64,
    );
    shape
        .iter()
        .fold(prefix, |prefix, &size| absorb(prefix, size as u64))
}

/// `str(value)` as UTF-8, surrogates passed through.
fn text_of(value: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let text = match value.cast_exact::<PyString>() {
        Ok(text) => text.clone(),
        Err(_) => value.str()?,
    };
    if let Ok(text) = text.to_str() {
        return Ok(text.as_bytes().to_vec());
    }
    let encoded = text.call_method1("encode", ("utf-8", "surrogatepass"))?;
    Ok(encoded.cast_into::<PyBytes>()?.as_bytes().to_vec())
}

/// `array`'s kind and item size when its bytes are hashed as they are: a kind of
/// `BYTE_KINDS`, no fields, little-endian, C-contiguous.
fn readable(array: &Bound<'_, PyUntypedArray>) -> Option<(u8, usize)> {
    let dtype = array.dtype();
    let kind = dtype.kind();
    if !BYTE_KINDS.contains(&kind) || dtype.has_fields() {
        return None;
    }
    let little = match dtype.byteorder() {
        b'|' | b'<' => true,
        b'=' => LITTLE_ENDIAN,
        _ => false,
    };
    (little && array.is_c_contiguous()).then(|| (kind, dtype.itemsize()))
}

/// Whether `err` is an `Exception` (what the Python core's `except Exception` catches).
fn caught(py: Python<'_>, err: &PyErr) -> bool {
    err.is_instance_of::<PyException>(py)
}

/// `value` as the array whose bytes are hashed: `numpy.asarray`, little-endian, C order;
/// None for a value hashed by its `repr`.
pub(crate) fn canonical<'py>(
    value: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyUntypedArray>>> {
    if let Ok(array) = value.cast::<PyUntypedArray>() {
        if readable(array).is_some() {
            return Ok(Some(array.clone()));
        }
    }
    let py = value.py();
    let numpy = numpy(py)?;
    let mut array = numpy
        .getattr("asarray")?
        .call1((value,))?
        .cast_into::<PyUntypedArray>()?;
    let dtype = array.dtype();
    if !BYTE_KINDS.contains(&dtype.kind()) || dtype.has_fields() {
        return Ok(None);
    }
    let big = match dtype.byteorder() {
        b'>' => true,
        b'=' => !LITTLE_ENDIAN,
        _ => false,
    };
    if big {
        let little = dtype.call_method1("newbyteorder", ("<",))?;
        array = array
            .call_method1("astype", (little,))?
            .cast_into::<PyUntypedArray>()?;
    }
    if !array.is_c_contiguous() {
        let kwargs = PyDict::new(py);
        kwargs.set_item("order", "C")?;
        array = numpy
            .getattr("array")?
            .call((array,), Some(&kwargs))?
            .cast_into::<PyUntypedArray>()?;
    }
    Ok(Some(array))
}

/// The leaf of an array `canonical` returned.
pub(crate) fn array_digest(array: &Bound<'_, PyUntypedArray>, keys: &mut Keys) -> u64 {
    let dtype = array.dtype();
    let prefix = leaf_prefix(dtype.kind(), dtype.itemsize(), array.shape());
    // SAFETY: `array` is alive and C-contiguous (`canonical`), and no Python code runs while
    // its bytes are read.
    let bytes = unsafe { array_bytes(array) };
    absorb(prefix, bulk(bytes, keys))
}

/// The leaf of a value hashed by its `repr`.
fn opaque(value: &Bound<'_, PyAny>, keys: &mut Keys) -> PyResult<u64> {
    let py = value.py();
    let listed = numpy(py)?
        .getattr("asarray")?
        .call1((value,))
        .and_then(|array| array.call_method0("tolist"));
    let listed = match listed {
        Ok(listed) => listed,
        Err(err) if caught(py, &err) => value.clone(),
        Err(err) => return Err(err),
    };
    let text = listed
        .repr()?
        .call_method1("encode", ("utf-8", "surrogatepass"))?;
    let text = text.cast_into::<PyBytes>()?;
    Ok(absorb(
        absorb(LEAF_SEED, u64::from(b'O')),
        text_digest(text.as_bytes(), keys),
    ))
}

/// The leaf of a plain Python bool, int (one an int64 holds) or float; None for any other
/// value.
fn scalar(value: &Bound<'_, PyAny>, keys: &mut Keys) -> Option<u64> {
    if value.is_exact_instance_of::<PyBool>() {
        let byte = u8::from(value.is_truthy().ok()?);
        return Some(absorb(leaf_prefix(b'b', 1, &[]), bulk(&[byte], keys)));
    }
    if value.is_exact_instance_of::<PyInt>() {
        let integer = value.extract::<i64>().ok()?;
        return Some(absorb(
            leaf_prefix(b'i', 8, &[]),
            bulk(&integer.to_le_bytes(), keys),
        ));
    }
    if let Ok(float) = value.cast_exact::<PyFloat>() {
        let bytes = float.value().to_le_bytes();
        return Some(absorb(leaf_prefix(b'f', 8, &[]), bulk(&bytes, keys)));
    }
    None
}

fn leaf(value: &Bound<'_, PyAny>, keys: &mut Keys) -> PyResult<u64> {
    if let Some(digest) = scalar(value, keys) {
        return Ok(digest);
    }
    let array = match canonical(value) {
        Ok(array) => array,
        // numpy cannot make an array of it: its repr
        Err(err) if caught(value.py(), &err) => None,
        Err(err) => return Err(err),
    };
    match array {
        Some(array) => Ok(array_digest(&array, keys)),
        None => opaque(value, keys),
    }
}

/// A dict's items in the order of their keys' text, each key's text with its value.
fn sorted_items<'py>(dict: &Bound<'py, PyDict>) -> PyResult<Vec<(Vec<u8>, Bound<'py, PyAny>)>> {
    let mut items = dict
        .iter()
        .map(|(key, value)| Ok((text_of(&key)?, value)))
        .collect::<PyResult<Vec<_>>>()?;
    // Stable, as Python's sorted: keys whose text is equal keep the dict's order.
    items.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(items)
}

fn digest(value: &Bound<'_, PyAny>, keys: &mut Keys) -> PyResult<u64> {
    if let Ok(dict) = value.cast::<PyDict>() {
        let items = sorted_items(dict)?;
        let mut state = absorb(DICT_SEED, items.len() as u64);
        for (key, item) in &items {
            state = absorb(absorb(state, text_digest(key, keys)), digest(item, keys)?);
        }
        return Ok(state);
    }
    if let Ok(tuple) = value.cast::<PyTuple>() {
        let mut state = absorb(TUPLE_SEED, tuple.len() as u64);
        for item in tuple.iter() {
            state = absorb(state, digest(&item, keys)?);
        }
        return Ok(state);
    }
    leaf(value, keys)
}

/// The 64-bit digest of an observation or action; a value whose `repr` raised is
/// `UNREADABLE`'s leaf, so hashing never fails a run (only a `BaseException` that is not an
/// `Exception`, such as a `KeyboardInterrupt`, is raised).
pub(crate) fn digest_of(value: &Bound<'_, PyAny>, keys: &mut Keys) -> PyResult<u64> {
    match digest(value, keys) {
        Ok(digest) => Ok(digest),
        Err(err) if caught(value.py(), &err) => Ok(absorb(LEAF_SEED, UNREADABLE)),
        Err(err) => Err(err),
    }
}

/// A digest as a results file writes it: 16 lowercase hex digits.
pub(crate) fn hex_digest(digest: u64) -> String {
    format!("{digest:016x}")
}

/// value_digest(value)
/// --
///
/// The digest of an observation or action, as 16 hex digits: an episode's ``reset_digest``
/// is this of its first observation. See ``rlmesh._pycore.digests`` for what is hashed.
#[pyfunction]
pub fn value_digest(value: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(hex_digest(digest_of(value, &mut Keys::default())?))
}

/// `batch[k]`, or None when indexing raises an `Exception`.
fn row<'py>(batch: &Bound<'py, PyAny>, k: usize) -> PyResult<Bound<'py, PyAny>> {
    match batch.get_item(k) {
        Ok(row) => Ok(row),
        Err(err) if caught(batch.py(), &err) => Ok(batch.py().None().into_bound(batch.py())),
        Err(err) => Err(err),
    }
}

/// The digest of each of the `count` actions of a batch along a leading lane axis (an array,
/// or a dict or tuple of them), into `out`: each equals `digest_of` of the action its lane's
/// env receives.
pub(crate) fn batch_digests(
    batch: &Bound<'_, PyAny>,
    count: usize,
    keys: &mut Keys,
    out: &mut Vec<u64>,
) -> PyResult<()> {
    out.clear();
    match batch_rows(batch, count, keys, out) {
        Ok(()) => Ok(()),
        Err(err) if caught(batch.py(), &err) => {
            out.clear();
            for k in 0..count {
                out.push(digest_of(&row(batch, k)?, keys)?);
            }
            Ok(())
        }
        Err(err) => Err(err),
    }
}

/// `batch_digests` without its fallback: the Python core's `_batch`.
fn batch_rows(
    batch: &Bound<'_, PyAny>,
    count: usize,
    keys: &mut Keys,
    out: &mut Vec<u64>,
) -> PyResult<()> {
    if let Ok(dict) = batch.cast::<PyDict>() {
        let items = sorted_items(dict)?;
        out.extend(std::iter::repeat_n(
            absorb(DICT_SEED, items.len() as u64),
            count,
        ));
        let mut column = Vec::with_capacity(count);
        for (key, leaf) in &items {
            let key = text_digest(key, keys);
            column.clear();
            batch_rows(leaf, count, keys, &mut column)?;
            for (state, &leaf) in out.iter_mut().zip(&column) {
                *state = absorb(absorb(*state, key), leaf);
            }
        }
        return Ok(());
    }
    if let Ok(tuple) = batch.cast::<PyTuple>() {
        out.extend(std::iter::repeat_n(
            absorb(TUPLE_SEED, tuple.len() as u64),
            count,
        ));
        let mut column = Vec::with_capacity(count);
        for leaf in tuple.iter() {
            column.clear();
            batch_rows(&leaf, count, keys, &mut column)?;
            for (state, &leaf) in out.iter_mut().zip(&column) {
                *state = absorb(*state, leaf);
            }
        }
        return Ok(());
    }
    let array = match batch.cast::<PyUntypedArray>() {
        Ok(_) => canonical(batch)?,
        Err(_) => None,
    };
    let Some(array) = array.filter(|array| array.shape().first() == Some(&count)) else {
        for k in 0..count {
            out.push(digest_of(&row(batch, k)?, keys)?);
        }
        return Ok(());
    };
    let dtype = array.dtype();
    let prefix = leaf_prefix(dtype.kind(), dtype.itemsize(), &array.shape()[1..]);
    // SAFETY: as in `array_digest`.
    let bytes = unsafe { array_bytes(&array) };
    let size = bytes.len() / count.max(1);
    for k in 0..count {
        out.push(absorb(prefix, bulk(&bytes[k * size..(k + 1) * size], keys)));
    }
    Ok(())
}

/// One lane's running digests.
#[derive(Debug, Clone, Copy, Default)]
struct Lane {
    /// Its episode started and its first observation has not arrived yet.
    awaiting: bool,
    reset: Option<u64>,
    trajectory: u64,
    /// The digests of the step it is taking: its action's and its observation's.
    action: u64,
    observation: u64,
}

/// Each lane's running digests, kept by the `RoundRunner` (internal to it): an episode's
/// reset digest once its first observation arrives, and its trajectory as its steps are
/// recorded, started afresh with every episode. See the Python core's `LaneDigests`.
#[derive(Debug)]
pub(crate) struct LaneDigests {
    enabled: bool,
    keys: Keys,
    lanes: Vec<Lane>,
    /// Scratch: a round's action digests.
    actions: Vec<u64>,
}

impl LaneDigests {
    pub(crate) fn new(num_lanes: usize, enabled: bool) -> Self {
        LaneDigests {
            enabled,
            keys: Keys::default(),
            lanes: vec![Lane::default(); num_lanes],
            actions: Vec::new(),
        }
    }

    /// Episodes started on `lanes`: each awaits its first observation.
    pub(crate) fn begin(&mut self, lanes: &[i64]) {
        if !self.enabled {
            return;
        }
        for &lane in lanes {
            let held = &mut self.lanes[lane as usize];
            held.awaiting = true;
            held.reset = None;
        }
    }

    /// An episode started on `lane` with `observation` already there (a vector that restarts
    /// its lanes itself returned it with a step).
    pub(crate) fn begin_with(
        &mut self,
        lane: usize,
        observation: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        if !self.enabled {
            return Ok(());
        }
        let digest = digest_of(observation, &mut self.keys)?;
        self.first(lane, digest);
        Ok(())
    }

    fn first(&mut self, lane: usize, digest: u64) {
        self.lanes[lane] = Lane {
            awaiting: false,
            reset: Some(digest),
            trajectory: absorb(TRAJECTORY_SEED, digest),
            action: 0,
            observation: 0,
        };
    }

    /// An observation arrived for `lane`: its episode's first, or what the step it is taking
    /// returned (`running`); any other lane's is not hashed.
    pub(crate) fn observe(
        &mut self,
        lane: usize,
        observation: &Bound<'_, PyAny>,
        running: bool,
    ) -> PyResult<()> {
        if !self.enabled || !(self.lanes[lane].awaiting || running) {
            return Ok(());
        }
        let digest = digest_of(observation, &mut self.keys)?;
        if self.lanes[lane].awaiting {
            self.first(lane, digest);
        } else {
            self.lanes[lane].observation = digest;
        }
        Ok(())
    }

    /// What the step each of `lanes` (running, past their first observation) took returned.
    pub(crate) fn observe_steps(
        &mut self,
        lanes: &[i64],
        observations: &[Bound<'_, PyAny>],
    ) -> PyResult<()> {
        if !self.enabled {
            return Ok(());
        }
        for (&lane, observation) in lanes.iter().zip(observations) {
            self.lanes[lane as usize].observation = digest_of(observation, &mut self.keys)?;
        }
        Ok(())
    }

    /// The actions `[K, ...]` (or a dict or tuple of them) handed to `lanes`' envs.
    pub(crate) fn act(&mut self, lanes: &[i64], actions: &Bound<'_, PyAny>) -> PyResult<()> {
        if !self.enabled || lanes.is_empty() {
            return Ok(());
        }
        let mut digests = std::mem::take(&mut self.actions);
        let done = batch_digests(actions, lanes.len(), &mut self.keys, &mut digests);
        for (&lane, &digest) in lanes.iter().zip(&digests) {
            self.lanes[lane as usize].action = digest;
        }
        self.actions = digests;
        done
    }

    /// `lanes`' envs got int64 scalars of `values`: as rows of an int64 batch.
    pub(crate) fn act_integers(&mut self, lanes: &[i64], values: &[i64]) {
        if !self.enabled {
            return;
        }
        let prefix = leaf_prefix(b'i', 8, &[]);
        for (&lane, &value) in lanes.iter().zip(values) {
            let digest = absorb(prefix, bulk(&value.to_le_bytes(), &mut self.keys));
            self.lanes[lane as usize].action = digest;
        }
    }

    /// The step of `lanes` was recorded, with these rewards and the env's flags: fold each
    /// lane's action, observation, reward and flags into its trajectory.
    pub(crate) fn step(
        &mut self,
        lanes: &[i64],
        rewards: &[f64],
        terminated: &[bool],
        truncated: &[bool],
    ) {
        if !self.enabled {
            return;
        }
        for (k, &lane) in lanes.iter().enumerate() {
            let held = &mut self.lanes[lane as usize];
            let flags = u64::from(terminated[k]) | u64::from(truncated[k]) << 1;
            let state = absorb(absorb(held.trajectory, held.action), held.observation);
            held.trajectory = absorb(absorb(state, rewards[k].to_bits()), flags);
            held.action = 0;
            held.observation = 0;
        }
    }

    /// `(reset, trajectory)` of `lane`'s episode; None before its first observation (a reset
    /// that failed) and when disabled.
    pub(crate) fn episode(&self, lane: usize) -> (Option<u64>, Option<u64>) {
        let held = &self.lanes[lane];
        match held.reset {
            Some(reset) if self.enabled => (Some(reset), Some(held.trajectory)),
            _ => (None, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_pads_the_last_word_with_zero_bytes() {
        // So a value's length is hashed apart: a leaf's in its shape, a text's first.
        let mut keys = Keys::default();
        let short = bulk(&[1, 2, 3], &mut keys);
        assert_eq!(short, bulk(&[1, 2, 3, 0, 0, 0, 0, 0], &mut keys));
        assert_eq!(bulk(&[], &mut keys), 0);
        assert_ne!(
            text_digest(b"ab", &mut keys),
            text_digest(b"ab\0", &mut keys)
        );
    }

    #[test]
    fn every_word_and_its_position_count() {
        let mut keys = Keys::default();
        let words: Vec<u8> = (0..64).collect();
        let whole = bulk(&words, &mut keys);
        let mut changed = words.clone();
        changed[63] ^= 0x80;
        assert_ne!(whole, bulk(&changed, &mut keys));
        let mut swapped = words.clone();
        swapped[..8].copy_from_slice(&words[8..16]);
        swapped[8..16].copy_from_slice(&words[..8]);
        assert_ne!(whole, bulk(&swapped, &mut keys));
    }

    #[test]
    fn the_prefix_tells_dtypes_and_shapes_apart() {
        assert_ne!(leaf_prefix(b'f', 4, &[3]), leaf_prefix(b'f', 8, &[3]));
        assert_ne!(leaf_prefix(b'i', 8, &[]), leaf_prefix(b'u', 8, &[]));
        assert_ne!(leaf_prefix(b'f', 4, &[2, 3]), leaf_prefix(b'f', 4, &[3, 2]));
        assert_ne!(leaf_prefix(b'f', 4, &[6]), leaf_prefix(b'f', 4, &[6, 1]));
    }

    #[test]
    fn a_lane_s_episodes_never_mix() {
        let mut digests = LaneDigests::new(1, true);
        digests.first(0, 7);
        digests.act_integers(&[0], &[1]);
        digests.step(&[0], &[1.0], &[false], &[false]);
        let one_step = digests.episode(0);
        digests.first(0, 7);
        assert_eq!(
            digests.episode(0),
            (Some(7), Some(absorb(TRAJECTORY_SEED, 7)))
        );
        digests.act_integers(&[0], &[1]);
        digests.step(&[0], &[1.0], &[false], &[false]);
        assert_eq!(digests.episode(0), one_step);
        digests.begin(&[0]);
        assert_eq!(digests.episode(0), (None, None));
        let disabled = LaneDigests::new(1, false);
        assert_eq!(disabled.episode(0), (None, None));
    }
}
