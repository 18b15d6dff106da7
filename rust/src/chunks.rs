//! Action chunks: checking what a chunked model returned, and the per-lane replay queues.
//!
//! Mirrors `python/rlmesh/_pycore/chunks.py` name for name; that file is the specification
//! (the chunk rules, the queue rules, the messages). Here no lane owns a Python object: the
//! queued actions of every lane live in one byte slab per leaf of the action, row `lane` holding
//! that lane's queue, and a lane is a cursor into its row. A push copies each lane's first
//! `min(H, execution_horizon)` actions into its row (so the queue owns its actions, as the
//! Python core's copies do); a pop allocates one output array per leaf and copies each lane's
//! next action into it with one `memcpy`.

use std::collections::HashMap;
use std::os::raw::{c_int, c_void};
use std::ptr;

use numpy::npyffi::{self, npy_intp, PY_ARRAY_API};
use numpy::{PyArray1, PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::args::{
    array_bytes, array_bytes_mut, count_arg, i64_arg, lanes_arg, path_text, same_length,
    shape_text, u64_arg, vector, ArgError, Dtype, LaneMarks,
};

pyo3::import_exception!(rlmesh.errors, ModelOutputError);

/// numpy dtype kinds an action may hold: bool, signed, unsigned, float. Anything else (object,
/// str, complex, structured) is not an action a Gymnasium space holds, and object arrays could
/// not be copied as plain bytes.
const ACTION_KINDS: &[u8] = b"biuf";

/// Where a leaf sits inside a dict action: `[]` for a plain array, `["arm"]`, `["a", "b"]`.
type Path = Vec<String>;

/// One leaf of a chunk: its path and its values as an array.
pub(crate) struct ChunkLeaf<'py> {
    pub(crate) path: Path,
    pub(crate) array: Bound<'py, PyUntypedArray>,
}

/// Append `value`'s leaves in dict order, depth first.
fn flatten<'py>(
    value: &Bound<'py, PyAny>,
    path: &mut Path,
    leaves: &mut Vec<ChunkLeaf<'py>>,
) -> PyResult<()> {
    let py = value.py();
    if let Ok(dict) = value.cast::<PyDict>() {
        if dict.is_empty() {
            return Err(ModelOutputError::new_err(format!(
                "{} is an empty dict: expected at least one action leaf",
                path_text(py, "action", path)?
            )));
        }
        for (key, item) in dict.iter() {
            let Ok(key) = key.cast::<PyString>() else {
                return Err(ModelOutputError::new_err(format!(
                    "{} has key {}: expected str keys",
                    path_text(py, "action", path)?,
                    key.repr()?
                )));
            };
            path.push(key.to_str()?.to_owned());
            flatten(&item, path, leaves)?;
            path.pop();
        }
        return Ok(());
    }
    let array = match value.cast::<PyUntypedArray>() {
        Ok(array) => array.clone(),
        Err(_) => py
            .import("numpy")?
            .getattr("asarray")?
            .call1((value,))?
            .cast_into::<PyUntypedArray>()?,
    };
    leaves.push(ChunkLeaf {
        path: path.clone(),
        array,
    });
    Ok(())
}

/// The horizon `H` of `chunk` and its leaves; see `split_chunk` for the rules.
pub(crate) fn chunk_leaves<'py>(
    chunk: &Bound<'py, PyAny>,
    num_lanes: Option<u64>,
) -> PyResult<(usize, Vec<ChunkLeaf<'py>>)> {
    let py = chunk.py();
    let mut leaves = Vec::new();
    flatten(chunk, &mut Vec::new(), &mut leaves)?;
    // The axis that holds H: 0 for one lane's chunk, 1 after the lane axis of a batch.
    let axis = usize::from(num_lanes.is_some());
    let mut first: Option<(&ChunkLeaf<'py>, usize)> = None;
    for leaf in &leaves {
        let shape = leaf.array.shape();
        let dtype = leaf.array.dtype();
        if !ACTION_KINDS.contains(&dtype.kind()) {
            return Err(ModelOutputError::new_err(format!(
                "{} has dtype {dtype}: expected booleans, integers or floats",
                path_text(py, "action", &leaf.path)?
            )));
        }
        if shape.len() <= axis {
            let expected = match num_lanes {
                None => "[H, ...], a chunk of H actions along the leading axis".to_owned(),
                Some(n) => format!("[N, H, ...], a chunk of H actions for each of N = {n} lanes"),
            };
            return Err(ModelOutputError::new_err(format!(
                "{} has shape {}: expected {expected}",
                path_text(py, "action", &leaf.path)?,
                shape_text(shape)
            )));
        }
        if let Some(n) = num_lanes {
            if shape[0] as u64 != n {
                return Err(ModelOutputError::new_err(format!(
                    "{} has shape {}: expected [N, H, ...] with N = {n} lanes, got N = {}",
                    path_text(py, "action", &leaf.path)?,
                    shape_text(shape),
                    shape[0]
                )));
            }
        }
        let horizon = shape[axis];
        if horizon == 0 {
            return Err(ModelOutputError::new_err(format!(
                "{} is an empty chunk: shape {} holds H = 0 actions, expected at least 1",
                path_text(py, "action", &leaf.path)?,
                shape_text(shape)
            )));
        }
        match first {
            None => first = Some((leaf, horizon)),
            Some((reference, expected)) if horizon != expected => {
                return Err(ModelOutputError::new_err(format!(
                    "{} has H = {horizon} actions but {} has H = {expected}: every leaf of a \
                     chunk must share the horizon H",
                    path_text(py, "action", &leaf.path)?,
                    path_text(py, "action", &reference.path)?
                )));
            }
            Some(_) => {}
        }
    }
    let horizon = first.map_or(0, |(_, horizon)| horizon);
    Ok((horizon, leaves))
}

/// Check a chunk a model returned and give its horizon ``H``: how many actions it holds.
///
/// ``chunk`` is one lane's ``[H, *action_shape]`` array-like, or a (nested) dict of them whose
/// leaves share ``H``; with ``num_lanes=N`` it is a batch whose every leaf is ``[N, H, ...]``.
/// Raises ``ModelOutputError`` for an empty chunk, leaves that disagree on ``H``, a leaf with
/// too few dimensions or the wrong ``N``. See ``rlmesh._pycore.chunks.split_chunk``.
#[pyfunction]
#[pyo3(signature = (chunk, num_lanes=None))]
pub fn split_chunk(
    chunk: &Bound<'_, PyAny>,
    num_lanes: Option<&Bound<'_, PyAny>>,
) -> PyResult<usize> {
    let num_lanes = num_lanes
        .map(|value| u64_arg(value, "num_lanes"))
        .transpose()?;
    Ok(chunk_leaves(chunk, num_lanes)?.0)
}

/// One lane's queue: steps `next..end` of its row, owned by `episode_id` while not empty.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct LaneQueue {
    episode_id: i64,
    next: usize,
    end: usize,
}

impl LaneQueue {
    fn len(&self) -> usize {
        self.end - self.next
    }
}

/// The replay queues without Python: every rule, actions as plain bytes.
///
/// Leaf `i` of the action is `step_bytes[i]` bytes per step; `slabs[i]` holds `capacity` steps
/// per lane, lane after lane. The capacity grows to the longest chunk kept so far (at most
/// `execution_horizon`), so a huge horizon costs nothing until a model returns long chunks.
#[derive(Debug, Clone)]
pub struct ReplayStore {
    execution_horizon: usize,
    capacity: usize,
    step_bytes: Vec<usize>,
    slabs: Vec<Vec<u8>>,
    lanes: Vec<LaneQueue>,
    /// Which lane holds each episode's queue: an episode lives on one lane.
    owners: HashMap<i64, usize>,
    marks: LaneMarks,
}

impl ReplayStore {
    pub fn new(num_lanes: usize, execution_horizon: usize) -> Self {
        ReplayStore {
            execution_horizon,
            capacity: 0,
            step_bytes: Vec::new(),
            slabs: Vec::new(),
            lanes: vec![LaneQueue::default(); num_lanes],
            owners: HashMap::new(),
            marks: LaneMarks::new(num_lanes),
        }
    }

    /// Fix the action layout: one leaf per entry, each `bytes` long per step.
    pub fn set_step_bytes(&mut self, step_bytes: Vec<usize>) {
        self.slabs = vec![Vec::new(); step_bytes.len()];
        self.step_bytes = step_bytes;
        self.capacity = 0;
    }

    /// Refuse a push to `lanes` for `episode_ids` unless every lane's queue is empty and every
    /// episode is new to the queues.
    pub fn check_push(&mut self, lanes: &[i64], episode_ids: &[i64]) -> Result<(), ArgError> {
        same_length("episode_ids", episode_ids.len(), lanes.len())?;
        self.marks.check_lanes(lanes)?;
        let mut pushing: HashMap<i64, i64> = HashMap::with_capacity(lanes.len());
        for (&lane, &episode_id) in lanes.iter().zip(episode_ids) {
            let queue = &self.lanes[lane as usize];
            if queue.len() > 0 {
                return Err(ArgError(format!(
                    "lane {lane} still holds {} queued actions of episode {}: push only to lanes \
                     whose queue is empty (lanes_needing_predict)",
                    queue.len(),
                    queue.episode_id
                )));
            }
            if let Some(earlier) = pushing.insert(episode_id, lane) {
                return Err(ArgError(format!(
                    "episode {episode_id} is given for lanes {earlier} and {lane}: an episode \
                     lives on one lane"
                )));
            }
            if let Some(owner) = self.owners.get(&episode_id) {
                return Err(ArgError(format!(
                    "episode {episode_id} already has queued actions on lane {owner}: an \
                     episode lives on one lane"
                )));
            }
        }
        Ok(())
    }

    /// Make every lane's row hold at least `steps` steps, keeping what is queued.
    fn reserve(&mut self, steps: usize) {
        if steps <= self.capacity {
            return;
        }
        let num_lanes = self.lanes.len();
        for (slab, &bytes) in self.slabs.iter_mut().zip(&self.step_bytes) {
            let mut grown = vec![0u8; num_lanes * steps * bytes];
            let (old_row, new_row) = (self.capacity * bytes, steps * bytes);
            for lane in 0..num_lanes {
                grown[lane * new_row..lane * new_row + old_row]
                    .copy_from_slice(&slab[lane * old_row..(lane + 1) * old_row]);
            }
            *slab = grown;
        }
        self.capacity = steps;
    }

    /// Queue row `k` of a checked batch on `lanes[k]` for `episode_ids[k]`.
    ///
    /// `sources[i]` is leaf `i` of the batch as C-ordered bytes `[K, horizon, step]`; each lane
    /// keeps its first `min(horizon, execution_horizon)` steps. Call `check_push` first.
    pub fn push(&mut self, lanes: &[i64], episode_ids: &[i64], horizon: usize, sources: &[&[u8]]) {
        let kept = horizon.min(self.execution_horizon);
        self.reserve(kept);
        for ((slab, &bytes), source) in self.slabs.iter_mut().zip(&self.step_bytes).zip(sources) {
            let (row, source_row, kept_bytes) =
                (self.capacity * bytes, horizon * bytes, kept * bytes);
            for (k, &lane) in lanes.iter().enumerate() {
                let start = lane as usize * row;
                slab[start..start + kept_bytes]
                    .copy_from_slice(&source[k * source_row..k * source_row + kept_bytes]);
            }
        }
        for (&lane, &episode_id) in lanes.iter().zip(episode_ids) {
            self.lanes[lane as usize] = LaneQueue {
                episode_id,
                next: 0,
                end: kept,
            };
            self.owners.insert(episode_id, lane as usize);
        }
    }

    /// Refuse a pop of `lanes` for `episode_ids` unless each lane has an action of that episode.
    pub fn check_pop(&mut self, lanes: &[i64], episode_ids: &[i64]) -> Result<(), ArgError> {
        same_length("episode_ids", episode_ids.len(), lanes.len())?;
        self.marks.check_lanes(lanes)?;
        for (&lane, &episode_id) in lanes.iter().zip(episode_ids) {
            let queue = &self.lanes[lane as usize];
            if queue.len() == 0 {
                return Err(ArgError(format!(
                    "lane {lane} has no queued action for episode {episode_id}: call the model \
                     for lanes_needing_predict first"
                )));
            }
            if queue.episode_id != episode_id {
                return Err(ArgError(format!(
                    "lane {lane} holds queued actions of episode {}, not episode {episode_id}: \
                     drop an episode's queue when it ends",
                    queue.episode_id
                )));
            }
        }
        Ok(())
    }

    /// Move each lane's next action into row `k` of `outputs[i]` (leaf `i`, C-ordered bytes
    /// `[K, step]`). Call `check_pop` first.
    pub fn pop_into(&mut self, lanes: &[i64], outputs: &mut [&mut [u8]]) {
        for ((slab, &bytes), output) in self.slabs.iter().zip(&self.step_bytes).zip(outputs) {
            let row = self.capacity * bytes;
            for (k, &lane) in lanes.iter().enumerate() {
                let start = lane as usize * row + self.lanes[lane as usize].next * bytes;
                output[k * bytes..(k + 1) * bytes].copy_from_slice(&slab[start..start + bytes]);
            }
        }
        for &lane in lanes {
            let queue = &mut self.lanes[lane as usize];
            queue.next += 1;
            if queue.next == queue.end {
                self.release(lane as usize);
            }
        }
    }

    /// Empty `lane`'s queue and forget its owner.
    fn release(&mut self, lane: usize) {
        // An empty queue's episode_id means nothing: only a lane that owns an episode frees it.
        let queue = &mut self.lanes[lane];
        if self.owners.get(&queue.episode_id) == Some(&lane) {
            self.owners.remove(&queue.episode_id);
        }
        *queue = LaneQueue::default();
    }

    /// Discard episode `episode_id`'s queued actions; return how many there were.
    pub fn drop_episode(&mut self, episode_id: i64) -> usize {
        match self.owners.get(&episode_id) {
            None => 0,
            Some(&lane) => {
                let discarded = self.lanes[lane].len();
                self.release(lane);
                discarded
            }
        }
    }

    /// `lanes`, checked, or every lane when None.
    fn checked_lanes(&mut self, lanes: Option<&[i64]>) -> Result<Vec<i64>, ArgError> {
        match lanes {
            None => Ok((0..self.lanes.len() as i64).collect()),
            Some(lanes) => {
                self.marks.check_lanes(lanes)?;
                Ok(lanes.to_vec())
            }
        }
    }

    /// Of `lanes` (every lane when None), those whose queue is empty, in order.
    pub fn lanes_needing_predict(&mut self, lanes: Option<&[i64]>) -> Result<Vec<i64>, ArgError> {
        let mut lanes = self.checked_lanes(lanes)?;
        lanes.retain(|&lane| self.lanes[lane as usize].len() == 0);
        Ok(lanes)
    }

    /// How many actions each of `lanes` (every lane when None) has queued.
    pub fn queued(&mut self, lanes: Option<&[i64]>) -> Result<Vec<i64>, ArgError> {
        let lanes = self.checked_lanes(lanes)?;
        Ok(lanes
            .iter()
            .map(|&lane| self.lanes[lane as usize].len() as i64)
            .collect())
    }

    fn total_queued(&self) -> usize {
        self.lanes.iter().map(LaneQueue::len).sum()
    }
}

/// One leaf of the action layout, fixed by the first push.
#[derive(Debug)]
pub(crate) struct LeafLayout {
    pub(crate) path: Path,
    pub(crate) step_shape: Vec<usize>,
    pub(crate) descr: Py<PyArrayDescr>,
}

/// The action layout a batch of chunks `[K, H, ...]` sets: each leaf's path, per-step shape
/// and dtype, in the batch's leaf order.
pub(crate) fn layout_of(leaves: &[ChunkLeaf<'_>]) -> Vec<LeafLayout> {
    leaves
        .iter()
        .map(|leaf| LeafLayout {
            path: leaf.path.clone(),
            step_shape: leaf.array.shape()[2..].to_vec(),
            descr: leaf.array.dtype().unbind(),
        })
        .collect()
}

/// The arrays of `leaves` in `layout`'s order; `ValueError` for other leaves than the layout's,
/// or a leaf of another per-step shape or dtype.
pub(crate) fn conformed<'py>(
    py: Python<'py>,
    layout: &[LeafLayout],
    leaves: Vec<ChunkLeaf<'py>>,
) -> PyResult<Vec<Bound<'py, PyUntypedArray>>> {
    let same_leaves = leaves.len() == layout.len()
        && layout
            .iter()
            .all(|held| leaves.iter().any(|leaf| leaf.path == held.path));
    if !same_leaves {
        let names = |paths: Vec<&Path>| -> PyResult<String> {
            let texts: Vec<String> = paths
                .into_iter()
                .map(|path| path_text(py, "action", path))
                .collect::<PyResult<_>>()?;
            Ok(texts.join(", "))
        };
        return Err(PyValueError::new_err(format!(
            "chunks hold leaves [{}] but earlier pushes held [{}]",
            names(leaves.iter().map(|leaf| &leaf.path).collect())?,
            names(layout.iter().map(|held| &held.path).collect())?
        )));
    }
    let mut arrays = Vec::with_capacity(layout.len());
    for held in layout {
        let leaf = leaves
            .iter()
            .find(|leaf| leaf.path == held.path)
            .expect("the same leaves were checked above");
        let step_shape = &leaf.array.shape()[2..];
        let dtype = leaf.array.dtype();
        let descr = held.descr.bind(py);
        if step_shape != held.step_shape.as_slice() || !dtype.is_equiv_to(descr) {
            return Err(PyValueError::new_err(format!(
                "{} holds {dtype} actions of shape {} but earlier pushes held {descr} actions of \
                 shape {}",
                path_text(py, "action", &held.path)?,
                shape_text(step_shape),
                shape_text(&held.step_shape)
            )));
        }
        arrays.push(leaf.array.clone());
    }
    Ok(arrays)
}

/// One output array per leaf of `layout`, as the action it is: the lone array of a plain
/// action, or the leaves back in their dicts (keys in the order the first push gave them).
pub(crate) fn unflattened<'py>(
    py: Python<'py>,
    layout: &[LeafLayout],
    mut outputs: Vec<Bound<'py, PyUntypedArray>>,
) -> PyResult<Bound<'py, PyAny>> {
    if layout.len() == 1 && layout[0].path.is_empty() {
        return Ok(outputs.swap_remove(0).into_any());
    }
    let root = PyDict::new(py);
    for (held, output) in layout.iter().zip(outputs) {
        let (last, parents) = held.path.split_last().expect("a dict leaf has a key");
        let mut node = root.clone();
        for key in parents {
            node = match node.get_item(key)? {
                Some(child) => child.cast_into::<PyDict>()?,
                None => {
                    let child = PyDict::new(py);
                    node.set_item(key, &child)?;
                    child
                }
            };
        }
        node.set_item(last, output)?;
    }
    Ok(root.into_any())
}

/// A new, uninitialised C-ordered array of `descr` and `shape`.
pub(crate) fn empty_array<'py>(
    py: Python<'py>,
    descr: &Bound<'py, PyArrayDescr>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyUntypedArray>> {
    // SAFETY: null data asks numpy to allocate the array's memory itself.
    unsafe { array_over(py, descr, shape, ptr::null_mut(), 0) }
}

/// A new C-ordered array of `descr` and `shape` over `data` (with `flags`), or, for null
/// `data`, over memory numpy allocates.
///
/// # Safety
/// A non-null `data` must hold the array's bytes, suitably aligned, for as long as the array
/// lives (the caller makes the owner its base).
pub(crate) unsafe fn array_over<'py>(
    py: Python<'py>,
    descr: &Bound<'py, PyArrayDescr>,
    shape: &[usize],
    data: *mut c_void,
    flags: c_int,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let mut dims: Vec<npy_intp> = shape.iter().map(|&size| size as npy_intp).collect();
    // SAFETY: PyArray_NewFromDescr steals the descriptor reference `into_dtype_ptr` hands over;
    // `dims` outlives the call; null strides ask for a C-ordered array; `data` is the caller's.
    unsafe {
        let array = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, npyffi::NpyTypes::PyArray_Type),
            descr.clone().into_dtype_ptr(),
            dims.len() as c_int,
            dims.as_mut_ptr(),
            ptr::null_mut(),
            data,
            flags,
            ptr::null_mut(),
        );
        Ok(Bound::from_owned_ptr_or_err(py, array)?.cast_into_unchecked())
    }
}

/// Per-lane replay queues of chunked actions.
///
/// ``push(lanes [K], episode_ids [K], chunks [K, H, ...])`` queues the first
/// ``min(H, execution_horizon)`` actions of row k on lane ``lanes[k]``, owned by that episode;
/// ``pop(lanes [K], episode_ids [K])`` returns one action per lane, ``[K, ...]`` (or a dict of
/// them); ``drop(episode_id)`` discards an ended episode's queue. See
/// ``rlmesh._pycore.chunks.ChunkQueues`` for the full contract; both cores behave alike.
///
/// Example:
///     >>> queues = ChunkQueues(num_lanes=2, execution_horizon=3)
///     >>> chunk = np.arange(2 * 4 * 1, dtype=np.float32).reshape(2, 4, 1)  # [N=2, H=4, 1]
///     >>> queues.push([0, 1], [10, 11], chunk)  # keeps the first 3 of 4 actions per lane
///     >>> queues.pop([0, 1], [10, 11]).tolist()
///     [[0.0], [4.0]]
///     >>> queues.drop(11), queues.lanes_needing_predict().tolist()
///     (2, [1])
#[pyclass(module = "rlmesh._core")]
pub struct ChunkQueues {
    num_lanes: usize,
    execution_horizon: u64,
    layout: Option<Vec<LeafLayout>>,
    store: ReplayStore,
}

impl ChunkQueues {
    /// Discard episode `episode_id`'s queued actions.
    pub(crate) fn drop_episode(&mut self, episode_id: i64) {
        self.store.drop_episode(episode_id);
    }

    /// Of `lanes`, those whose queue is empty, in order.
    pub(crate) fn needing_predict(&mut self, lanes: &[i64]) -> Result<Vec<i64>, ArgError> {
        self.store.lanes_needing_predict(Some(lanes))
    }

    /// The leaves' arrays in layout order; the first push sets the layout.
    fn conform<'py>(
        &mut self,
        py: Python<'py>,
        leaves: Vec<ChunkLeaf<'py>>,
    ) -> PyResult<Vec<Bound<'py, PyUntypedArray>>> {
        let layout = match &self.layout {
            Some(layout) => layout,
            None => {
                let layout = layout_of(&leaves);
                let step_bytes = layout
                    .iter()
                    .map(|held| {
                        held.descr.bind(py).itemsize() * held.step_shape.iter().product::<usize>()
                    })
                    .collect();
                self.store.set_step_bytes(step_bytes);
                self.layout.insert(layout)
            }
        };
        conformed(py, layout, leaves)
    }

    /// `push` with the lanes and episode ids already read.
    pub(crate) fn push_lanes(
        &mut self,
        py: Python<'_>,
        lanes: &[i64],
        ids: &[i64],
        chunks: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.store.check_push(lanes, ids)?;
        let (horizon, leaves) = chunk_leaves(chunks, Some(lanes.len() as u64))?;
        let mut arrays = self.conform(py, leaves)?;
        // Copy from C-ordered bytes; a strided leaf is made contiguous once, here.
        for array in &mut arrays {
            if !array.is_c_contiguous() {
                *array = py
                    .import("numpy")?
                    .getattr("ascontiguousarray")?
                    .call1((&*array,))?
                    .cast_into::<PyUntypedArray>()?;
            }
        }
        // SAFETY: the arrays stay alive and C-contiguous here, and no Python code runs while
        // the slices are read.
        let sources: Vec<&[u8]> = arrays
            .iter()
            .map(|array| unsafe { array_bytes(array) })
            .collect();
        self.store.push(lanes, ids, horizon, &sources);
        Ok(())
    }

    /// `pop` with the lanes and episode ids already read.
    pub(crate) fn pop_lanes<'py>(
        &mut self,
        py: Python<'py>,
        lanes: &[i64],
        ids: &[i64],
    ) -> PyResult<Bound<'py, PyAny>> {
        self.store.check_pop(lanes, ids)?;
        let Some(layout) = &self.layout else {
            return Err(PyValueError::new_err(
                "nothing was pushed yet: ChunkQueues learns the action layout from the first push",
            ));
        };
        let mut outputs = Vec::with_capacity(layout.len());
        let mut shape = Vec::new();
        for held in layout {
            shape.clear();
            shape.push(lanes.len());
            shape.extend_from_slice(&held.step_shape);
            outputs.push(empty_array(py, held.descr.bind(py), &shape)?);
        }
        {
            // SAFETY: the outputs are new arrays nobody else sees yet.
            let mut rows: Vec<&mut [u8]> = outputs
                .iter_mut()
                .map(|output| unsafe { array_bytes_mut(output) })
                .collect();
            self.store.pop_into(lanes, &mut rows);
        }
        unflattened(py, layout, outputs)
    }
}

/// The Python face of the queues: argument and array conversion around `ReplayStore`.
#[pymethods]
impl ChunkQueues {
    #[new]
    pub(crate) fn py_new(
        num_lanes: &Bound<'_, PyAny>,
        execution_horizon: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let num_lanes = count_arg(num_lanes, "num_lanes")?;
        let execution_horizon = count_arg(execution_horizon, "execution_horizon")?;
        let lanes = usize::try_from(num_lanes)
            .map_err(|_| PyValueError::new_err(format!("num_lanes is too large: {num_lanes}")))?;
        Ok(ChunkQueues {
            num_lanes: lanes,
            execution_horizon,
            layout: None,
            // A chunk keeps at most min(H, execution_horizon) actions, and H fits a usize.
            store: ReplayStore::new(
                lanes,
                usize::try_from(execution_horizon).unwrap_or(usize::MAX),
            ),
        })
    }

    /// The most actions of one chunk a lane replays before the model is asked again.
    #[getter]
    pub(crate) fn execution_horizon(&self) -> u64 {
        self.execution_horizon
    }

    /// Queue a batch of chunks: lane ``lanes[k]`` of episode ``episode_ids[k]`` gets row k.
    fn push(
        &mut self,
        py: Python<'_>,
        lanes: &Bound<'_, PyAny>,
        episode_ids: &Bound<'_, PyAny>,
        chunks: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let lanes = lanes_arg(lanes)?;
        let ids = vector::<i64>(episode_ids, Dtype::Int64, "episode_ids")?;
        self.push_lanes(py, lanes.as_slice()?, ids.as_slice()?, chunks)
    }

    /// Take the next action of each lane's queue: one env step's actions for ``lanes``.
    fn pop<'py>(
        &mut self,
        py: Python<'py>,
        lanes: &Bound<'py, PyAny>,
        episode_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let lanes = lanes_arg(lanes)?;
        let ids = vector::<i64>(episode_ids, Dtype::Int64, "episode_ids")?;
        self.pop_lanes(py, lanes.as_slice()?, ids.as_slice()?)
    }
    /// Discard the queued actions of episode ``episode_id``; return how many there were.
    #[pyo3(name = "drop")]
    fn py_drop(&mut self, episode_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        let episode_id = i64_arg(episode_id, "episode_id")?;
        Ok(self.store.drop_episode(episode_id))
    }

    /// Of ``lanes`` (``[K]``, all lanes by default), those whose queue is empty, in order.
    #[pyo3(name = "lanes_needing_predict", signature = (lanes=None))]
    fn py_lanes_needing_predict<'py>(
        &mut self,
        py: Python<'py>,
        lanes: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let lanes = lanes.map(lanes_arg).transpose()?;
        let lanes = lanes.as_ref().map(|lanes| lanes.as_slice()).transpose()?;
        Ok(PyArray1::from_vec(
            py,
            self.store.lanes_needing_predict(lanes)?,
        ))
    }

    /// How many actions each of ``lanes`` (``[K]``, all by default) has queued: int64.
    #[pyo3(name = "queued", signature = (lanes=None))]
    pub(crate) fn py_queued<'py>(
        &mut self,
        py: Python<'py>,
        lanes: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let lanes = lanes.map(lanes_arg).transpose()?;
        let lanes = lanes.as_ref().map(|lanes| lanes.as_slice()).transpose()?;
        Ok(PyArray1::from_vec(py, self.store.queued(lanes)?))
    }

    fn __repr__(&self) -> String {
        format!(
            "ChunkQueues(num_lanes={}, execution_horizon={}, queued={})",
            self.num_lanes,
            self.execution_horizon,
            self.store.total_queued()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store of `num_lanes` lanes with one leaf of 1-byte steps.
    fn store(num_lanes: usize, execution_horizon: usize) -> ReplayStore {
        let mut store = ReplayStore::new(num_lanes, execution_horizon);
        store.set_step_bytes(vec![1]);
        store
    }

    /// Push chunk rows `rows` (one byte per step) to `lanes` for `ids`.
    fn push(store: &mut ReplayStore, lanes: &[i64], ids: &[i64], rows: &[&[u8]]) {
        store.check_push(lanes, ids).unwrap();
        let horizon = rows[0].len();
        let bytes: Vec<u8> = rows.iter().flat_map(|row| row.iter().copied()).collect();
        store.push(lanes, ids, horizon, &[&bytes]);
    }

    fn pop(store: &mut ReplayStore, lanes: &[i64], ids: &[i64]) -> Vec<u8> {
        store.check_pop(lanes, ids).unwrap();
        let mut out = vec![0u8; lanes.len()];
        store.pop_into(lanes, &mut [&mut out]);
        out
    }

    #[test]
    fn chunks_are_truncated_to_the_horizon_and_popped_in_order() {
        let mut store = store(2, 3);
        push(
            &mut store,
            &[1, 0],
            &[7, 8],
            &[&[1, 2, 3, 4], &[5, 6, 7, 8]],
        );
        assert_eq!(store.queued(None).unwrap(), vec![3, 3]);
        assert_eq!(pop(&mut store, &[0, 1], &[8, 7]), vec![5, 1]);
        assert_eq!(pop(&mut store, &[1], &[7]), vec![2]);
        assert_eq!(pop(&mut store, &[1, 0], &[7, 8]), vec![3, 6]);
        assert_eq!(store.lanes_needing_predict(None).unwrap(), vec![1]);
        assert_eq!(pop(&mut store, &[0], &[8]), vec![7]);
        assert_eq!(
            store.lanes_needing_predict(Some(&[1, 0])).unwrap(),
            vec![1, 0]
        );
        assert!(store.owners.is_empty());
    }

    #[test]
    fn rows_grow_for_longer_chunks_without_losing_queued_actions() {
        let mut store = store(2, 10);
        push(&mut store, &[0], &[1], &[&[1, 2]]);
        push(&mut store, &[1], &[2], &[&[3, 4, 5, 6, 7]]);
        assert_eq!(store.capacity, 5);
        assert_eq!(pop(&mut store, &[0, 1], &[1, 2]), vec![1, 3]);
        assert_eq!(pop(&mut store, &[0, 1], &[1, 2]), vec![2, 4]);
        assert_eq!(store.queued(None).unwrap(), vec![0, 3]);
    }

    #[test]
    fn dropping_an_episode_touches_only_its_lane() {
        let mut store = store(3, 4);
        push(
            &mut store,
            &[0, 1, 2],
            &[10, 11, 12],
            &[&[1, 2], &[3, 4], &[5, 6]],
        );
        assert_eq!(store.drop_episode(11), 2);
        assert_eq!(store.drop_episode(11), 0);
        assert_eq!(store.queued(None).unwrap(), vec![2, 0, 2]);
        push(&mut store, &[1], &[13], &[&[9]]);
        assert_eq!(pop(&mut store, &[0, 1, 2], &[10, 13, 12]), vec![1, 9, 5]);
        assert_eq!(store.drop_episode(12), 1);
        assert_eq!(store.drop_episode(10), 1);
        assert_eq!(store.lanes_needing_predict(None).unwrap(), vec![0, 1, 2]);
        assert!(store.owners.is_empty());
    }

    #[test]
    fn bad_pushes_and_pops_are_refused_without_changing_anything() {
        let mut store = store(2, 4);
        push(&mut store, &[0], &[5], &[&[1, 2]]);
        let before = format!("{:?}", (&store.lanes, &store.slabs));
        let push_err = |store: &mut ReplayStore, lanes: &[i64], ids: &[i64]| {
            store.check_push(lanes, ids).unwrap_err().0
        };
        assert_eq!(
            push_err(&mut store, &[1, 0], &[6, 7]),
            "lane 0 still holds 2 queued actions of episode 5: push only to lanes whose queue \
             is empty (lanes_needing_predict)"
        );
        assert_eq!(
            push_err(&mut store, &[1], &[5]),
            "episode 5 already has queued actions on lane 0: an episode lives on one lane"
        );
        assert_eq!(
            push_err(&mut store, &[2], &[6]),
            "lane 2 is out of range: this route has lanes 0..1"
        );
        assert_eq!(
            push_err(&mut store, &[1], &[]),
            "episode_ids has 0 entries but lanes has 1"
        );
        assert_eq!(
            store.check_pop(&[0, 1], &[5, 6]).unwrap_err().0,
            "lane 1 has no queued action for episode 6: call the model for lanes_needing_predict \
             first"
        );
        assert_eq!(
            store.check_pop(&[0], &[4]).unwrap_err().0,
            "lane 0 holds queued actions of episode 5, not episode 4: drop an episode's queue \
             when it ends"
        );
        assert_eq!(format!("{:?}", (&store.lanes, &store.slabs)), before);
        let mut fresh = self::store(3, 2);
        assert_eq!(
            fresh.check_push(&[0, 2], &[9, 9]).unwrap_err().0,
            "episode 9 is given for lanes 0 and 2: an episode lives on one lane"
        );
    }

    #[test]
    fn shapes_print_like_python_tuples() {
        assert_eq!(shape_text(&[]), "()");
        assert_eq!(shape_text(&[7]), "(7,)");
        assert_eq!(shape_text(&[8, 7, 2]), "(8, 7, 2)");
    }
}
