//! Observation assembly: each lane's raw observation -> the model's input, fused across lanes.
//!
//! Mirrors `python/rlmesh/_pycore/assembly.py` name for name; that file is the specification.
//! Here every array leaf is written straight into one contiguous output array per leaf: a
//! frame is copied once into its episode's window, and the window once into the output, with
//! no per-lane Python objects. Only reading the lanes' raw observations (and casting a source
//! whose dtype differs from the leaf's) goes through Python.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyIndexError, PyKeyError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString};

use crate::args::{
    array_bytes, array_bytes_mut, path_text, same_length, shape_text, vector, Dtype,
};
use crate::chunks::empty_array;

pyo3::import_exception!(rlmesh.errors, ObservationError);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Array,
    Text,
    Custom,
}

/// `x * scale + offset` in the leaf's float dtype (multiply, round, add, round: as numpy).
#[derive(Debug, Clone, Copy)]
enum Affine {
    Identity,
    F32(f32, f32),
    F64(f64, f64),
}

/// One compiled `LeafPlan`, read once from its Python attributes.
struct Leaf {
    slot: Vec<String>,
    kind: Kind,
    label: String,
    sources: Vec<Vec<String>>,
    source_shapes: Vec<Vec<usize>>,
    transpose: Option<Vec<usize>>,
    dtype: Py<PyArrayDescr>,
    itemsize: usize,
    affine: Affine,
    stack: usize,
    frame_shape: Vec<usize>,
    frame_bytes: usize,
    func: Option<Py<PyAny>>,
}

/// The last `stack` frames of one episode, as one byte buffer of `stack` slots.
struct Window {
    frames: Vec<u8>,
    newest: usize,
}

/// The value at `path` in one lane's raw observation.
pub fn read_source<'py>(
    raw_observation: &Bound<'py, PyAny>,
    path: &[String],
    lane: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let py = raw_observation.py();
    let mut value = raw_observation.clone();
    for (depth, key) in path.iter().enumerate() {
        value = match value.get_item(key) {
            Ok(found) => found,
            Err(err)
                if err.is_instance_of::<PyKeyError>(py)
                    || err.is_instance_of::<PyIndexError>(py)
                    || err.is_instance_of::<PyTypeError>(py) =>
            {
                return Err(ObservationError::new_err(format!(
                    "lane {lane}: {} has no key \"{key}\", which the model's input reads as {}",
                    path_text(py, "obs", &path[..depth])?,
                    path_text(py, "obs", path)?
                )));
            }
            Err(err) => return Err(err),
        };
    }
    Ok(value)
}

fn strings(value: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    value
        .try_iter()?
        .map(|item| item?.extract::<String>())
        .collect()
}

fn sizes(value: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    value
        .try_iter()?
        .map(|item| item?.extract::<usize>())
        .collect()
}

impl Leaf {
    fn from_plan(plan: &Bound<'_, PyAny>) -> PyResult<Self> {
        let py = plan.py();
        let label: String = plan.getattr("leaf")?.extract()?;
        let kind = match plan.getattr("kind")?.extract::<String>()?.as_str() {
            "array" => Kind::Array,
            "text" => Kind::Text,
            "custom" => Kind::Custom,
            other => {
                return Err(PyValueError::new_err(format!(
                    "{label}: unknown leaf kind '{other}'"
                )))
            }
        };
        let dtype_name: String = plan.getattr("dtype")?.extract()?;
        let dtype = match kind {
            Kind::Array => numpy_dtype(py, &dtype_name)?,
            _ => numpy_dtype(py, "object")?,
        };
        let itemsize = dtype.itemsize();
        let scale: f64 = plan.getattr("scale")?.extract()?;
        let offset: f64 = plan.getattr("offset")?.extract()?;
        let affine = if (scale, offset) == (1.0, 0.0) {
            Affine::Identity
        } else {
            match dtype_name.as_str() {
                "float32" => Affine::F32(scale as f32, offset as f32),
                "float64" => Affine::F64(scale, offset),
                _ => {
                    return Err(PyValueError::new_err(format!(
                        "{label}: scale and offset need a float dtype, got {dtype_name}"
                    )))
                }
            }
        };
        let frame_shape = sizes(&plan.getattr("frame_shape")?)?;
        let transpose = plan.getattr("transpose")?;
        let func = plan.getattr("fn")?;
        Ok(Leaf {
            slot: strings(&plan.getattr("slot")?)?,
            kind,
            sources: plan
                .getattr("sources")?
                .try_iter()?
                .map(|path| strings(&path?))
                .collect::<PyResult<_>>()?,
            source_shapes: plan
                .getattr("source_shapes")?
                .try_iter()?
                .map(|shape| sizes(&shape?))
                .collect::<PyResult<_>>()?,
            transpose: if transpose.is_none() {
                None
            } else {
                Some(sizes(&transpose)?)
            },
            frame_bytes: frame_shape.iter().product::<usize>() * itemsize,
            dtype: dtype.unbind(),
            itemsize,
            affine,
            stack: plan.getattr("stack")?.extract()?,
            frame_shape,
            func: if func.is_none() {
                None
            } else {
                Some(func.unbind())
            },
            label,
        })
    }

    fn stacked(&self) -> bool {
        self.kind == Kind::Array && self.stack > 1
    }

    /// One lane's sources of an array leaf: read, shape-checked and cast, ready to copy.
    /// Everything that can fail happens here, before any window is touched.
    fn sources_of<'py>(
        &self,
        raw_observation: &Bound<'py, PyAny>,
        lane: usize,
    ) -> PyResult<Vec<Bound<'py, PyUntypedArray>>> {
        let dtype = self.dtype.bind(raw_observation.py());
        self.sources
            .iter()
            .zip(&self.source_shapes)
            .map(|(path, shape)| {
                let value = read_source(raw_observation, path, lane)?;
                contiguous_source(value, dtype, path, shape, lane)
            })
            .collect()
    }

    /// Write one frame (`frame_bytes` long) from its sources: transpose, or flatten and
    /// concatenate (C-contiguous sources one after the other), then scale.
    fn copy_frame(&self, sources: &[Bound<'_, PyUntypedArray>], frame: &mut [u8]) {
        let mut written = 0;
        for (source, shape) in sources.iter().zip(&self.source_shapes) {
            // SAFETY: `sources_of` made each source C-contiguous; it stays alive and untouched
            // while this frame is copied, under the GIL.
            let bytes = unsafe { array_bytes(source) };
            let target = &mut frame[written..written + bytes.len()];
            match &self.transpose {
                Some(axes) => transpose_into(bytes, shape, axes, self.itemsize, target),
                None => target.copy_from_slice(bytes),
            }
            written += bytes.len();
        }
        apply_affine(self.affine, frame);
    }
}

/// The `numpy` module, imported once.
pub(crate) fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    let module = NUMPY.get_or_try_init(py, || py.import("numpy").map(Bound::unbind))?;
    Ok(module.bind(py))
}

fn numpy_dtype<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyArrayDescr>> {
    Ok(py
        .import("numpy")?
        .getattr("dtype")?
        .call1((name,))?
        .cast_into::<PyArrayDescr>()?)
}

/// The source as a C-contiguous array of the leaf's dtype, its shape checked against the space.
fn contiguous_source<'py>(
    value: Bound<'py, PyAny>,
    dtype: &Bound<'py, PyArrayDescr>,
    path: &[String],
    shape: &[usize],
    lane: usize,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let py = value.py();
    let numpy = numpy(py)?;
    let array = match value.cast_into::<PyUntypedArray>() {
        Ok(array) => array,
        Err(err) => numpy
            .getattr("asarray")?
            .call1((err.into_inner(),))?
            .cast_into::<PyUntypedArray>()?,
    };
    if array.shape() != shape {
        return Err(ObservationError::new_err(format!(
            "lane {lane}: {} has shape {} but the observation space declares {}",
            path_text(py, "obs", path)?,
            shape_text(array.shape()),
            shape_text(shape)
        )));
    }
    if array.dtype().is_equiv_to(dtype) && array.is_c_contiguous() {
        return Ok(array);
    }
    Ok(numpy
        .getattr("ascontiguousarray")?
        .call1((array, dtype))?
        .cast_into::<PyUntypedArray>()?)
}

/// Copy a C-contiguous array of `shape` into `out`, its axes permuted by `axes`.
fn transpose_into(source: &[u8], shape: &[usize], axes: &[usize], itemsize: usize, out: &mut [u8]) {
    let rank = shape.len();
    let mut source_strides = vec![itemsize; rank];
    for axis in (0..rank.saturating_sub(1)).rev() {
        source_strides[axis] = source_strides[axis + 1] * shape[axis + 1];
    }
    let out_shape: Vec<usize> = axes.iter().map(|&axis| shape[axis]).collect();
    let strides: Vec<usize> = axes.iter().map(|&axis| source_strides[axis]).collect();
    let mut index = vec![0usize; rank];
    for item in out.chunks_exact_mut(itemsize) {
        let offset: usize = index
            .iter()
            .zip(&strides)
            .map(|(i, stride)| i * stride)
            .sum();
        item.copy_from_slice(&source[offset..offset + itemsize]);
        for axis in (0..rank).rev() {
            index[axis] += 1;
            if index[axis] < out_shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
}

fn apply_affine(affine: Affine, frame: &mut [u8]) {
    match affine {
        Affine::Identity => {}
        Affine::F32(scale, offset) => {
            for item in frame.chunks_exact_mut(4) {
                let value = f32::from_ne_bytes(item.try_into().expect("4 bytes"));
                item.copy_from_slice(&(value * scale + offset).to_ne_bytes());
            }
        }
        Affine::F64(scale, offset) => {
            for item in frame.chunks_exact_mut(8) {
                let value = f64::from_ne_bytes(item.try_into().expect("8 bytes"));
                item.copy_from_slice(&(value * scale + offset).to_ne_bytes());
            }
        }
    }
}

/// Builds the model's input for a group of lanes from their raw observations.
///
/// See ``rlmesh._pycore.assembly.ObservationAssembler`` for the full contract.
#[pyclass(module = "rlmesh._core")]
pub struct ObservationAssembler {
    leaves: Vec<Leaf>,
    /// Per leaf: episode id -> its window (stacked leaves only).
    windows: Vec<HashMap<i64, Window>>,
}

impl ObservationAssembler {
    /// Write one lane's new frame into its episode's window of leaf `index`, in place: into
    /// the oldest slot of an existing window, or into every slot of a new one.
    fn advance_window(
        &mut self,
        index: usize,
        episode_id: i64,
        sources: &[Bound<'_, PyUntypedArray>],
    ) -> &Window {
        let leaf = &self.leaves[index];
        let (stack, size) = (leaf.stack, leaf.frame_bytes);
        match self.windows[index].entry(episode_id) {
            Entry::Occupied(entry) => {
                let window = entry.into_mut();
                window.newest = (window.newest + 1) % stack;
                let slot = window.newest * size;
                leaf.copy_frame(sources, &mut window.frames[slot..slot + size]);
                window
            }
            Entry::Vacant(entry) => {
                let mut frames = vec![0u8; stack * size];
                let (first, rest) = frames.split_at_mut(size);
                leaf.copy_frame(sources, first);
                for slot in rest.chunks_exact_mut(size) {
                    slot.copy_from_slice(first);
                }
                entry.insert(Window {
                    frames,
                    newest: stack - 1,
                })
            }
        }
    }

    fn check<'py>(
        &self,
        raw_lane_observations: &Bound<'py, PyAny>,
        episode_ids: &Bound<'py, PyAny>,
    ) -> PyResult<(Vec<Bound<'py, PyAny>>, Vec<i64>)> {
        let ids = vector::<i64>(episode_ids, Dtype::Int64, "episode_ids")?;
        same_length("episode_ids", ids.len(), raw_lane_observations.len()?)?;
        let raw = raw_lane_observations
            .try_iter()?
            .collect::<PyResult<Vec<_>>>()?;
        Ok((raw, ids.as_slice()?.to_vec()))
    }

    /// `assemble` with the arguments already read: `raw[k]` is episode `ids[k]`'s observation.
    pub(crate) fn assemble_frames<'py>(
        &mut self,
        py: Python<'py>,
        raw: &[Bound<'py, PyAny>],
        ids: &[i64],
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut payload: Option<Bound<'py, PyAny>> = None;
        for index in 0..self.leaves.len() {
            let value = self.assemble_leaf(py, index, raw, ids)?;
            let slot = &self.leaves[index].slot;
            payload = Some(if slot.is_empty() {
                value
            } else {
                placed(py, payload, slot, value)?
            });
        }
        Ok(payload.unwrap_or_else(|| py.None().into_bound(py)))
    }

    /// `push` with the arguments already read: `raw[k]` is episode `ids[k]`'s observation.
    pub(crate) fn push_frames(&mut self, raw: &[Bound<'_, PyAny>], ids: &[i64]) -> PyResult<()> {
        for index in 0..self.leaves.len() {
            if !self.leaves[index].stacked() {
                continue;
            }
            for (lane, (observation, &episode_id)) in raw.iter().zip(ids).enumerate() {
                let sources = self.leaves[index].sources_of(observation, lane)?;
                self.advance_window(index, episode_id, &sources);
            }
        }
        Ok(())
    }

    fn assemble_leaf<'py>(
        &mut self,
        py: Python<'py>,
        index: usize,
        raw: &[Bound<'py, PyAny>],
        ids: &[i64],
    ) -> PyResult<Bound<'py, PyAny>> {
        let leaf = &self.leaves[index];
        match leaf.kind {
            Kind::Text => {
                let texts = PyList::empty(py);
                for (lane, observation) in raw.iter().enumerate() {
                    texts.append(text(leaf, observation, lane)?)?;
                }
                Ok(texts.into_any())
            }
            Kind::Custom => {
                let func = leaf
                    .func
                    .as_ref()
                    .expect("a custom leaf has a function")
                    .bind(py);
                let values = raw
                    .iter()
                    .map(|observation| func.call1((observation,)))
                    .collect::<PyResult<Vec<_>>>()?;
                custom(py, leaf, values)
            }
            Kind::Array => self.array_leaf(py, index, raw, ids),
        }
    }

    fn array_leaf<'py>(
        &mut self,
        py: Python<'py>,
        index: usize,
        raw: &[Bound<'py, PyAny>],
        ids: &[i64],
    ) -> PyResult<Bound<'py, PyAny>> {
        let leaf = &self.leaves[index];
        let mut out_shape = Vec::with_capacity(2 + leaf.frame_shape.len());
        out_shape.push(ids.len());
        if leaf.stack > 1 {
            out_shape.push(leaf.stack);
        }
        out_shape.extend(&leaf.frame_shape);
        let mut out = empty_array(py, leaf.dtype.bind(py), &out_shape)?;
        // SAFETY: `out` was just created, as numpy.empty would: C-contiguous, seen by nobody else.
        let out_bytes = unsafe { array_bytes_mut(&mut out) };
        let row_bytes = leaf.frame_bytes * leaf.stack.max(1);
        let (stacked, frame_bytes) = (leaf.stack > 1, leaf.frame_bytes);
        for (lane, (observation, &episode_id)) in raw.iter().zip(ids).enumerate() {
            let sources = self.leaves[index].sources_of(observation, lane)?;
            let row = &mut out_bytes[lane * row_bytes..(lane + 1) * row_bytes];
            if !stacked {
                self.leaves[index].copy_frame(&sources, row);
                continue;
            }
            let window = self.advance_window(index, episode_id, &sources);
            // Oldest first: the slot after the newest, around the ring.
            let (newer, older) = window.frames.split_at((window.newest + 1) * frame_bytes);
            row[..older.len()].copy_from_slice(older);
            row[older.len()..].copy_from_slice(newer);
        }
        Ok(out.into_any())
    }
}

fn text<'py>(
    leaf: &Leaf,
    raw_observation: &Bound<'py, PyAny>,
    lane: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let value = read_source(raw_observation, &leaf.sources[0], lane)?;
    if !value.is_instance_of::<PyString>() {
        return Err(ObservationError::new_err(format!(
            "lane {lane}: {} is {}, but {} reads a str",
            path_text(raw_observation.py(), "obs", &leaf.sources[0])?,
            value.get_type().name()?,
            leaf.label
        )));
    }
    Ok(value)
}

/// K results of a Custom leaf: strings stay a list, anything else is stacked.
fn custom<'py>(
    py: Python<'py>,
    leaf: &Leaf,
    values: Vec<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    if values
        .iter()
        .all(|value| value.is_instance_of::<PyString>())
    {
        return Ok(PyList::new(py, values)?.into_any());
    }
    let numpy = numpy(py)?;
    let arrays = values
        .iter()
        .map(|value| numpy.getattr("asarray")?.call1((value,)))
        .collect::<PyResult<Vec<_>>>()?;
    numpy
        .getattr("stack")?
        .call1((PyList::new(py, arrays)?,))
        .map_err(|err| {
            if !err.is_instance_of::<PyValueError>(py) {
                return err;
            }
            ObservationError::new_err(format!(
                "{} returned values that cannot be stacked across lanes: {}",
                leaf.label,
                err.value(py)
            ))
        })
}

/// `payload` with `value` at `slot` (a path of dict keys), creating dicts on the way.
fn placed<'py>(
    py: Python<'py>,
    payload: Option<Bound<'py, PyAny>>,
    slot: &[String],
    value: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let root = match payload {
        Some(payload) => payload.cast_into::<PyDict>()?,
        None => PyDict::new(py),
    };
    let mut node = root.clone();
    for key in &slot[..slot.len() - 1] {
        let child = match node.get_item(key)? {
            Some(child) => child.cast_into::<PyDict>()?,
            None => {
                let child = PyDict::new(py);
                node.set_item(key, &child)?;
                child
            }
        };
        node = child;
    }
    node.set_item(&slot[slot.len() - 1], value)?;
    Ok(root.into_any())
}

#[pymethods]
impl ObservationAssembler {
    #[new]
    pub(crate) fn py_new(observation_leaves: &Bound<'_, PyAny>) -> PyResult<Self> {
        let leaves = observation_leaves
            .try_iter()?
            .map(|plan| Leaf::from_plan(&plan?))
            .collect::<PyResult<Vec<_>>>()?;
        let windows = leaves.iter().map(|_| HashMap::new()).collect();
        Ok(ObservationAssembler { leaves, windows })
    }

    /// Episodes holding at least one frame window.
    #[getter]
    pub(crate) fn window_count(&self) -> usize {
        let episodes: HashSet<i64> = self
            .windows
            .iter()
            .flat_map(|windows| windows.keys().copied())
            .collect();
        episodes.len()
    }

    /// The model's input for K lanes: each leaf gains a leading lane axis.
    fn assemble<'py>(
        &mut self,
        py: Python<'py>,
        raw_lane_observations: &Bound<'py, PyAny>,
        episode_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (raw, ids) = self.check(raw_lane_observations, episode_ids)?;
        self.assemble_frames(py, &raw, &ids)
    }

    /// Add each lane's frame to its episode's windows without building a payload.
    fn push(
        &mut self,
        raw_lane_observations: &Bound<'_, PyAny>,
        episode_ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (raw, ids) = self.check(raw_lane_observations, episode_ids)?;
        self.push_frames(&raw, &ids)
    }

    /// Forget an ended episode's windows (no-op if it has none).
    pub(crate) fn evict(&mut self, episode_id: i64) {
        for windows in &mut self.windows {
            windows.remove(&episode_id);
        }
    }

    /// Forget every window.
    fn clear(&mut self) {
        for windows in &mut self.windows {
            windows.clear();
        }
    }
}
