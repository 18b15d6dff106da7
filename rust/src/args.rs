//! Checked conversion of the arguments the core's methods take.
//!
//! Mirrors `python/rlmesh/_pycore/args.py`: the same accepted types and dtype kinds, the same
//! messages. Arrays of the exact dtype are borrowed without a copy; anything else goes through
//! `numpy.asarray` once, with its kind checked first.

use numpy::npyffi;
use numpy::{
    Element, PyArray1, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray1, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyType;

/// A caller's mistake: becomes a Python `ValueError` with this message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgError(pub String);

impl From<ArgError> for PyErr {
    fn from(err: ArgError) -> PyErr {
        PyValueError::new_err(err.0)
    }
}

/// `type(value).__name__`, as messages name what came back.
pub fn type_name(value: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(value.get_type().name()?.to_string())
}

/// `operator.index(value)`, or a `ValueError` "`{name}` must be an integer{range}, got {type}".
fn python_int<'py>(
    value: &Bound<'py, PyAny>,
    name: &str,
    range: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let index = value.py().import("operator")?.getattr("index")?;
    index.call1((value,)).map_err(|_| match type_name(value) {
        Ok(kind) => PyValueError::new_err(format!("{name} must be an integer{range}, got {kind}")),
        Err(err) => err,
    })
}

/// `value` as an int in `[0, 2**64)`, or a `ValueError` naming `name`.
pub fn u64_arg(value: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    if let Ok(number) = value.extract::<u64>() {
        return Ok(number);
    }
    let number = python_int(value, name, " in [0, 2**64)")?;
    number.extract::<u64>().map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be an integer in [0, 2**64), got {number}"
        ))
    })
}

/// `value` as an int in `[-2**63, 2**63)` (a clock reading), or a `ValueError`.
pub fn i64_arg(value: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    if let Ok(number) = value.extract::<i64>() {
        return Ok(number); // an int (or an object with `__index__`) in range
    }
    let number = python_int(value, name, " in [-2**63, 2**63)")?;
    number.extract::<i64>().map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be an integer in [-2**63, 2**63), got {number}"
        ))
    })
}

/// `value` as a positive int (a count of lanes or episodes), or a `ValueError`.
pub fn count_arg(value: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    let number = python_int(value, name, "")?;
    if number.le(0)? {
        return Err(PyValueError::new_err(format!(
            "{name} must be at least 1, got {number}"
        )));
    }
    u64_arg(&number, name)
}

/// The dtypes per-lane arguments take, with the numpy kinds each accepts.
#[derive(Clone, Copy)]
pub enum Dtype {
    Int64,
    Float64,
    Bool,
}

impl Dtype {
    pub(crate) fn numpy_name(self) -> &'static str {
        match self {
            Dtype::Int64 => "int64",
            Dtype::Float64 => "float64",
            Dtype::Bool => "bool",
        }
    }

    /// numpy dtype kinds accepted ("b" bool, "i" signed, "u" unsigned, "f" float). Anything
    /// else is refused rather than silently reinterpreted.
    fn kinds(self) -> &'static str {
        match self {
            Dtype::Int64 => "iu",
            Dtype::Float64 => "iuf",
            Dtype::Bool => "biu",
        }
    }

    fn kind_name(self) -> &'static str {
        match self {
            Dtype::Int64 => "integers",
            Dtype::Float64 => "numbers",
            Dtype::Bool => "booleans",
        }
    }
}

/// `values` as a contiguous 1-D array of `T` (whose numpy dtype is `dtype`).
///
/// Errors: a `ValueError` naming `name` when `values` is not 1-D or holds the wrong kind.
pub fn vector<'py, T: Element>(
    values: &Bound<'py, PyAny>,
    dtype: Dtype,
    name: &str,
) -> PyResult<PyReadonlyArray1<'py, T>> {
    if let Ok(array) = values.cast::<PyArray1<T>>() {
        if array.is_contiguous() {
            return Ok(array.readonly());
        }
    }
    let numpy = values.py().import("numpy")?;
    let array = numpy.getattr("asarray")?.call1((values,))?;
    let ndim: usize = array.getattr("ndim")?.extract()?;
    if ndim != 1 {
        let shape = array.getattr("shape")?;
        return Err(PyValueError::new_err(format!(
            "{name} must be a 1-D array, got shape {shape}"
        )));
    }
    let size: usize = array.getattr("size")?.extract()?;
    let kind: String = array.getattr("dtype")?.getattr("kind")?.extract()?;
    if size > 0 && !dtype.kinds().contains(kind.as_str()) {
        let found = array.getattr("dtype")?;
        return Err(PyValueError::new_err(format!(
            "{name} must hold {}, got dtype {found}",
            dtype.kind_name()
        )));
    }
    if matches!(dtype, Dtype::Int64) && size > 0 && kind == "u" {
        let largest = array.call_method0("max")?;
        if largest.gt(i64::MAX)? {
            return Err(PyValueError::new_err(format!(
                "{name} holds {largest}, which does not fit in int64"
            )));
        }
    }
    let converted = numpy
        .getattr("ascontiguousarray")?
        .call1((array, dtype.numpy_name()))?;
    Ok(converted.cast_into::<PyArray1<T>>()?.readonly())
}

/// Refuse a per-lane argument whose length is not the number of lanes given.
pub fn same_length(name: &str, length: usize, lanes: usize) -> Result<(), ArgError> {
    if length != lanes {
        return Err(ArgError(format!(
            "{name} has {length} entries but lanes has {lanes}"
        )));
    }
    Ok(())
}

/// Marks which lanes a call has named, without clearing or allocating per call: a lane is
/// marked when its stamp equals the current call's generation.
#[derive(Debug, Clone)]
pub struct LaneMarks {
    stamps: Vec<u64>,
    generation: u64,
}

impl LaneMarks {
    pub fn new(num_lanes: usize) -> Self {
        LaneMarks {
            stamps: vec![0; num_lanes],
            generation: 0,
        }
    }

    /// Refuse a lane out of `0..num_lanes-1` or a lane given twice.
    pub fn check_lanes(&mut self, lanes: &[i64]) -> Result<(), ArgError> {
        self.generation += 1;
        let num_lanes = self.stamps.len();
        for &lane in lanes {
            if lane < 0 || lane as u64 >= num_lanes as u64 {
                return Err(ArgError(format!(
                    "lane {lane} is out of range: this route has lanes 0..{}",
                    num_lanes - 1
                )));
            }
            let stamp = &mut self.stamps[lane as usize];
            if *stamp == self.generation {
                return Err(ArgError(format!("lane {lane} appears twice in lanes")));
            }
            *stamp = self.generation;
        }
        Ok(())
    }
}

/// The `UserWarning` type, for warnings both cores raise alike.
pub fn user_warning(py: Python<'_>) -> Bound<'_, PyType> {
    py.get_type::<pyo3::exceptions::PyUserWarning>()
}

/// `lanes` (``[K]``) as a contiguous int64 vector, refusing other kinds.
pub fn lanes_arg<'py>(lanes: &Bound<'py, PyAny>) -> PyResult<PyReadonlyArray1<'py, i64>> {
    vector::<i64>(lanes, Dtype::Int64, "lanes")
}

/// A shape as Python prints a tuple: `()`, `(7,)`, `(8, 7)`.
pub fn shape_text(shape: &[usize]) -> String {
    match shape {
        [] => "()".to_owned(),
        [size] => format!("({size},)"),
        _ => {
            let sizes: Vec<String> = shape.iter().map(usize::to_string).collect();
            format!("({})", sizes.join(", "))
        }
    }
}

/// Where a C-contiguous array's bytes start, and how many there are.
fn data_bytes(array: &Bound<'_, PyUntypedArray>) -> (*mut u8, usize) {
    let bytes = array.len() * array.dtype().itemsize();
    // SAFETY: a live array's fields are readable while we hold the GIL.
    let data = unsafe { (*npyffi::_PyArray_GET_ITEM_DATA(array.as_array_ptr())).data };
    (data.cast::<u8>(), bytes)
}

/// The bytes of a C-contiguous array, to read.
///
/// # Safety
/// The caller keeps `array` alive and C-contiguous while the slice lives, and nothing
/// writes to it meanwhile (we hold the GIL and run no Python code while the slice is in use).
pub unsafe fn array_bytes<'a>(array: &'a Bound<'_, PyUntypedArray>) -> &'a [u8] {
    match data_bytes(array) {
        (_, 0) => &[],
        (data, bytes) => unsafe { std::slice::from_raw_parts(data, bytes) },
    }
}

/// The bytes of a C-contiguous array, to write.
///
/// # Safety
/// As `array_bytes`, and nothing else reads or writes the array while the slice lives
/// (a new array no one else has seen yet).
pub unsafe fn array_bytes_mut<'a>(array: &'a mut Bound<'_, PyUntypedArray>) -> &'a mut [u8] {
    match data_bytes(array) {
        (_, 0) => &mut [],
        (data, bytes) => unsafe { std::slice::from_raw_parts_mut(data, bytes) },
    }
}

/// Where a key path leads, as messages show it: `action`, `obs["a"]["b"]` (keys as
/// `json.dumps` writes them, as `rlmesh.adapters` does).
pub fn path_text(py: Python<'_>, root: &str, path: &[String]) -> PyResult<String> {
    let dumps = py.import("json")?.getattr("dumps")?;
    let mut text = String::from(root);
    for key in path {
        text.push('[');
        text.push_str(&dumps.call1((key,))?.extract::<String>()?);
        text.push(']');
    }
    Ok(text)
}
