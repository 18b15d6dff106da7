//! Observation assembly: each lane's raw observation -> the model's input, fused across lanes.
//!
//! Mirrors `python/rlmesh/_pycore/assembly.py` name for name; that file is the specification.
//! Here every array leaf is written straight into one contiguous output array per leaf: a
//! frame is copied once into its episode's window, and the window once into the output, with
//! no per-lane Python objects. Only reading the lanes' raw observations (and casting a source
//! whose dtype differs from the leaf's) goes through Python.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

use numpy::npyffi;
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyIndexError, PyKeyError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString};

use crate::args::{
    array_bytes, array_bytes_mut, path_text, same_length, shape_text, vector, Dtype,
};
use crate::chunks::{array_over, empty_array};
use crate::resize::{Resample, Resizer};
use crate::rotations::Encoding;
use numpy::npyffi::PY_ARRAY_API;

pyo3::import_exception!(rlmesh.errors, ObservationError);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Array,
    Text,
    Custom,
    /// Role-based (`rlmesh.adapters.resolve`): an image converted per lane.
    Image,
    /// Role-based: a state concatenated from converted parts.
    State,
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
    /// Per source, its transpose when the plan asks for one.
    transposes: Option<Vec<Transpose>>,
    dtype: Py<PyArrayDescr>,
    affine: Affine,
    stack: usize,
    frame_shape: Vec<usize>,
    frame_bytes: usize,
    func: Option<Py<PyAny>>,
    /// The dtype sources are read in: the leaf's, or for a role-based leaf the one its
    /// conversion works in (uint8 or float64 images, float64 states).
    read_dtype: Py<PyArrayDescr>,
    role: Option<RoleFrame>,
    /// A state of plain lists, or text of one-element lists.
    container_list: bool,
    /// A text leaf with no source: every lane gets this string.
    text_fill: Option<String>,
    /// The leaf's value is the raw observation as it is: one array read whole at the root,
    /// in the leaf's dtype and shape, with no transpose, scale, stack or conversion.
    verbatim: bool,
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
            "image" => Kind::Image,
            "state" => Kind::State,
            other => {
                return Err(PyValueError::new_err(format!(
                    "{label}: unknown leaf kind '{other}'"
                )))
            }
        };
        let dtype_name: String = plan.getattr("dtype")?.extract()?;
        let dtype = match kind {
            Kind::Array | Kind::Image | Kind::State => numpy_dtype(py, &dtype_name)?,
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
        let source_shapes: Vec<Vec<usize>> = plan
            .getattr("source_shapes")?
            .try_iter()?
            .map(|shape| sizes(&shape?))
            .collect::<PyResult<_>>()?;
        let transpose = plan.getattr("transpose")?;
        let transposes = if transpose.is_none() || kind != Kind::Array {
            None
        } else {
            let axes = sizes(&transpose)?;
            let planned = source_shapes
                .iter()
                .map(|shape| {
                    check_axes(&label, &axes, shape.len())?;
                    Ok(Transpose::plan(shape, &axes, itemsize))
                })
                .collect::<PyResult<_>>()?;
            Some(planned)
        };
        let func = plan.getattr("fn")?;
        let (read_dtype, role) = match kind {
            Kind::Image => {
                let out = OutKind::from_name(&label, &dtype_name)?;
                let ops = ImageOps::from_plan(plan, &label, out, itemsize)?;
                let read = if ops.source_u8 { "uint8" } else { "float64" };
                (
                    numpy_dtype(py, read)?,
                    Some(RoleFrame::Image(Box::new(ops))),
                )
            }
            Kind::State => {
                let out = OutKind::from_name(&label, &dtype_name)?;
                let ops = StateOps::from_plan(plan, &label, out)?;
                (numpy_dtype(py, "float64")?, Some(RoleFrame::State(ops)))
            }
            _ => (dtype.clone(), None),
        };
        let container: String = plan.getattr("container")?.extract()?;
        let text_fill = plan.getattr("text_fill")?;
        let stack: usize = plan.getattr("stack")?.extract()?;
        let sources: Vec<Vec<String>> = plan
            .getattr("sources")?
            .try_iter()?
            .map(|path| strings(&path?))
            .collect::<PyResult<_>>()?;
        let verbatim = kind == Kind::Array
            && matches!(sources.as_slice(), [path] if path.is_empty())
            && source_shapes.first() == Some(&frame_shape)
            && transposes.is_none()
            && matches!(affine, Affine::Identity)
            && stack == 1
            && func.is_none();
        Ok(Leaf {
            verbatim,
            read_dtype: read_dtype.unbind(),
            role,
            container_list: container == "list",
            text_fill: if text_fill.is_none() {
                None
            } else {
                Some(text_fill.extract()?)
            },
            slot: strings(&plan.getattr("slot")?)?,
            kind,
            sources,
            source_shapes,
            transposes,
            frame_bytes: frame_shape.iter().product::<usize>() * itemsize,
            dtype: dtype.unbind(),
            affine,
            stack,
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
        self.framed() && self.stack > 1
    }

    /// Whether the leaf writes frames into an array (and may stack them).
    fn framed(&self) -> bool {
        matches!(self.kind, Kind::Array | Kind::Image | Kind::State)
    }

    /// The shape of one lane's value of an array leaf: `[stack, *frame_shape]` when stacked.
    fn row_shape(&self) -> Vec<usize> {
        let stack = (self.stack > 1).then_some(self.stack);
        stack
            .into_iter()
            .chain(self.frame_shape.iter().copied())
            .collect()
    }

    /// One lane's sources of an array leaf: read, shape-checked and cast, ready to copy.
    /// Everything that can fail happens here, before any window is touched.
    fn sources_of<'py>(
        &self,
        raw_observation: &Bound<'py, PyAny>,
        lane: usize,
    ) -> PyResult<Vec<Bound<'py, PyUntypedArray>>> {
        let dtype = self.read_dtype.bind(raw_observation.py());
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
        match &self.role {
            Some(RoleFrame::Image(ops)) => {
                // SAFETY: as below: a C-contiguous source, alive and untouched under the GIL.
                let source = sources.first().map(|source| unsafe { array_bytes(source) });
                return ops.write(source, self.affine, frame);
            }
            Some(RoleFrame::State(ops)) => return ops.write(sources, frame),
            None => {}
        }
        let mut written = 0;
        for (index, source) in sources.iter().enumerate() {
            // SAFETY: `sources_of` made each source C-contiguous; it stays alive and untouched
            // while this frame is copied, under the GIL.
            let bytes = unsafe { array_bytes(source) };
            let target = &mut frame[written..written + bytes.len()];
            match &self.transposes {
                Some(transposes) => transposes[index].copy(bytes, target),
                None => target.copy_from_slice(bytes),
            }
            written += bytes.len();
        }
        apply_affine(self.affine, frame);
    }
}

/// How a role-based leaf makes one lane's frame (`rlmesh.adapters.resolve` plans it).
enum RoleFrame {
    Image(Box<ImageOps>),
    State(StateOps),
}

/// The output dtype of a role-based leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutKind {
    U8,
    F32,
    F64,
    I64,
}

impl OutKind {
    fn from_name(label: &str, name: &str) -> PyResult<OutKind> {
        Ok(match name {
            "uint8" => OutKind::U8,
            "float32" => OutKind::F32,
            "float64" => OutKind::F64,
            "int64" => OutKind::I64,
            other => {
                return Err(PyValueError::new_err(format!(
                    "{label}: a role-based leaf's dtype must be uint8, float32, float64 or int64, \
                     got {other}"
                )))
            }
        })
    }

    /// `values` cast into `out` as numpy's `astype` would (float to int truncates).
    fn write(self, values: impl Iterator<Item = f64>, out: &mut [u8]) {
        match self {
            OutKind::U8 => values.zip(out.iter_mut()).for_each(|(v, o)| *o = v as u8),
            OutKind::F32 => {
                for (v, o) in values.zip(out.chunks_exact_mut(4)) {
                    o.copy_from_slice(&(v as f32).to_ne_bytes());
                }
            }
            OutKind::F64 => {
                for (v, o) in values.zip(out.chunks_exact_mut(8)) {
                    o.copy_from_slice(&v.to_ne_bytes());
                }
            }
            OutKind::I64 => {
                for (v, o) in values.zip(out.chunks_exact_mut(8)) {
                    o.copy_from_slice(&(v as i64).to_ne_bytes());
                }
            }
        }
    }
}

/// An image leaf: to hwc, flip 180, resize, crop or pad, cast and scale, to the model's layout.
struct ImageOps {
    /// The source's (height, width, channels), and whether it is stored chw.
    source: (usize, usize, usize),
    chw: bool,
    flip: bool,
    /// The source is read as uint8 (else as float64).
    source_u8: bool,
    resizer: Option<Resizer>,
    /// With crop or pad: the resized (height, width), cut or placed at the frame's centre.
    fit: Option<(Fit, (usize, usize))>,
    /// The frame's (height, width).
    frame: (usize, usize),
    out: OutKind,
    /// hwc -> chw of the resized frame, in the leaf's itemsize.
    to_chw: Option<Transpose>,
    zero_fill: Option<f64>,
}

/// How a resized image meets a frame of another aspect (see `rlmesh.adapters.Image`'s `fit`).
#[derive(Clone, Copy)]
enum Fit {
    Crop,
    Pad,
}

/// One part of a state leaf (see `rlmesh.adapters.StatePartPlan`).
struct PartOps {
    /// Index into the leaf's sources; None for zeros.
    source: Option<usize>,
    zeros: usize,
    offset: usize,
    width: usize,
    rotation: Option<(Encoding, Encoding)>,
    index: Option<usize>,
    dim: Option<usize>,
    /// (lo_from, hi_from, lo_to, hi_to)
    range: Option<(f64, f64, f64, f64)>,
}

struct StateOps {
    parts: Vec<PartOps>,
    pad_to: Option<usize>,
    out: OutKind,
}

fn optional<'py>(value: Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    (!value.is_none()).then_some(value)
}

fn encoding(label: &str, name: &str) -> PyResult<Encoding> {
    Encoding::from_name(name).ok_or_else(|| {
        PyValueError::new_err(format!("{label}: unknown rotation encoding '{name}'"))
    })
}

impl ImageOps {
    fn from_plan(
        plan: &Bound<'_, PyAny>,
        label: &str,
        out: OutKind,
        itemsize: usize,
    ) -> PyResult<Self> {
        let frame: Vec<usize> = sizes(&plan.getattr("frame_shape")?)?;
        let lead: usize = plan.getattr("lead_dims")?.extract()?;
        let chw_out = !plan.getattr("transpose")?.is_none();
        let [a, b, c] = frame[lead..] else {
            return Err(PyValueError::new_err(format!(
                "{label}: an image frame has rank 3"
            )));
        };
        let (height, width, channels) = if chw_out { (b, c, a) } else { (a, b, c) };
        let to_chw =
            chw_out.then(|| Transpose::plan(&[height, width, channels], &[2, 0, 1], itemsize));
        if plan.getattr("zero_fill")?.is_truthy()? {
            return Ok(ImageOps {
                source: (height, width, channels),
                chw: false,
                flip: false,
                source_u8: true,
                resizer: None,
                fit: None,
                frame: (height, width),
                out,
                to_chw,
                zero_fill: Some(plan.getattr("fill_value")?.extract()?),
            });
        }
        let shape = sizes(&plan.getattr("source_shapes")?.get_item(0)?)?;
        let chw = plan.getattr("src_layout")?.extract::<String>()? == "chw";
        let source = if chw {
            (shape[1], shape[2], shape[0])
        } else {
            (shape[0], shape[1], shape[2])
        };
        let source_dtype: String = plan.getattr("source_dtypes")?.get_item(0)?.extract()?;
        let mut resized = (source.0, source.1);
        let resizer = match optional(plan.getattr("resize")?) {
            None => None,
            Some(target) => {
                resized = target.extract()?;
                let name: String = plan.getattr("resample")?.extract()?;
                let resample = Resample::from_name(&name).ok_or_else(|| {
                    PyValueError::new_err(format!("{label}: unknown resample '{name}'"))
                })?;
                Some(Resizer::plan(resample, source, resized))
            }
        };
        let fit = match plan.getattr("fit")?.extract::<String>()?.as_str() {
            "stretch" => None,
            "crop" => Some((Fit::Crop, resized)),
            "pad" => Some((Fit::Pad, resized)),
            other => {
                return Err(PyValueError::new_err(format!(
                    "{label}: unknown fit '{other}'"
                )))
            }
        };
        Ok(ImageOps {
            source,
            chw,
            flip: plan.getattr("flip")?.is_truthy()?,
            source_u8: source_dtype == "uint8",
            resizer,
            fit,
            frame: (height, width),
            out,
            to_chw,
            zero_fill: None,
        })
    }

    /// The source's pixels in hwc order, flipped when asked: borrowed when nothing moves.
    fn upright<'a, T: Copy>(&self, source: &'a [T]) -> std::borrow::Cow<'a, [T]> {
        let (h, w, c) = self.source;
        if !self.chw && !self.flip {
            return std::borrow::Cow::Borrowed(source);
        }
        let mut out = Vec::with_capacity(source.len());
        for y in 0..h {
            let sy = if self.flip { h - 1 - y } else { y };
            for x in 0..w {
                let sx = if self.flip { w - 1 - x } else { x };
                for channel in 0..c {
                    out.push(if self.chw {
                        source[(channel * h + sy) * w + sx]
                    } else {
                        source[(sy * w + sx) * c + channel]
                    });
                }
            }
        }
        std::borrow::Cow::Owned(out)
    }

    /// One frame into `frame` (the leaf's dtype and frame shape), from the source's bytes.
    fn write(&self, source: Option<&[u8]>, affine: Affine, frame: &mut [u8]) {
        if let Some(fill) = self.zero_fill {
            let count = frame.len() / self.itemsize();
            self.out.write(std::iter::repeat_n(fill, count), frame);
            return;
        }
        let source = source.expect("an image leaf reads its source");
        let mut hwc = vec![0u8; frame.len()];
        if self.source_u8 {
            let upright = self.upright(source);
            let resized: std::borrow::Cow<'_, [u8]> = match &self.resizer {
                Some(resizer) => {
                    let mut out = vec![0u8; resizer.out_len()];
                    resizer.resize_u8(&upright, &mut out);
                    std::borrow::Cow::Owned(out)
                }
                None => upright,
            };
            let resized = self.fitted(resized);
            if self.out == OutKind::U8 {
                hwc.copy_from_slice(&resized);
            } else {
                self.out
                    .write(resized.iter().map(|&v| f64::from(v)), &mut hwc);
            }
        } else {
            let values: Vec<f64> = source
                .chunks_exact(8)
                .map(|item| f64::from_ne_bytes(item.try_into().expect("8 bytes")))
                .collect();
            let upright = self.upright(&values);
            let resized = match &self.resizer {
                Some(resizer) => {
                    let mut out = vec![0.0; resizer.out_len()];
                    resizer.resize_f64(&upright, &mut out);
                    out
                }
                None => upright.into_owned(),
            };
            let resized = self.fitted(std::borrow::Cow::Owned(resized));
            self.out.write(resized.iter().copied(), &mut hwc);
        }
        apply_affine(affine, &mut hwc);
        match &self.to_chw {
            Some(transpose) => transpose.copy(&hwc, frame),
            None => frame.copy_from_slice(&hwc),
        }
    }

    /// The resized hwc pixels cut (crop) or placed on zeros (pad) at the centre of the frame,
    /// the offset rounded down; as they are without a fit.
    fn fitted<'a, T: Copy + Default>(
        &self,
        resized: std::borrow::Cow<'a, [T]>,
    ) -> std::borrow::Cow<'a, [T]> {
        let Some((fit, (height, width))) = self.fit else {
            return resized;
        };
        let (frame_height, frame_width) = self.frame;
        let channels = self.source.2;
        let top = height.abs_diff(frame_height) / 2;
        let left = width.abs_diff(frame_width) / 2;
        let mut out = vec![T::default(); frame_height * frame_width * channels];
        let (rows, row_len) = match fit {
            Fit::Crop => (frame_height, frame_width * channels),
            Fit::Pad => (height, width * channels),
        };
        for row in 0..rows {
            let (from, to) = match fit {
                Fit::Crop => (((top + row) * width + left) * channels, row * row_len),
                Fit::Pad => (row * row_len, ((top + row) * frame_width + left) * channels),
            };
            out[to..to + row_len].copy_from_slice(&resized[from..from + row_len]);
        }
        std::borrow::Cow::Owned(out)
    }

    fn itemsize(&self) -> usize {
        match self.out {
            OutKind::U8 => 1,
            OutKind::F32 => 4,
            OutKind::F64 | OutKind::I64 => 8,
        }
    }
}

impl StateOps {
    fn from_plan(plan: &Bound<'_, PyAny>, label: &str, out: OutKind) -> PyResult<Self> {
        let mut parts = Vec::new();
        let mut next_source = 0;
        for part in plan.getattr("parts")?.try_iter()? {
            let part = part?;
            let source = if part.getattr("source")?.is_none() {
                None
            } else {
                next_source += 1;
                Some(next_source - 1)
            };
            let from = optional(part.getattr("encoding_from")?);
            let to = optional(part.getattr("encoding_to")?);
            let rotation = match (from, to) {
                (Some(from), Some(to)) => {
                    let (from, to) = (from.extract::<String>()?, to.extract::<String>()?);
                    (from != to).then_some((encoding(label, &from)?, encoding(label, &to)?))
                }
                _ => None,
            };
            let range = match (
                optional(part.getattr("range_from")?),
                optional(part.getattr("range_to")?),
            ) {
                (Some(from), Some(to)) => {
                    let (lo_from, hi_from): (f64, f64) = from.extract()?;
                    let (lo_to, hi_to): (f64, f64) = to.extract()?;
                    Some((lo_from, hi_from, lo_to, hi_to))
                }
                _ => None,
            };
            parts.push(PartOps {
                source,
                zeros: part.getattr("zeros")?.extract()?,
                offset: part.getattr("offset")?.extract()?,
                width: part.getattr("width")?.extract()?,
                rotation,
                index: part.getattr("index")?.extract()?,
                dim: part.getattr("dim")?.extract()?,
                range,
            });
        }
        Ok(StateOps {
            parts,
            pad_to: plan.getattr("pad_to")?.extract()?,
            out,
        })
    }

    /// One frame into `frame`: every part in float64, concatenated, padded, cast.
    fn write(&self, sources: &[Bound<'_, PyUntypedArray>], frame: &mut [u8]) {
        let mut values: Vec<f64> = Vec::new();
        for part in &self.parts {
            let Some(source) = part.source else {
                values.extend(std::iter::repeat_n(0.0, part.zeros));
                continue;
            };
            // SAFETY: `sources_of` made each source a C-contiguous float64 array, alive and
            // untouched under the GIL while it is read.
            let bytes = unsafe { array_bytes(&sources[source]) };
            let flat: Vec<f64> = bytes
                .chunks_exact(8)
                .skip(part.offset)
                .take(part.width)
                .map(|item| f64::from_ne_bytes(item.try_into().expect("8 bytes")))
                .collect();
            let mut piece = match part.rotation {
                Some((from, to)) => crate::rotations::convert(&flat, from, to),
                None => flat,
            };
            if let Some(index) = part.index {
                piece = piece[index..index + 1].to_vec();
            } else if let Some(dim) = part.dim {
                piece.truncate(dim);
            }
            if let Some((lo_from, hi_from, lo_to, hi_to)) = part.range {
                let gain = (hi_to - lo_to) / (hi_from - lo_from);
                for value in &mut piece {
                    *value = lo_to + (*value - lo_from) * gain;
                }
            }
            values.extend(piece);
        }
        if let Some(pad_to) = self.pad_to {
            values.resize(pad_to, 0.0);
        }
        self.out.write(values.into_iter(), frame);
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

/// Refuse `axes` that are not a permutation of a source's `rank` axes.
fn check_axes(label: &str, axes: &[usize], rank: usize) -> PyResult<()> {
    let mut seen = vec![false; rank];
    for &axis in axes {
        if axis >= rank || std::mem::replace(&mut seen[axis], true) {
            break;
        }
    }
    if axes.len() == rank && seen.iter().all(|&seen| seen) {
        return Ok(());
    }
    Err(PyValueError::new_err(format!(
        "{label}: transpose {} is not a permutation of the source's {rank} axes",
        shape_text(axes)
    )))
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

/// Items per side of the square tiles a general transpose is copied in: a 32 x 32 tile of
/// 8-byte items (8 KiB, read and written) stays in L1 while it is copied.
const TILE: usize = 32;

/// One output axis of a transpose, in items: its size and its strides in source and output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Axis {
    size: usize,
    source_stride: usize,
    out_stride: usize,
}

/// How the innermost two output axes of a transpose are copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    /// The output's innermost axis is contiguous in the source too: runs of `len` items.
    Run { len: usize },
    /// A plane whose `rows` are contiguous in the source and whose `columns` are contiguous in
    /// the output: `out[r * out_row_stride + c] = source[r + c * source_column_stride]`.
    /// An image's HWC -> CHW is one plane: a row per channel, a column per pixel.
    Plane {
        rows: usize,
        out_row_stride: usize,
        columns: usize,
        source_column_stride: usize,
    },
}

/// A C-contiguous source of one shape copied with its axes permuted, planned once per leaf.
///
/// The output's axes are read as source strides; size-1 axes are dropped and axes that stay
/// contiguous in both arrays are merged, so HWC -> CHW becomes a [C, H*W] plane. Items move
/// as whole 1, 2, 4 or 8-byte values; any other itemsize is copied byte-wise, as an extra
/// innermost axis.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Transpose {
    width: usize,
    /// The output axes looped over around the kernel, outermost first.
    outer: Vec<Axis>,
    kernel: Kernel,
}

impl Transpose {
    fn plan(shape: &[usize], axes: &[usize], itemsize: usize) -> Transpose {
        let width = if matches!(itemsize, 1 | 2 | 4 | 8) {
            itemsize
        } else {
            1
        };
        let mut source_strides = vec![itemsize / width; shape.len()];
        for axis in (0..shape.len().saturating_sub(1)).rev() {
            source_strides[axis] = source_strides[axis + 1] * shape[axis + 1];
        }
        let mut dims: Vec<(usize, usize)> = axes
            .iter()
            .map(|&axis| (shape[axis], source_strides[axis]))
            .collect();
        if width != itemsize {
            dims.push((itemsize, 1));
        }
        // Merge an axis into the one before it when the pair walks the source contiguously.
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(dims.len());
        for (size, stride) in dims.into_iter().filter(|&(size, _)| size != 1) {
            match merged.last_mut() {
                Some(last) if last.1 == stride * size => *last = (last.0 * size, stride),
                _ => merged.push((size, stride)),
            }
        }
        let mut out_stride = 1;
        let mut all: Vec<Axis> = merged
            .iter()
            .rev()
            .map(|&(size, source_stride)| {
                let axis = Axis {
                    size,
                    source_stride,
                    out_stride,
                };
                out_stride *= size;
                axis
            })
            .collect();
        all.reverse();
        let Some(&inner) = all.last() else {
            return Transpose {
                width,
                outer: Vec::new(),
                kernel: Kernel::Run { len: 1 },
            };
        };
        if inner.source_stride == 1 {
            all.pop();
            return Transpose {
                width,
                outer: all,
                kernel: Kernel::Run { len: inner.size },
            };
        }
        // The source's innermost remaining axis has stride 1: it becomes the plane's rows.
        let row = all
            .iter()
            .position(|axis| axis.source_stride == 1)
            .expect("a C-contiguous source has an axis of stride 1");
        let rows = all.remove(row);
        all.pop();
        Transpose {
            width,
            outer: all,
            kernel: Kernel::Plane {
                rows: rows.size,
                out_row_stride: rows.out_stride,
                columns: inner.size,
                source_column_stride: inner.source_stride,
            },
        }
    }

    /// Copy `source` (C-contiguous, the planned shape) into `out`, its axes permuted.
    fn copy(&self, source: &[u8], out: &mut [u8]) {
        if out.is_empty() {
            return;
        }
        match self.width {
            1 => self.copy_items::<1>(source, out),
            2 => self.copy_items::<2>(source, out),
            4 => self.copy_items::<4>(source, out),
            _ => self.copy_items::<8>(source, out),
        }
    }

    fn copy_items<const W: usize>(&self, source: &[u8], out: &mut [u8]) {
        let source = grouped::<u8, W>(source);
        let out = grouped_mut::<u8, W>(out);
        let mut index = vec![0usize; self.outer.len()];
        let (mut from, mut to) = (0, 0);
        loop {
            match self.kernel {
                Kernel::Run { len } => {
                    out[to..to + len].copy_from_slice(&source[from..from + len]);
                }
                Kernel::Plane {
                    rows,
                    out_row_stride,
                    columns,
                    source_column_stride,
                } => plane(
                    &source[from..],
                    &mut out[to..],
                    rows,
                    out_row_stride,
                    columns,
                    source_column_stride,
                ),
            }
            // The next position of the outer axes, the last one fastest.
            let mut axis = self.outer.len();
            loop {
                if axis == 0 {
                    return;
                }
                axis -= 1;
                let Axis {
                    size,
                    source_stride,
                    out_stride,
                } = self.outer[axis];
                index[axis] += 1;
                from += source_stride;
                to += out_stride;
                if index[axis] < size {
                    break;
                }
                index[axis] = 0;
                from -= source_stride * size;
                to -= out_stride * size;
            }
        }
    }
}

/// `items` read as groups of `N` (a trailing partial group left out): `as_chunks`, which
/// needs Rust 1.88.
fn grouped<T, const N: usize>(items: &[T]) -> &[[T; N]] {
    // SAFETY: `[T; N]` is `N` consecutive `T`s with `T`'s alignment, and the groups lie
    // within `items`, borrowed for as long.
    unsafe { std::slice::from_raw_parts(items.as_ptr().cast(), items.len() / N) }
}

/// `grouped`, mutable.
fn grouped_mut<T, const N: usize>(items: &mut [T]) -> &mut [[T; N]] {
    // SAFETY: as in `grouped`; the groups borrow `items` mutably, so nothing else aliases them.
    unsafe { std::slice::from_raw_parts_mut(items.as_mut_ptr().cast(), items.len() / N) }
}

/// One plane of a transpose (see `Kernel::Plane`). Packed pixels of 2 to 4 channels (each
/// column's items adjacent in the source) are split into channel rows; any other plane is
/// copied in square tiles.
fn plane<T: Copy>(
    source: &[T],
    out: &mut [T],
    rows: usize,
    out_row_stride: usize,
    columns: usize,
    source_column_stride: usize,
) {
    if source_column_stride == rows && (2..=4).contains(&rows) {
        let rows_out = ChannelRows {
            channels: rows,
            stride: out_row_stride,
            columns,
        };
        return split_channels(&source[..rows * columns], out, rows_out);
    }
    for first_row in (0..rows).step_by(TILE) {
        let last_row = (first_row + TILE).min(rows);
        for first_column in (0..columns).step_by(TILE) {
            let last_column = (first_column + TILE).min(columns);
            for row in first_row..last_row {
                let start = row * out_row_stride;
                let targets = &mut out[start + first_column..start + last_column];
                let column_items = source[row + first_column * source_column_stride..]
                    .iter()
                    .step_by(source_column_stride);
                for (target, &item) in targets.iter_mut().zip(column_items) {
                    *target = item;
                }
            }
        }
    }
}

/// Where `split_channels` writes: `channels` rows of `columns` items, `stride` items apart.
#[derive(Debug, Clone, Copy)]
struct ChannelRows {
    channels: usize,
    stride: usize,
    columns: usize,
}

impl ChannelRows {
    /// The `C` rows, borrowed from the start of `out`.
    fn of<T, const C: usize>(self, out: &mut [T]) -> [&mut [T]; C] {
        let mut rest = out;
        std::array::from_fn(|_| {
            let taken = std::mem::take(&mut rest);
            let (row, tail) = taken.split_at_mut(self.stride.min(taken.len()));
            rest = tail;
            &mut row[..self.columns]
        })
    }
}

/// Packed pixels (`rows.channels` items each) written as one row per channel: channel `c`
/// of pixel `p` goes to `out[c * rows.stride + p]`. HWC -> CHW of an image, in one pass.
fn split_channels<T: Copy>(pixels: &[T], out: &mut [T], rows: ChannelRows) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: this CPU has AVX2, checked just above.
        return unsafe { split_channels_avx2(pixels, out, rows) };
    }
    match rows.channels {
        2 => split_by_channel::<T, 2>(pixels, out, rows),
        3 => split_by_channel::<T, 3>(pixels, out, rows),
        _ => split_by_channel::<T, 4>(pixels, out, rows),
    }
}

/// One pass per channel: what compiles well without AVX2 (no vector shuffles to split
/// pixels with), each pass reading the pixels strided and writing one row.
fn split_by_channel<T: Copy, const C: usize>(pixels: &[T], out: &mut [T], rows: ChannelRows) {
    let pixels = grouped::<T, C>(pixels);
    for (channel, row) in rows.of::<T, C>(out).into_iter().enumerate() {
        for (target, pixel) in row.iter_mut().zip(pixels) {
            *target = pixel[channel];
        }
    }
}

/// One pass over the pixels writing every channel's row at once, which the compiler turns
/// into vector loads and shuffles under AVX2 (an RGB uint8 frame splits about as fast as it
/// copies: 30x the per-channel passes).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn split_channels_avx2<T: Copy>(pixels: &[T], out: &mut [T], rows: ChannelRows) {
    match rows.channels {
        2 => {
            let pixels = grouped::<T, 2>(pixels);
            let [a, b] = rows.of::<T, 2>(out);
            for ((pixel, a), b) in pixels.iter().zip(a).zip(b) {
                (*a, *b) = (pixel[0], pixel[1]);
            }
        }
        3 => {
            let pixels = grouped::<T, 3>(pixels);
            let [a, b, c] = rows.of::<T, 3>(out);
            for (((pixel, a), b), c) in pixels.iter().zip(a).zip(b).zip(c) {
                (*a, *b, *c) = (pixel[0], pixel[1], pixel[2]);
            }
        }
        _ => {
            let pixels = grouped::<T, 4>(pixels);
            let [a, b, c, d] = rows.of::<T, 4>(out);
            for ((((pixel, a), b), c), d) in pixels.iter().zip(a).zip(b).zip(c).zip(d) {
                (*a, *b, *c, *d) = (pixel[0], pixel[1], pixel[2], pixel[3]);
            }
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
                    let value = text(leaf, observation, lane)?;
                    if leaf.container_list {
                        texts.append(PyList::new(py, [value])?)?;
                    } else {
                        texts.append(value)?;
                    }
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
            Kind::Array | Kind::Image => self.array_leaf(py, index, raw, ids),
            Kind::State => {
                let list = leaf.container_list;
                let out = self.array_leaf(py, index, raw, ids)?;
                // Plain floats, one list per lane.
                if list {
                    out.call_method0("tolist")
                } else {
                    Ok(out)
                }
            }
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
        let mut out_shape = Vec::with_capacity(1 + leaf.row_shape().len());
        out_shape.push(ids.len());
        out_shape.extend(leaf.row_shape());
        let mut out = aligned_empty(py, leaf.dtype.bind(py), &out_shape)?;
        // SAFETY: `out` was just created, as numpy.empty would: C-contiguous, seen by nobody else.
        let out_bytes = unsafe { array_bytes_mut(&mut out) };
        let row_bytes = leaf.frame_bytes * leaf.stack.max(1);
        for (lane, (observation, &episode_id)) in raw.iter().zip(ids).enumerate() {
            let row = &mut out_bytes[lane * row_bytes..(lane + 1) * row_bytes];
            self.write_row(index, lane, observation, episode_id, row)?;
        }
        Ok(out.into_any())
    }

    /// Lane `lane`'s row of array leaf `index` into `row`: its frame, or its episode's window
    /// (advanced by the frame) oldest first.
    fn write_row(
        &mut self,
        index: usize,
        lane: usize,
        observation: &Bound<'_, PyAny>,
        episode_id: i64,
        row: &mut [u8],
    ) -> PyResult<()> {
        let sources = self.leaves[index].sources_of(observation, lane)?;
        let (stacked, frame_bytes) = (self.leaves[index].stack > 1, self.leaves[index].frame_bytes);
        if !stacked {
            self.leaves[index].copy_frame(&sources, row);
            return Ok(());
        }
        let window = self.advance_window(index, episode_id, &sources);
        // Oldest first: the slot after the newest, around the ring.
        let (newer, older) = window.frames.split_at((window.newest + 1) * frame_bytes);
        row[..older.len()].copy_from_slice(older);
        row[older.len()..].copy_from_slice(newer);
        Ok(())
    }

    /// Each lane's model input as an array of its own, when the plan is one array leaf at the
    /// payload's root (the payload `assemble_frames` returns is then one `[K, ...]` array):
    /// row `k` of that payload, without the `[K, ...]` array around the rows. None for any
    /// other plan. For a caller that hands each lane's input to a per-lane corner; the same
    /// frame windows advance, and the same errors are raised in the same order.
    ///
    /// A lane whose row would be a copy of its raw observation as it is (a verbatim leaf) gets
    /// the observation itself when nothing but the caller's `holders` references hold it
    /// (`lone_array`): nobody can change or see it while the model has it, so it is what a
    /// fresh copy would be, without the copy.
    pub(crate) fn assemble_rows<'py>(
        &mut self,
        py: Python<'py>,
        raw: &[Bound<'py, PyAny>],
        ids: &[i64],
        holders: isize,
    ) -> PyResult<Option<Vec<Bound<'py, PyAny>>>> {
        let [leaf] = self.leaves.as_slice() else {
            return Ok(None);
        };
        if leaf.kind != Kind::Array || !leaf.slot.is_empty() {
            return Ok(None);
        }
        let (dtype, row_shape) = (leaf.dtype.clone_ref(py), leaf.row_shape());
        let verbatim = leaf.verbatim;
        let mut rows = Vec::with_capacity(raw.len());
        for (lane, (observation, &episode_id)) in raw.iter().zip(ids).enumerate() {
            if verbatim && lone_array(observation, dtype.bind(py), &row_shape, holders) {
                rows.push(observation.clone());
                continue;
            }
            let mut row = empty_array(py, dtype.bind(py), &row_shape)?;
            // SAFETY: `row` was just created, C-contiguous, seen by nobody else.
            let row_bytes = unsafe { array_bytes_mut(&mut row) };
            self.write_row(0, lane, observation, episode_id, row_bytes)?;
            rows.push(row.into_any());
        }
        Ok(Some(rows))
    }
}

/// Where a payload's arrays start: XLA (JAX on the CPU) shares a buffer only at this alignment
/// and copies any other, and numpy's own allocations are 16-byte aligned.
pub(crate) const PAYLOAD_ALIGNMENT: usize = 64;

/// A new, uninitialised C-ordered array of `descr` and `shape` whose data starts at a multiple
/// of `PAYLOAD_ALIGNMENT`: a view into a numpy byte array a little longer than it, which it
/// keeps alive as its base.
pub(crate) fn aligned_empty<'py>(
    py: Python<'py>,
    descr: &Bound<'py, PyArrayDescr>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let bytes = shape.iter().product::<usize>() * descr.itemsize();
    let mut raw = empty_array(
        py,
        &numpy::dtype::<u8>(py),
        &[bytes + PAYLOAD_ALIGNMENT - 1],
    )?;
    // SAFETY: `raw` was just created, C-contiguous, seen by nobody else.
    let start = unsafe { array_bytes_mut(&mut raw) }.as_mut_ptr();
    let data = start.wrapping_add(start.align_offset(PAYLOAD_ALIGNMENT));
    // SAFETY: `data` and the `bytes` after it lie inside `raw`, which PyArray_SetBaseObject
    // makes the new array's base (stealing the reference `into_ptr` hands over), so the memory
    // lives as long as the array.
    unsafe {
        let array = array_over(py, descr, shape, data.cast(), npyffi::NPY_ARRAY_CARRAY)?;
        if PY_ARRAY_API.PyArray_SetBaseObject(py, array.as_array_ptr(), raw.into_ptr()) != 0 {
            return Err(PyErr::fetch(py));
        }
        Ok(array)
    }
}

/// Whether `value` is an array a model may have in place of a fresh copy of it: an `ndarray`
/// itself (no subclass) of `dtype` and `shape`, C-contiguous, writeable and owning its data,
/// referenced only by the caller's `holders` references (an env that keeps the array it
/// returned, to fill it again, holds one more).
fn lone_array(
    value: &Bound<'_, PyAny>,
    dtype: &Bound<'_, PyArrayDescr>,
    shape: &[usize],
    holders: isize,
) -> bool {
    let py = value.py();
    // SAFETY: reads the reference count of a live object under the GIL.
    if unsafe { pyo3::ffi::Py_REFCNT(value.as_ptr()) } != holders {
        return false;
    }
    // SAFETY: the type object numpy's API table holds, compared by address only.
    let ndarray = unsafe { npyffi::get_type_object(py, npyffi::NpyTypes::PyArray_Type) };
    if value.get_type().as_ptr() != ndarray.cast() {
        return false;
    }
    // SAFETY: `value`'s type is exactly ndarray, so it is a PyArrayObject.
    let array = unsafe { value.cast_unchecked::<PyUntypedArray>() };
    // SAFETY: a live PyArrayObject under the GIL; its flags and base are read, not changed.
    let (flags, base) = unsafe {
        let object = &(*array.as_array_ptr()).fields;
        (object.flags, object.base)
    };
    let wanted =
        npyffi::NPY_ARRAY_C_CONTIGUOUS | npyffi::NPY_ARRAY_WRITEABLE | npyffi::NPY_ARRAY_OWNDATA;
    flags & wanted == wanted
        && base.is_null()
        && array.shape() == shape
        && array.dtype().is_equiv_to(dtype)
}

fn text<'py>(
    leaf: &Leaf,
    raw_observation: &Bound<'py, PyAny>,
    lane: usize,
) -> PyResult<Bound<'py, PyAny>> {
    if let Some(fill) = &leaf.text_fill {
        return Ok(PyString::new(raw_observation.py(), fill).into_any());
    }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permuted copy item by item, the obvious way: the reference for the kernels.
    fn reference(source: &[u8], shape: &[usize], axes: &[usize], itemsize: usize) -> Vec<u8> {
        let rank = shape.len();
        let mut strides = vec![itemsize; rank];
        for axis in (0..rank.saturating_sub(1)).rev() {
            strides[axis] = strides[axis + 1] * shape[axis + 1];
        }
        let out_shape: Vec<usize> = axes.iter().map(|&axis| shape[axis]).collect();
        let mut out = Vec::with_capacity(source.len());
        let mut index = vec![0usize; rank];
        for _ in 0..source.len() / itemsize {
            let offset: usize = index
                .iter()
                .zip(axes)
                .map(|(i, &axis)| i * strides[axis])
                .sum();
            out.extend_from_slice(&source[offset..offset + itemsize]);
            for axis in (0..rank).rev() {
                index[axis] += 1;
                if index[axis] < out_shape[axis] {
                    break;
                }
                index[axis] = 0;
            }
        }
        out
    }

    fn permutations(rank: usize) -> Vec<Vec<usize>> {
        if rank == 0 {
            return vec![Vec::new()];
        }
        let mut all = Vec::new();
        for shorter in permutations(rank - 1) {
            for position in 0..=shorter.len() {
                let mut axes = shorter.clone();
                axes.insert(position, rank - 1);
                all.push(axes);
            }
        }
        all
    }

    fn check(shape: &[usize], axes: &[usize], itemsize: usize) {
        let bytes = shape.iter().product::<usize>() * itemsize;
        // Distinct-looking bytes, so a misplaced item shows.
        let source: Vec<u8> = (0..bytes).map(|i| (i * 131 + i / 251) as u8).collect();
        let mut out = vec![0xAAu8; bytes];
        Transpose::plan(shape, axes, itemsize).copy(&source, &mut out);
        assert_eq!(
            out,
            reference(&source, shape, axes, itemsize),
            "shape {shape:?}, axes {axes:?}, itemsize {itemsize}"
        );
    }

    #[test]
    fn every_permutation_of_small_shapes_matches_the_item_by_item_copy() {
        let shapes: [&[usize]; 9] = [
            &[],
            &[5],
            &[1, 1],
            &[3, 1, 2],
            &[2, 3, 4],
            &[1, 5, 3],
            &[4, 3, 2, 3],
            &[2, 1, 3, 1],
            &[0, 3, 2],
        ];
        for shape in shapes {
            for axes in permutations(shape.len()) {
                for itemsize in [1, 2, 3, 4, 8, 16] {
                    check(shape, &axes, itemsize);
                }
            }
        }
    }

    #[test]
    fn images_whose_sides_are_not_a_multiple_of_the_tile_match_the_item_by_item_copy() {
        for (height, width) in [(37, 53), (TILE + 1, 2 * TILE - 1), (210, 160), (1, 97)] {
            for channels in 1..=6 {
                let shape = [height, width, channels];
                for itemsize in [1, 4, 8] {
                    check(&shape, &[2, 0, 1], itemsize); // HWC -> CHW
                    check(&shape, &[1, 2, 0], itemsize); // CHW -> HWC, read as [H, W, C]
                    check(&shape, &[1, 0, 2], itemsize); // height and width swapped
                }
            }
        }
    }

    #[test]
    fn the_portable_channel_split_matches_the_one_this_cpu_runs() {
        // `split_channels` takes the AVX2 path where the CPU has it; the fallback is checked
        // here directly so that both are.
        let pixels: Vec<u8> = (0..4 * 101).map(|i| (i * 7) as u8).collect();
        for channels in 2..=4 {
            let rows = ChannelRows {
                channels,
                stride: 103,
                columns: 101,
            };
            let pixels = &pixels[..channels * 101];
            let (mut fast, mut portable) = (vec![0u8; 4 * 103], vec![0u8; 4 * 103]);
            split_channels(pixels, &mut fast, rows);
            match channels {
                2 => split_by_channel::<u8, 2>(pixels, &mut portable, rows),
                3 => split_by_channel::<u8, 3>(pixels, &mut portable, rows),
                _ => split_by_channel::<u8, 4>(pixels, &mut portable, rows),
            }
            assert_eq!(fast, portable, "{channels} channels");
            assert_eq!(fast[103], pixels[1], "channel 1 of pixel 0 starts row 1");
        }
    }

    #[test]
    fn hwc_to_chw_is_one_plane_of_packed_pixels() {
        let planned = Transpose::plan(&[210, 160, 3], &[2, 0, 1], 1);
        assert!(planned.outer.is_empty());
        assert_eq!(
            planned.kernel,
            Kernel::Plane {
                rows: 3,
                out_row_stride: 210 * 160,
                columns: 210 * 160,
                source_column_stride: 3,
            }
        );
        // Without a permutation left, it is one run: a plain copy.
        let identity = Transpose::plan(&[4, 1, 6], &[1, 0, 2], 4);
        assert_eq!(identity.kernel, Kernel::Run { len: 24 });
        assert!(identity.outer.is_empty());
    }
}
