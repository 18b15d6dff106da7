//! Temporal ensembling: each lane's action as the weighted average of every chunk that covers
//! its step.
//!
//! Mirrors `python/rlmesh/_pycore/ensembles.py` name for name; that file is the specification
//! (the weights, the buffer rules, the messages). Each weight is the C library's `exp` (as
//! Python's `math.exp`), and each element is accumulated in `f64` in the same order as the
//! Python core, one multiply and one add per chunk (Rust never fuses them), so the actions are
//! the same to the bit in both cores.

use std::collections::HashMap;

use numpy::{PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt};

use crate::args::{
    count_arg, i64_arg, lanes_arg, path_text, same_length, vector, ArgError, Dtype, LaneMarks,
};
use crate::chunks::{chunk_leaves, conformed, layout_of, unflattened, ChunkLeaf, LeafLayout};

pyo3::import_exception!(rlmesh.errors, ModelOutputError);

/// `m` as a float that is finite and not negative.
pub(crate) fn ensemble_rate(value: &Bound<'_, PyAny>) -> PyResult<f64> {
    let py = value.py();
    let numeric = !value.is_instance_of::<PyBool>()
        && (value.is_instance_of::<PyInt>()
            || value.is_instance_of::<PyFloat>()
            || value.is_instance(&py.import("numpy")?.getattr("integer")?)?
            || value.is_instance(&py.import("numpy")?.getattr("floating")?)?);
    if !numeric {
        return Err(PyValueError::new_err(format!(
            "m must be a number >= 0, got {}",
            value.get_type().name()?
        )));
    }
    let rate: f64 = py.get_type::<PyFloat>().call1((value,))?.extract()?;
    if !(rate.is_finite() && rate >= 0.0) {
        let text: String = PyFloat::new(py, rate).repr()?.extract()?;
        return Err(PyValueError::new_err(format!(
            "m must be a finite number >= 0, got {text}"
        )));
    }
    Ok(rate)
}

/// One chunk held for ensembling: the step it was predicted at, and per leaf its `H` actions
/// as `f64`, `[H, step_len]` row after row.
#[derive(Debug, Clone)]
struct Held {
    start: u64,
    horizon: usize,
    values: Vec<Vec<f64>>,
}

/// One lane's buffer, owned by `episode` while it holds chunks.
#[derive(Debug, Clone, Default)]
struct LaneBuffer {
    episode: Option<i64>,
    step: u64,
    pushed: bool,
    chunks: Vec<Held>,
}

/// Per-lane, per-episode buffers of predicted chunks, averaged into one action per step.
///
/// ``push(lanes [K], episode_ids [K], chunks [K, H, ...])`` adds row k as the chunk predicted
/// at lane ``lanes[k]``'s current step; ``pop(lanes [K], episode_ids [K])`` returns each lane's
/// ``exp(-m * i)``-weighted average (``i = 0`` the oldest chunk) of the chunks covering its step,
/// ``[K, ...]`` (or a dict of them); ``drop(episode_id)`` discards an ended episode's chunks.
/// See ``rlmesh._pycore.ensembles.TemporalEnsembles`` for the full contract; both cores behave
/// alike, to the bit.
///
/// Example:
///     >>> ensembles = TemporalEnsembles(num_lanes=1, m=0.0)
///     >>> ensembles.push([0], [7], np.array([[[0.0], [2.0], [4.0]]]))
///     >>> ensembles.pop([0], [7]).tolist()
///     [[0.0]]
#[pyclass(module = "rlmesh._core")]
pub struct TemporalEnsembles {
    m: f64,
    layout: Option<Vec<LeafLayout>>,
    lanes: Vec<LaneBuffer>,
    /// Which lane holds each episode's chunks: an episode lives on one lane.
    owners: HashMap<i64, usize>,
    marks: LaneMarks,
}

impl TemporalEnsembles {
    /// Discard episode `episode_id`'s chunks; how many there were.
    pub(crate) fn drop_episode(&mut self, episode_id: i64) -> usize {
        let Some(lane) = self.owners.remove(&episode_id) else {
            return 0;
        };
        let buffer = std::mem::take(&mut self.lanes[lane]);
        buffer.chunks.len()
    }

    /// Refuse a push to `lanes` for `episode_ids` (see the Python core's `push`).
    fn check_push(&mut self, lanes: &[i64], episode_ids: &[i64]) -> Result<(), ArgError> {
        same_length("episode_ids", episode_ids.len(), lanes.len())?;
        self.marks.check_lanes(lanes)?;
        let mut pushing: HashMap<i64, i64> = HashMap::with_capacity(lanes.len());
        for (&lane, &episode_id) in lanes.iter().zip(episode_ids) {
            let buffer = &self.lanes[lane as usize];
            if buffer.pushed {
                return Err(ArgError(format!(
                    "lane {lane} already has the chunk of step {} of episode {}: pop its action \
                     before pushing again",
                    buffer.step,
                    episode_text(buffer.episode)
                )));
            }
            if let Some(held) = buffer.episode {
                if held != episode_id {
                    return Err(ArgError(format!(
                        "lane {lane} holds chunks of episode {held}, not episode {episode_id}: \
                         drop an episode's chunks when it ends"
                    )));
                }
            }
            if let Some(earlier) = pushing.insert(episode_id, lane) {
                return Err(ArgError(format!(
                    "episode {episode_id} is given for lanes {earlier} and {lane}: an episode \
                     lives on one lane"
                )));
            }
            if let Some(&owner) = self.owners.get(&episode_id) {
                if owner != lane as usize {
                    return Err(ArgError(format!(
                        "episode {episode_id} already has chunks on lane {owner}: an episode \
                         lives on one lane"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The leaves' arrays in layout order; the first push sets the layout.
    fn conform<'py>(
        &mut self,
        py: Python<'py>,
        leaves: Vec<ChunkLeaf<'py>>,
    ) -> PyResult<Vec<Bound<'py, PyUntypedArray>>> {
        for leaf in &leaves {
            let dtype = leaf.array.dtype();
            if dtype.kind() != b'f' {
                return Err(ModelOutputError::new_err(format!(
                    "{} holds {dtype} actions: temporal ensembling averages actions, so every \
                     action leaf must hold floats (a Box space of floats)",
                    path_text(py, "action", &leaf.path)?
                )));
            }
        }
        let layout = self.layout.get_or_insert_with(|| layout_of(&leaves));
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
        self.check_push(lanes, ids)?;
        let (horizon, leaves) = chunk_leaves(chunks, Some(lanes.len() as u64))?;
        let arrays = self.conform(py, leaves)?;
        let layout = self.layout.as_ref().expect("conform sets the layout");
        // Each leaf once as C-ordered float64 (float32 and float16 widen exactly).
        let to_f64 = py.import("numpy")?.getattr("ascontiguousarray")?;
        let float64 = py.import("numpy")?.getattr("float64")?;
        let mut values: Vec<Vec<f64>> = Vec::with_capacity(arrays.len());
        for array in &arrays {
            let wide = to_f64.call1((array, &float64))?;
            values.push(
                wide.cast::<numpy::PyArrayDyn<f64>>()?
                    .readonly()
                    .as_slice()?
                    .to_vec(),
            );
        }
        for (k, (&lane, &episode_id)) in lanes.iter().zip(ids).enumerate() {
            let lane = lane as usize;
            let buffer = &mut self.lanes[lane];
            if buffer.episode.is_none() {
                buffer.episode = Some(episode_id);
                buffer.step = 0;
                self.owners.insert(episode_id, lane);
            }
            let rows = layout
                .iter()
                .zip(&values)
                .map(|(held, leaf)| {
                    let row = horizon * step_len(held);
                    leaf[k * row..(k + 1) * row].to_vec()
                })
                .collect();
            buffer.chunks.push(Held {
                start: buffer.step,
                horizon,
                values: rows,
            });
            buffer.pushed = true;
        }
        Ok(())
    }

    /// Refuse a pop of `lanes` for `episode_ids` unless each lane was pushed to at its step.
    fn check_pop(&mut self, lanes: &[i64], episode_ids: &[i64]) -> Result<(), ArgError> {
        same_length("episode_ids", episode_ids.len(), lanes.len())?;
        self.marks.check_lanes(lanes)?;
        for (&lane, &episode_id) in lanes.iter().zip(episode_ids) {
            let buffer = &self.lanes[lane as usize];
            if buffer.episode != Some(episode_id) {
                return Err(ArgError(format!(
                    "lane {lane} holds chunks of episode {}, not episode {episode_id}: push a \
                     chunk for the episode's step first, and drop an episode's chunks when it \
                     ends",
                    episode_text(buffer.episode)
                )));
            }
            if !buffer.pushed {
                return Err(ArgError(format!(
                    "lane {lane} has no chunk for step {} of episode {episode_id}: with temporal \
                     ensembling the model predicts at every step",
                    buffer.step
                )));
            }
        }
        Ok(())
    }

    /// `pop` with the lanes and episode ids already read.
    pub(crate) fn pop_lanes<'py>(
        &mut self,
        py: Python<'py>,
        lanes: &[i64],
        ids: &[i64],
    ) -> PyResult<Bound<'py, PyAny>> {
        self.check_pop(lanes, ids)?;
        let layout = self.layout.as_ref().expect("a lane was pushed to");
        let m = self.m;
        let mut outputs: Vec<Vec<f64>> = layout
            .iter()
            .map(|held| vec![0.0; lanes.len() * step_len(held)])
            .collect();
        let mut weights: Vec<f64> = Vec::new();
        for (row, &lane) in lanes.iter().enumerate() {
            let buffer = &mut self.lanes[lane as usize];
            let step = buffer.step;
            // The weights, and their sum in the Python core's order.
            weights.clear();
            weights.extend((0..buffer.chunks.len()).map(|i| (-m * i as f64).exp()));
            let total_weight = weights.iter().fold(0.0f64, |sum, &weight| sum + weight);
            for ((held, output), leaf) in layout.iter().zip(&mut outputs).zip(0..) {
                let len = step_len(held);
                let out = &mut output[row * len..(row + 1) * len];
                // Chunk by chunk, each element gains `weight * value` in the order i = 0, 1, ...
                for (chunk, &weight) in buffer.chunks.iter().zip(&weights) {
                    let at = (step - chunk.start) as usize * len;
                    for (slot, &value) in out.iter_mut().zip(&chunk.values[leaf][at..at + len]) {
                        *slot += weight * value;
                    }
                }
                for slot in out.iter_mut() {
                    *slot /= total_weight;
                }
            }
            buffer.step = step + 1;
            buffer.pushed = false;
            // A chunk of H actions predicted at step s covers steps s..s+H-1.
            buffer
                .chunks
                .retain(|chunk| chunk.start + chunk.horizon as u64 > step + 1);
        }
        let mut arrays = Vec::with_capacity(layout.len());
        for (held, values) in layout.iter().zip(outputs) {
            let mut shape = vec![lanes.len()];
            shape.extend_from_slice(&held.step_shape);
            let wide = PyArray1::from_vec(py, values).reshape(shape)?;
            // numpy's cast, as the Python core's `astype`: round to nearest, ties to even.
            arrays.push(
                wide.call_method1("astype", (held.descr.bind(py),))?
                    .cast_into::<PyUntypedArray>()?,
            );
        }
        unflattened(py, layout, arrays)
    }

    /// How many chunks each of `lanes` (all when None) holds.
    fn held_counts(&mut self, lanes: Option<&[i64]>) -> Result<Vec<i64>, ArgError> {
        match lanes {
            None => Ok(self.lanes.iter().map(|b| b.chunks.len() as i64).collect()),
            Some(lanes) => {
                self.marks.check_lanes(lanes)?;
                Ok(lanes
                    .iter()
                    .map(|&lane| self.lanes[lane as usize].chunks.len() as i64)
                    .collect())
            }
        }
    }
}

/// How many values one step of `held`'s leaf holds.
fn step_len(held: &LeafLayout) -> usize {
    held.step_shape.iter().product()
}

/// How a message names a buffer's episode: its id, or `None` as Python prints it.
fn episode_text(episode: Option<i64>) -> String {
    episode.map_or_else(|| "None".to_owned(), |id| id.to_string())
}

/// The Python face of the buffers.
#[pymethods]
impl TemporalEnsembles {
    #[new]
    pub(crate) fn py_new(num_lanes: &Bound<'_, PyAny>, m: &Bound<'_, PyAny>) -> PyResult<Self> {
        let num_lanes = count_arg(num_lanes, "num_lanes")?;
        let lanes = usize::try_from(num_lanes)
            .map_err(|_| PyValueError::new_err(format!("num_lanes is too large: {num_lanes}")))?;
        let m = ensemble_rate(m)?;
        Ok(TemporalEnsembles {
            m,
            layout: None,
            lanes: vec![LaneBuffer::default(); lanes],
            owners: HashMap::new(),
            marks: LaneMarks::new(lanes),
        })
    }

    /// The weights' rate: ``w_i = exp(-m * i)``, ``i = 0`` the oldest chunk.
    #[getter]
    fn m(&self) -> f64 {
        self.m
    }

    /// Add each lane's newest chunk: lane ``lanes[k]`` of episode ``episode_ids[k]`` gets row k.
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

    /// Each lane's action for its current step, the weighted average of the chunks covering it.
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

    /// Discard the chunks of episode ``episode_id``; return how many there were.
    #[pyo3(name = "drop")]
    fn py_drop(&mut self, episode_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        let episode_id = i64_arg(episode_id, "episode_id")?;
        Ok(self.drop_episode(episode_id))
    }

    /// How many chunks each of ``lanes`` (``[K]``, all by default) holds: int64.
    #[pyo3(name = "held", signature = (lanes=None))]
    pub(crate) fn py_held<'py>(
        &mut self,
        py: Python<'py>,
        lanes: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let lanes = lanes.map(lanes_arg).transpose()?;
        let lanes = lanes.as_ref().map(|lanes| lanes.as_slice()).transpose()?;
        Ok(PyArray1::from_vec(py, self.held_counts(lanes)?))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let held: usize = self.lanes.iter().map(|b| b.chunks.len()).sum();
        // The rate as Python prints a float.
        let m: String = PyFloat::new(py, self.m).repr()?.extract()?;
        Ok(format!(
            "TemporalEnsembles(num_lanes={}, m={m}, held={held})",
            self.lanes.len()
        ))
    }
}
